"""Infrastructure fault: the Kafka broker stops for 10 s (or 60 s, `slow`) mid-stream and starts
again.

The test runs its own broker (deploy/kafka/kafka.sh on a free port, so the shared one that other
tests use is never disturbed), a real `fleetpulse worker` and a real `fleetpulse sink lake`. Half
the recording goes in, the broker is stopped while the worker is busy with it, and started again
10 s (60 s) later; the other half goes in. Neither process may exit; the worker's actions must be the
embedded runtime's for the same input, and the lake must hold every record of the output topics
exactly once (by id for findings and actions, by count for the other tables).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.lake.tables import TABLES
from pipeline.lake.writer import visible_files
from pipeline.model import Action, Finding
from pipeline.wire.topics import topic_name
from streams.testing import (
    TopicReader,
    WorkerProcess,
    announced_port,
    create_topics,
    embedded_outputs,
    produce_events,
    scenario,
    worker_env,
)
from tests.faults import reliability
from tests.faults.infra import free_port_pair

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "kafka" / "kafka.sh"
# the 60 s outage, with the broker's stop and start, takes minutes on a loaded 2-core machine
OUTAGES = [10, pytest.param(60, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="60")]
IDS = {"findings": ("finding_id", Finding), "actions": ("action_id", Action)}


def _broker(port: int, command: str) -> None:
    # a loaded 2-core machine can take more than the script's default 90 s to start a broker
    env = {"KAFKA_START_TIMEOUT": "240", **os.environ, "KAFKA_PORT": str(port)}
    done = subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, f"kafka.sh {command}: {done.stdout}{done.stderr}"


@pytest.fixture
def own_broker() -> Iterator[str]:
    """A broker of this test's own, wiped afterwards."""
    port = free_port_pair()
    _broker(port, "start")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _broker(port, "reset")  # stop, and remove its data dir
        for leftover in (ROOT / ".cache" / "kafka").glob(f"*-{port}.*"):
            leftover.unlink()  # its logs and properties: a new port each run


def _sink(env: dict[str, str], lake: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**env, "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}",
           "FLEETPULSE_LAKE__SESSION_TIMEOUT_S": "6",
           # it holds records when the broker goes: its commit meets the outage
           "FLEETPULSE_LAKE__FLUSH_SECONDS": "4"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )



def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _lake_ids(lake: Path, table: str, column: str) -> Counter[str]:
    seen: Counter[str] = Counter()
    for path in visible_files(lake, table):
        seen.update(pq.read_table(path, columns=[column], partitioning=None).column(0).to_pylist())
    return seen


def _lake_rows(lake: Path, table: str) -> int:
    return sum(pq.read_metadata(path).num_rows for path in visible_files(lake, table))


@pytest.mark.parametrize("outage", OUTAGES)
def test_broker_stopped_and_started_mid_stream_loses_nothing(
    own_broker: str, tmp_path: Path, outage: int
) -> None:
    kafka = KafkaSettings(bootstrap=own_broker, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=3)
    settings: Settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    events = list(scenario().events())
    expected = embedded_outputs(settings, events)
    want = {a.action_id for a in expected.get("actions", []) if isinstance(a, Action)}
    assert want
    half = len(events) // 2

    env = worker_env(settings, tmp_path / "worker")
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    lake, sink_log = tmp_path / "lake", tmp_path / "sink.log"
    sink = _sink(env, lake, sink_log)
    outputs = [topic_name(kafka, spec.topic_suffix) for spec in TABLES.values()]
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=60)
        worker_port, sink_port = worker.metrics_port(), announced_port(sink_log, sink)
        produce_events(settings, events[:half])
        time.sleep(2)  # the worker is busy with the first half

        stopped = time.monotonic()
        _broker(int(own_broker.rsplit(":", 1)[1]), "stop")
        seen_unready = {"worker": False, "sink": False}
        while time.monotonic() - stopped < outage:
            seen_unready["worker"] |= not _ready(worker_port)
            seen_unready["sink"] |= not _ready(sink_port)
            assert worker.proc is not None and worker.proc.poll() is None, worker.tail()
            assert sink.poll() is None, sink_log.read_text()[-3000:]
            time.sleep(0.5)
        _broker(int(own_broker.rsplit(":", 1)[1]), "start")
        restarted = time.monotonic()
        outage_s = restarted - stopped

        produce_events(settings, events[half:])
        reader = TopicReader(own_broker, outputs)
        try:
            reader.until(
                lambda: want <= {a.action_id for a in reader.values(
                    topic_name(kafka, "actions"), Action)},
                60, "the embedded runtime's actions")
            recovered_s = time.monotonic() - restarted
            assert worker.proc is not None and worker.proc.poll() is None, worker.tail()
            worker_code = worker.stop()  # its last outputs are on the topics once it stopped
            assert worker_code == 0, worker.tail()
            time.sleep(1)
            reader.poll()
            reader.poll()
            topic_ids = {
                table: Counter(getattr(v, column) for v in reader.values(
                    topic_name(kafka, TABLES[table].topic_suffix), cls))
                for table, (column, cls) in IDS.items()
            }
            topic_rows = {
                table: len(reader.values(topic_name(kafka, spec.topic_suffix), spec.event))
                for table, spec in TABLES.items()
            }
        finally:
            reader.close()
        # the lake catches up with every output record
        deadline = time.monotonic() + 30
        while any(_lake_rows(lake, t) < n for t, n in topic_rows.items()):
            assert time.monotonic() < deadline, (
                {t: (_lake_rows(lake, t), n) for t, n in topic_rows.items()},
                sink_log.read_text()[-3000:])
            assert sink.poll() is None, sink_log.read_text()[-3000:]
            time.sleep(0.5)
        assert sink.poll() is None, sink_log.read_text()[-3000:]
    finally:
        worker.stop()
        sink.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            sink.wait(timeout=30)
        if sink.poll() is None:
            sink.kill()
    assert sink.returncode == 0, sink_log.read_text()[-3000:]

    got = {a for a in topic_ids["actions"]}
    lake_ids = {table: _lake_ids(lake, table, column) for table, (column, _) in IDS.items()}
    lake_rows = {table: _lake_rows(lake, table) for table in TABLES}
    lost = sum(len(set(topic_ids[t]) - set(lake_ids[t])) for t in IDS)
    # rows the lake holds beyond the records on the topic (the sink's own duplicates)
    duplicates = sum((lake_ids[t] - topic_ids[t]).total() for t in IDS)
    repeats = sum(c - 1 for t in IDS for c in topic_ids[t].values())  # same-id repeats on topics
    reliability.record("infrastructure", f"broker stopped {outage} s mid-stream", {
        "in": len(events), "actions": len(got), "actions same as embedded":
            "yes" if got == want else "no",
        "out": sum(lake_rows.values()), "lost": lost, "duplicates": duplicates,
        "same-id repeats": repeats, "outage_s": round(outage_s, 1),
        "recovery_s": round(recovered_s, 2),
        "not ready while away": "+".join(k for k, v in seen_unready.items() if v) or "none",
    })
    assert seen_unready == {"worker": True, "sink": True}
    assert got == want
    assert lost == 0
    assert lake_ids == topic_ids  # each output record once in the lake, repeats included
    assert lake_rows == topic_rows
