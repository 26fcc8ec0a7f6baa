"""`fleetpulse simulate` as a user runs it: files, determinism, help, errors, and Kafka."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from pipeline.model import TOPIC_VALUES
from pipeline.sim import read_truth
from pipeline.wire import codec
from pipeline.wire.batches import is_batch, partition_of, unpack

SMALL = ["--duration", "300", "--gpu-nodes", "4", "--tpu-slices", "1", "--intensity", "3000",
         "--seed", "5", "--quiet"]


def _simulate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "simulate", *args],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def _decode_any(line: bytes) -> object:
    schema = json.loads(line)["schema"].split("/")[0]
    return codec.decode(line, TOPIC_VALUES[schema])


def test_jsonl_run_writes_events_truth_and_fleet(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = _simulate("--to", "jsonl", "--out", str(out), "--inject", "G1@30", *SMALL)
    assert run.returncode == 0, run.stderr
    assert "events over 300 simulated s" in run.stdout and "G1" in run.stdout
    lines = (out / "events.jsonl").read_bytes().splitlines()
    events = [_decode_any(line) for line in lines]
    kinds = Counter(type(e).__name__ for e in events)
    assert {"GpuSample", "TpuSample", "IciSample", "XidEvent", "CapacityEvent"} <= set(kinds)
    stamps = [e.ts for e in events]  # type: ignore[attr-defined]
    assert stamps == sorted(stamps)
    truth = read_truth(out / "events.truth.jsonl")
    forced = [f for f in truth if f.forced]
    assert [f.fault_type for f in forced] == ["G1"] and forced[0].onset_ms == stamps[0] + 30_000
    fleet = json.loads((out / "fleet.json").read_text())
    assert len(fleet["gpu_nodes"]) == 4 and len(fleet["tpu_slices"]) == 1
    assert fleet["settings"]["intensity"] == 3000


def test_same_command_same_bytes(tmp_path: Path) -> None:
    for name in ("a", "b"):
        run = _simulate("--out", str(tmp_path / name), *SMALL)
        assert run.returncode == 0, run.stderr
    for file in ("events.jsonl", "events.truth.jsonl"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_stdout_carries_only_events() -> None:
    run = _simulate("--to", "stdout", "--duration", "20", "--gpu-nodes", "2", "--tpu-slices", "0")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.encode().splitlines()
    assert lines and all(_decode_any(line) for line in lines)
    assert "events over 20 simulated s" in run.stderr


def test_now_and_realtime_send_each_tick_when_its_time_has_come() -> None:
    """`--start-ms now --realtime`: event times begin at the wall clock, and the last tick of a
    10 s run (five 2 s ticks) is not sent before its time, so actions are not born expired."""
    before = time.time() * 1000
    run = _simulate("--to", "stdout", "--duration", "10", "--gpu-nodes", "1", "--tpu-slices",
                    "0", "--start-ms", "now", "--realtime",
                    env={"FLEETPULSE_SIM__GPU_INTERVAL_S": "2"})  # fmt: skip
    took = time.time() * 1000 - before
    assert run.returncode == 0, run.stderr
    stamps = [int(json.loads(line)["ts"]) for line in run.stdout.splitlines() if '"ts"' in line]
    assert stamps and before - 1_000 <= min(stamps) <= before + 2_000
    ticks = sorted({ts - ts % 2_000 for ts in stamps})
    assert len(ticks) >= 5 and took >= 4 * 2_000 - 100, (ticks, took)


def test_start_ms_says_what_it_expected() -> None:
    run = _simulate("--to", "stdout", "--start-ms", "yesterday")
    assert run.returncode == 2 and "milliseconds since the epoch or `now`" in run.stderr
    paced = _simulate("--out", "x", "--realtime")
    assert paced.returncode == 2 and "--realtime paces --to kafka" in paced.stderr


def test_help_lists_outputs_and_fault_specs() -> None:
    run = _simulate("--help")
    text = run.stdout.replace("\n", " ")
    for words in ("--to", "kafka", "--inject", "TYPE[/VARIANT]@SECONDS", "--intensity", "ground truth"):
        assert words in text, words
    listing = _simulate("--list-faults")
    assert listing.returncode == 0 and "G5/hbm" in listing.stdout and "T2/ici" in listing.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--to", "jsonl"], "--out"),
        (["--out", "x", "--inject", "G99@1"], "unknown fault type"),
        (["--out", "x", "--inject", "G1@5:no-such-node"], "no GPU node named"),
        (["--out", "x", "--duration", "0"], "duration_s"),
        (["--out", "x", "--only", "G1,Z9"], "unknown fault types"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], words: str, tmp_path: Path) -> None:
    run = _simulate(*[a.replace("x", str(tmp_path / "x")) if a == "x" else a for a in args])
    assert run.returncode == 2 and words in run.stderr, run.stderr


def _kafka_bootstrap() -> str:
    bootstrap = os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(f"Kafka is not reachable at {bootstrap} ({exc}); run the tests with `make test`")
    return bootstrap


def _simulated_to_kafka(
    tmp_path: Path, gpu_nodes: int, partitions: int, **extra: str
) -> tuple[str, str, Counter[str]]:
    """`simulate --to kafka` into fresh topics: (bootstrap, topic prefix, the number of events
    of each schema, from the same run written to JSON lines)."""
    bootstrap = _kafka_bootstrap()
    env = {"FLEETPULSE_KAFKA__BOOTSTRAP": bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}",
           "FLEETPULSE_KAFKA__PARTITIONS": str(partitions), **extra}
    created = subprocess.run([sys.executable, "-m", "pipeline.cli", "topics", "create"],
                             capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})
    assert created.returncode == 0, created.stderr
    args = ["--duration", "60", "--gpu-nodes", str(gpu_nodes), "--tpu-slices", "1", "--seed", "3",
            "--quiet"]
    run = _simulate("--to", "kafka", "--out", str(tmp_path / "k"), *args, env=env)
    assert run.returncode == 0, run.stderr
    reference = _simulate("--to", "jsonl", "--out", str(tmp_path / "j"), *args)
    assert reference.returncode == 0, reference.stderr
    expected: Counter[str] = Counter()
    for line in (tmp_path / "j" / "events.jsonl").read_bytes().splitlines():
        expected[json.loads(line)["schema"].split("/")[0]] += 1
    return bootstrap, env["FLEETPULSE_KAFKA__TOPIC_PREFIX"], expected


@pytest.mark.kafka
def test_kafka_run_lands_every_event_on_its_topic_with_its_key(tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    # a record per sample, as other producers write them (the worker reads both)
    bootstrap, prefix, expected = _simulated_to_kafka(
        tmp_path, gpu_nodes=2, partitions=2, FLEETPULSE_KAFKA__TELEMETRY_BATCH="false"
    )
    suffix = {"gpu_sample": "telemetry.gpu", "tpu_sample": "telemetry.tpu", "ici_sample": "telemetry.ici",
              "xid_event": "events.xid", "node_event": "events.node", "capacity_event": "events.capacity",
              "fabric_sample": "telemetry.fabric", "inventory": "inventory"}
    key_field = {"gpu_sample": "node", "tpu_sample": "slice", "ici_sample": "slice", "xid_event": "node",
                 "node_event": "target", "capacity_event": "zone", "fabric_sample": "node",
                 "inventory": "name"}
    consumer = KafkaConsumer(*(f"{prefix}.{s}" for s in suffix.values()), bootstrap_servers=bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    received: Counter[str] = Counter()
    for record in consumer:
        content_type = codec.content_type_of(record.headers)
        # samples in the fast wire format by default, events as JSON (streams/README.md)
        packed = content_type == codec.MSGPACK
        value = msgspec.msgpack.decode(record.value) if packed else json.loads(record.value)
        name = value["schema"].split("/")[0]
        assert record.topic == f"{prefix}.{suffix[name]}"
        assert packed == name.endswith("_sample"), (name, content_type)
        # Keys carry the cluster wherever a node or slice name is the key (a zone key does not).
        expected_key = value[key_field[name]] if name == "capacity_event" else \
            f"{value['cluster']}/{value[key_field[name]]}"
        assert record.key.decode() == expected_key
        received[name] += 1
    consumer.close()
    assert sum(received.values()) > 20
    assert received == expected
    assert (tmp_path / "k" / "events.truth.jsonl").exists()


@pytest.mark.kafka
def test_kafka_run_with_telemetry_batches_puts_each_sample_in_its_key_s_partition(
    tmp_path: Path,
) -> None:
    from kafka import KafkaConsumer

    bootstrap, prefix, expected = _simulated_to_kafka(tmp_path, gpu_nodes=6, partitions=3)  # the default
    suffixes = ("telemetry.gpu", "telemetry.tpu", "telemetry.ici", "telemetry.fabric", "events.xid",
                "events.node", "events.capacity", "inventory")
    consumer = KafkaConsumer(*(f"{prefix}.{s}" for s in suffixes), bootstrap_servers=bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    received: Counter[str] = Counter()
    batch_records = 0
    for record in consumer:
        if not is_batch(record):
            received[json.loads(record.value)["schema"].split("/")[0]] += 1
            continue
        batch_records += 1
        for content_type, raw in unpack(record.value):
            value = msgspec.msgpack.decode(raw) if content_type == codec.MSGPACK else json.loads(raw)
            key = f"{value['cluster']}/{value['slice'] if 'slice' in value else value['node']}"
            assert partition_of(key, 3) == record.partition, (key, record.partition)
            received[value["schema"].split("/")[0]] += 1
    consumer.close()
    assert received == expected
    samples = sum(n for name, n in expected.items() if name.endswith("_sample"))
    assert 0 < batch_records < samples / 2
