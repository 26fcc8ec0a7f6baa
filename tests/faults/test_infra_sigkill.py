"""Infrastructure fault: SIGKILL of each long-running process at a random point, then a restart.

The point is drawn from a seed (FAULTS_SEED, or a fresh one) and both are reported with the
figures, so a failing run can be repeated. Records keep arriving around the kill. Afterwards
nothing is lost, and what came twice carries the same id:

- worker: its actions and last node states equal the embedded runtime's for the same input
  (the detectors' rolling statistics and the health machine's states came back from the
  changelogs, or the decisions would differ);
- lake sink: the lake holds every output record once, by id;
- alerts: every alert on fleet.alerts reaches the webhook (repeats: the same alert again);
- xid ingest adapter: every kernel-log Xid reaches fleet.events.xid;
- simulate --to kafka: run again after the kill, every event of the run is on its topic.

The other ingest adapters (prometheus, cloudmon, tpu-runtime, capacity), against the
simulator's stand-ins of their endpoints: test_infra_sigkill_ingest.py.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import Action, Finding, NodeState, XidEvent
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import TOPICS, topic_name
from streams.testing import (
    TopicReader,
    WorkerProcess,
    embedded_outputs,
    produce_events,
    producer,
    scenario,
    worker_env,
)
from streams.testing import create_topics as create_worker_topics
from tests.faults import reliability
from tests.faults.infra import (
    XID_NODE,
    Proc,
    Receiver,
    base_env,
    lake_values,
    receiver,
    seeded_point,
    wait_until,
    write_xids,
)
from tests.lake_fixture import ALERTS, FINDINGS

pytestmark = pytest.mark.kafka
__all__ = ["receiver"]
TRICKLE_S = 6.0  # records arrive over this long; the kill falls inside


def _record(process: str, seed: int, point: float, figures: dict[str, int | float | str]) -> None:
    reliability.record("infrastructure", f"SIGKILL of {process}, restarted",
                       {**figures, "seed": seed, "killed at s": point})


def _trickle(send: object, items: list[object], seconds: float = TRICKLE_S) -> threading.Thread:
    """Send `items` evenly over `seconds` from a thread."""
    def run() -> None:
        pause = seconds / max(1, len(items))
        for item in items:
            send(item)  # type: ignore[operator]
            time.sleep(pause)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _kill_and_restart(proc: Proc, point: float) -> float:
    """SIGKILL `proc` `point` s from now, start it again; seconds until it is ready again."""
    time.sleep(point)
    assert proc.alive(), proc.tail()
    proc.kill()
    proc.start()
    return wait_until(proc.ready, 120, f"the restarted {proc.name} is ready", proc)


def test_sigkill_of_the_lake_sink(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path,
                   FLEETPULSE_LAKE__FLUSH_SECONDS="1")
    lake = tmp_path / "lake"
    findings = [msgspec.structs.replace(FINDINGS[0], finding_id=f"kill-{n:05d}",
                                        ts=FINDINGS[0].ts + n) for n in range(1200)]
    kafka_producer = producer(kafka)
    topic = topic_name(kafka, "findings")
    batches = [findings[i : i + 50] for i in range(0, len(findings), 50)]
    seed, point = seeded_point("lake sink", 1.0, TRICKLE_S - 1)
    sink = Proc("lake sink", ["sink", "lake", "--lake", str(lake)], env, tmp_path / "s.log")
    sink.start()
    wait_until(sink.ready, 60, "the sink joined its group", sink)
    sending = _trickle(lambda batch: [kafka_producer.send(topic, key=f.finding_id.encode(),
                                                          value=encode(f)) for f in batch],
                       list(batches))
    try:
        recovered = _kill_and_restart(sink, point)
        sending.join(60)
        kafka_producer.flush(60)
        want = {f.finding_id for f in findings}
        wait_until(lambda: want <= {k[0] for k in lake_values(lake, "findings", ["finding_id"])},
                   90, "every finding in the lake", sink)
        time.sleep(2)
    finally:
        kafka_producer.close()
        code = sink.stop()
    ids = Counter(k[0] for k in lake_values(lake, "findings", ["finding_id"]).elements())
    duplicates = sum(n - 1 for n in ids.values())
    lost = len(want - set(ids))
    _record("the lake sink", seed, point, {
        "in": len(findings), "out": sum(ids.values()), "lost": lost, "duplicates": duplicates,
        "recovery_s": round(recovered, 2)})
    assert code == 0, sink.tail()
    assert lost == 0 and duplicates == 0


def test_sigkill_of_the_alerts_process(
    kafka_settings: KafkaSettings, receiver: Receiver, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path,
                   FLEETPULSE_ALERTS__WEBHOOK_URLS=f'["{receiver.url}"]')
    model = ALERTS[0]
    alerts = [msgspec.structs.replace(model, fingerprint=f"{n:016x}", ts=model.ts + n)
              for n in range(300)]
    kafka_producer = producer(kafka)
    topic = topic_name(kafka, "alerts")
    seed, point = seeded_point("alerts", 1.0, TRICKLE_S - 1)
    proc = Proc("alerts", ["alerts"], env, tmp_path / "a.log").start()
    wait_until(proc.ready, 60, "alerts joined its group", proc)
    sending = _trickle(lambda a: kafka_producer.send(topic, key=a.fingerprint.encode(),
                                                     value=encode(a)), list(alerts))
    try:
        recovered = _kill_and_restart(proc, point)
        sending.join(60)
        kafka_producer.flush(60)
        want = {(a.fingerprint, a.status) for a in alerts}
        wait_until(lambda: want <= set(receiver.keys()), 90, "every alert delivered", proc)
    finally:
        kafka_producer.close()
        code = proc.stop()
    got = receiver.keys()
    lost = len(want - set(got))
    _record("the alerts process", seed, point, {
        "in": len(alerts), "alerts delivered": len(set(got)), "lost": lost,
        "same-id repeats": sum(n - 1 for n in got.values()),
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert lost == 0
    assert set(got) <= want  # a repeat is the same alert, never a new one


def test_sigkill_of_the_xid_ingest_adapter(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path,
                   FLEETPULSE_SOURCES__POLL_INTERVAL_S="0.5")
    log = tmp_path / "kern.log"
    write_xids(log, 0, 1)
    seed, point = seeded_point("xid adapter", 1.0, TRICKLE_S - 1)
    proc = Proc("xid adapter", ["ingest", "xid", "--log", str(log)], env, tmp_path / "i.log")
    proc.start()
    wait_until(proc.ready, 60, "the adapter reached Kafka", proc)
    count = 120
    writing = _trickle(lambda n: write_xids(log, n, 1), list(range(1, count)))
    xid_topic = topic_name(kafka, "events.xid")
    reader = TopicReader(kafka.bootstrap, [xid_topic])
    try:
        recovered = _kill_and_restart(proc, point)
        writing.join(60)
        reader.until(lambda: len(_xids(reader, xid_topic)) >= count, 90, "every xid")
        time.sleep(2)
        reader.poll()
        seen = _xids(reader, xid_topic)
    finally:
        reader.close()
        code = proc.stop()
    _record("the xid ingest adapter", seed, point, {
        "in": count, "consumed": sum(seen.values()), "lost": count - len(seen),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert len(seen) == count


def _xids(reader: TopicReader, topic: str) -> Counter[tuple[object, ...]]:
    return Counter((x.ts, x.pci_bus_id, x.xid, x.pid, x.message)
                   for x in reader.values(topic, XidEvent) if x.node == XID_NODE)


# six simulated hours: about 7 s of producing here, so a kill up to 2 s after the first records
# lands while it produces (two hours took 2.3 s on a quiet machine, and a kill at 3 s missed it)
SIM = ["simulate", "--to", "kafka", "--duration", "21600", "--gpu-nodes", "8", "--tpu-slices",
       "1", "--seed", "9", "--quiet"]


def test_sigkill_of_the_simulator_as_producer(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path)
    seed, point = seeded_point("simulate", 0.0, 2.0)  # after its first records arrived
    inputs = [topic_name(kafka, s.suffix) for s in TOPICS  # the recording's inventory too
              if s.suffix.startswith(("telemetry.", "events.")) or s.suffix == "inventory"]
    proc = Proc("simulate", SIM, env, tmp_path / "sim1.log").start()
    first = TopicReader(kafka.bootstrap, inputs)
    try:
        first.until(lambda: any(first.records.values()) or not proc.alive(), 120,
                    "the simulator's first records")
    finally:
        first.close()
    time.sleep(point)
    killed_while_running = proc.alive()
    proc.kill()
    restarted = time.monotonic()
    again = Proc("simulate", SIM, env, tmp_path / "sim2.log").start()
    assert again.wait(300) == 0, again.tail()
    took = time.monotonic() - restarted
    sent = int(re.search(r"^(\d+) events over", again.text(), re.M)[1])  # type: ignore[index]
    reader = TopicReader(kafka.bootstrap, inputs)
    try:
        reader.until(lambda: len(_identities(reader, inputs)) >= sent, 90, "every event")
        reader.poll()
        seen = _identities(reader, inputs)
    finally:
        reader.close()
    _record("simulate --to kafka", seed, point, {
        "in": sent, "consumed": sum(seen.values()), "lost": sent - len(seen),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "killed while producing": "yes" if killed_while_running else "no",
        "recovery_s": round(took, 2)})
    assert killed_while_running, proc.tail()
    assert len(seen) == sent


def _identities(reader: TopicReader, topics: list[str]) -> Counter[tuple[str, bytes]]:
    """Values by (topic, bytes), a batch record's each (the simulator batches its telemetry by
    default): its events are deterministic, so a repeat is the same bytes."""
    return Counter((t, raw) for t in topics for _, raw in reader.payloads(t))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_of_the_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=3)
    settings: Settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    events = list(scenario().events())
    expected = embedded_outputs(settings, events)
    want = {a.action_id for a in expected["actions"] if isinstance(a, Action)}
    half = len(events) // 2
    env = worker_env(settings, tmp_path / "worker")
    create_worker_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    actions, node_state = topic_name(kafka, "actions"), topic_name(kafka, "node-state")
    findings = topic_name(kafka, "findings")
    seed, point = seeded_point("worker", 0.5, TRICKLE_S - 1)
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        produce_events(settings, events[:half])
        chunks = [events[i : i + 200] for i in range(half, len(events), 200)]
        sending = _trickle(lambda chunk: produce_events(settings, chunk), list(chunks))
        time.sleep(point)
        worker.kill()
        assert worker.proc is not None
        worker.proc.wait(30)
        killed = time.monotonic()
        mark = len(worker.output())
        worker.start()
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120, start=mark)
        recovered = time.monotonic() - killed
        sending.join(120)
        reader = TopicReader(kafka_bootstrap, [actions, node_state, findings])
        try:
            reader.until(lambda: want <= {a.action_id for a in reader.values(actions, Action)},
                         180, "the embedded runtime's actions")
            embedded = _last_by_target(
                [s for s in expected["node-state"] if isinstance(s, NodeState)])
            with_timeout = time.monotonic() + 60
            while _last_by_target(reader.values(node_state, NodeState)) != embedded:
                if time.monotonic() > with_timeout:
                    break
                reader.poll()
            seen = reader.values(actions, Action)
            states = _last_by_target(reader.values(node_state, NodeState))
            found = reader.values(findings, Finding)
        finally:
            reader.close()
    finally:
        code = worker.stop()
    got = Counter(a.action_id for a in seen)
    _record("the worker", seed, point, {
        "in": len(events), "findings": len({f.finding_id for f in found}),
        "actions": len(got), "lost": len(want - set(got)),
        "same-id repeats": sum(n - 1 for n in got.values()),
        "actions same as embedded": "yes" if set(got) == want else "no",
        "node states same as embedded": "yes" if states == embedded else "no",
        "recovery_s": round(recovered, 2)})
    assert code == 0, worker.tail()
    assert set(got) == want
    assert states == embedded


def _last_by_target(states: list[NodeState]) -> dict[str, NodeState]:
    ordered = sorted(states, key=lambda s: s.ts)
    return {s.target.name: msgspec.structs.replace(s, ts=0, since=0) for s in ordered}
