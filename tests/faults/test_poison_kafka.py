"""No record stops a consumer, on the real broker.

A poison record of every kind — nested 1,000 deep, a tombstone, a value over
kafka.max_value_bytes, invalid UTF-8, a value of another schema, garbage bytes — goes into every
topic the worker, the lake sink and the alerts process read, between valid records. Each runs
as the real process; it must keep running, every poison record must reach fleet.dlq with its
reason (tombstones on a compacted topic are skipped and counted instead), and every valid record
must come out: the worker decides what the embedded runtime decides on the valid records alone
(same action and finding ids), the lake holds every row, the webhook gets every alert.

The broker itself refuses a 10 MB value (message.max.bytes, 1 MiB), so a too-large value is
tested against a low kafka.max_value_bytes instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError

from pipeline.config import KafkaSettings, load_settings
from pipeline.errors import DecodeError
from pipeline.lake.query import Lake
from pipeline.lake.tables import TABLES
from pipeline.model import TOPIC_VALUES, Action, DeadLetter, Event, Finding
from pipeline.schemas_tool import SCHEMA_DIR, file_name
from pipeline.wire.admin import create_topics as create_kafka_topics
from pipeline.wire.batches import BATCH_HEADER
from pipeline.wire.codec import decode, encode
from pipeline.wire.internal import CAPACITY_INPUT
from pipeline.wire.topics import TOPICS, record_key, topic_name
from streams.app import app_id
from streams.context import INTERNAL_TOPICS
from streams.testing import (
    INPUT_SUFFIX,
    TopicReader,
    WorkerProcess,
    create_topics,
    embedded_outputs,
    metric_sum,
    producer,
    scenario,
    side_by_side,
    worker_env,
)
from tests import lake_fixture as fx
from tests.faults import reliability
from tests.integration.test_alertmanager_sink import Receiver, _alert
from tests.integration.test_lake_sink import _assert_offsets_committed_to_the_end, _key

pytestmark = pytest.mark.kafka

LIMIT = 64 * 1024  # kafka.max_value_bytes in these tests: well above any valid value here
KINDS = ("too_deep", "tombstone", "too_large", "invalid_utf8", "wrong_schema", "garbage",
         "bad_batch")
REASON = {
    "too_deep": "too_deep",
    "tombstone": "tombstone",
    "too_large": "too_large",
    "invalid_utf8": "invalid",
    "wrong_schema": "invalid",
    "garbage": "invalid",
    "bad_batch": "invalid",
}
_VALUE_OF = {spec.suffix: spec.value for spec in TOPICS}
Coordinates = tuple[str, int, int]
E = TypeVar("E", bound=Event)


def _sample(cls: type[Event]) -> bytes:
    return (SCHEMA_DIR / "samples" / file_name(cls)).read_bytes().strip()


def _tag(cls: type[Event]) -> str:
    return str(cls.__struct_config__.tag)


def poison(kind: str, cls: type[Event] | None) -> bytes | None:
    """The poison value of `kind` for a topic of `cls` values (None: one that takes any)."""
    own = cls or TOPIC_VALUES["node_state"]
    tag = _tag(own).encode()
    if kind == "too_deep":  # the record: 2 kB, nested 1,000 deep
        return b'{"schema": "' + tag + b'", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    if kind == "tombstone":
        return None
    if kind == "too_large":  # a valid value, padded: refused for its size alone
        return _sample(own)[:-1] + b', "pad": "' + b"x" * (LIMIT + 1024) + b'"}'
    if kind == "invalid_utf8":
        return b'{"schema": "' + tag + b'", "node": "\xff\xfe\xc3\x28"}'
    if kind == "wrong_schema":  # a valid value of another topic, or an unknown version
        if cls is None:
            return b'{"schema": "node_state/99", "ts": 1764424805000}'
        other = TOPIC_VALUES["alert"] if cls is not TOPIC_VALUES["alert"] else Finding
        return _sample(other)
    if kind == "bad_batch":  # marked as a batch record (batches.py), but not pairs inside
        return msgspec.msgpack.encode([["application/json"], 7])
    assert kind == "garbage"
    return b"\x00\x9c\xfe\x07GET / HTTP/1.1\r\n\x1f\x8b"


def _headers(kind: str) -> list[tuple[str, bytes]] | None:
    """A poison's record headers: the batch mark on the bad batch, none on the others."""
    return [(BATCH_HEADER, b"1")] if kind == "bad_batch" else None


def _send_poisons(
    kafka: KafkaProducer, topics: dict[str, type[Event] | None], kind: str, keys: dict[str, bytes]
) -> dict[Coordinates, str]:
    """One `kind` poison into each topic (full name -> value type); their coordinates."""
    futures = {
        topic: kafka.send(topic, key=keys.get(topic, b"poison"), value=poison(kind, cls),
                          headers=_headers(kind))
        for topic, cls in topics.items()
    }
    sent = {}
    for topic, future in futures.items():
        meta = future.get(timeout=60)
        sent[(topic, meta.partition, meta.offset)] = kind
    return sent


def _outputs(reader: TopicReader, topic: str, cls: type[E], poisoned: set[Coordinates]) -> list[E]:
    """What the worker wrote to `topic`, which is an input too: our own poison left out (a
    too-large one is a valid value, padded)."""
    values = []
    for record in reader.records[topic]:
        if (record.topic, record.partition, record.offset) not in poisoned:
            with contextlib.suppress(DecodeError):
                values.append(decode(record.value, cls))
    return values


def _letters(reader: TopicReader, topic: str) -> dict[Coordinates, DeadLetter]:
    return {(d.topic, d.partition, d.offset): d for d in reader.values(topic, DeadLetter)}


def _check_letters(
    letters: dict[Coordinates, DeadLetter], sent: dict[Coordinates, str], skipped: set[Coordinates]
) -> None:
    """Every poison not in `skipped` has its letter, with its reason and its bytes."""
    for at, kind in sent.items():
        if at in skipped:
            assert at not in letters, f"a skipped tombstone was dead-lettered: {at}"
            continue
        letter = letters.get(at)
        assert letter is not None, f"no dead letter for the {kind} poison at {at}"
        assert letter.reason == REASON[kind], (kind, letter.reason, letter.error)
        assert letter.error, letter


# --- the worker ---------------------------------------------------------------------------


def test_the_worker_dead_letters_every_poison_and_decides_as_without_them(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        partitions=3,
        max_value_bytes=LIMIT,
    )
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    events = list(scenario().events())
    assert max(len(encode(e)) for e in events) < LIMIT
    expected = embedded_outputs(settings, events)  # the valid records alone
    want_actions = {a.action_id for a in expected["actions"] if isinstance(a, Action)}
    want_findings = {f.finding_id for f in expected["findings"] if isinstance(f, Finding)}

    env = worker_env(settings, tmp_path, FLEETPULSE_KAFKA__MAX_VALUE_BYTES=str(LIMIT))
    create_topics(env)
    inputs = {s: _VALUE_OF[s] for s in (*INPUT_SUFFIX.values(), "inventory", "findings", "actions")}
    external: dict[str, type[Event] | None] = {topic_name(kafka, s): v for s, v in inputs.items()}
    internal: dict[str, type[Event] | None] = {
        f"{app_id(settings)}-{name}": None for name in INTERNAL_TOPICS
    }
    keys = {topic_name(kafka, INPUT_SUFFIX[type(e)]): record_key(e).encode() for e in events}
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    outputs = [topic_name(kafka, s) for s in ("actions", "findings", "dlq")]
    reader = TopicReader(kafka_bootstrap, outputs)
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        started = time.monotonic()
        port = worker.metrics_port()
        sent: dict[Coordinates, str] = {}
        kafka_producer = producer(kafka_bootstrap)
        step = len(events) // len(KINDS) + 1
        futures = []
        for i, kind in enumerate(KINDS):  # a poison of each kind in every topic, between valid
            sent |= _send_poisons(kafka_producer, external | internal, kind, keys)
            for event in events[i * step : (i + 1) * step]:
                topic = topic_name(kafka, INPUT_SUFFIX[type(event)])
                key = record_key(event).encode()
                futures.append(kafka_producer.send(topic, key=key, value=encode(event)))
        kafka_producer.flush()
        valid_at = {(f.get(60).topic, f.get(60).partition, f.get(60).offset) for f in futures}
        kafka_producer.close()
        # a tombstone is a value on the inventory and on the capacity stage's input (a member
        # left): skipped and counted, not a dead letter
        takes_tombstones = {topic_name(kafka, "inventory"), f"{app_id(settings)}-{CAPACITY_INPUT}"}
        inventory_tombstone = {
            at for at, kind in sent.items() if kind == "tombstone" and at[0] in takes_tombstones
        }
        to_letter = set(sent) - inventory_tombstone
        poisoned = set(sent)

        def actions() -> list[Action]:
            return _outputs(reader, outputs[0], Action, poisoned)

        def findings() -> list[Finding]:
            return _outputs(reader, outputs[1], Finding, poisoned)

        try:
            reader.until(
                lambda: to_letter <= _letters(reader, outputs[2]).keys()
                and want_actions <= {a.action_id for a in actions()}
                and want_findings <= {f.finding_id for f in findings()},
                240,
                "a dead letter for every poison, the embedded runtime's actions and findings",
            )
        except AssertionError as exc:  # say what is missing, not only how much came
            letters_now = _letters(reader, outputs[2]).keys()
            unlettered = sorted((at, sent[at]) for at in to_letter - letters_now)
            no_action = want_actions - {a.action_id for a in actions()}
            no_finding = want_findings - {f.finding_id for f in findings()}
            missing = [
                f"{f.check} {f.entity}"
                for f in expected["findings"]
                if isinstance(f, Finding) and f.finding_id in no_finding
            ]
            raise AssertionError(
                f"{exc}; poisons without a letter: {unlettered[:20]}; "
                f"{len(no_action)} actions and {len(no_finding)} findings missing: {missing[:20]}"
            ) from None
        time.sleep(3)  # anything more would come now
        reader.poll()
        # the topics only we write to (findings and actions are the worker's outputs too)
        ours = {topic_name(kafka, s) for s in (*INPUT_SUFFIX.values(), "inventory")}
        pattern = "|".join(re.escape(f'topic="{t}"') for t in ours)
        consumed = metric_sum(port, "fleetpulse_worker_records_in_total", pattern)
        tombstones = metric_sum(port, "fleetpulse_worker_tombstones_total", "inventory")
        capacity_tombstones = metric_sum(port, "fleetpulse_worker_tombstones_total", CAPACITY_INPUT)
        errors = metric_sum(port, "fleetpulse_worker_errors_total", "agent=")
        elapsed = time.monotonic() - started
    finally:
        reader.close()
        code = worker.stop()
    assert code == 0, worker.tail()  # it ran throughout: a crash would have ended the waits
    letters = _letters(reader, outputs[2])
    _check_letters(letters, sent, inventory_tombstone)
    assert tombstones == 1 and capacity_tombstones >= 1 and errors == 0
    # valid records: none dead-lettered but those the embedded runtime refuses too
    embedded_letters = Counter(d.error for d in expected.get("dlq", []) if isinstance(d, DeadLetter))
    assert Counter(d.error for at, d in letters.items() if at not in sent) == embedded_letters
    embedded_actions = [a for a in expected["actions"] if isinstance(a, Action)]
    assert {a.action_id for a in actions()} == want_actions, side_by_side(
        actions(), embedded_actions
    )
    assert {f.finding_id for f in findings()} == want_findings
    valid_consumed = int(consumed) - sum(1 for at in sent if at[0] in ours)
    lost = len(valid_at) - valid_consumed
    assert len(valid_at) == len(events) and lost == 0
    reliability.record(
        "poison",
        f"worker: {len(KINDS)} kinds in each of 13 input topics",
        {
            "poison_in": len(sent),
            "dead_lettered": len(to_letter & letters.keys()),
            "tombstones_skipped": int(tombstones),
            "valid_in": len(events),
            "valid_out": valid_consumed,
            "actions same as embedded": "yes",
            "lost": lost,
            "seconds": round(elapsed, 1),
        },
    )


# --- the lake sink ------------------------------------------------------------------------


def _run(args: list[str], env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _env(kafka: KafkaSettings, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "FLEETPULSE_KAFKA__MAX_VALUE_BYTES": str(LIMIT),
        "FLEETPULSE_METRICS__PORT": "0",
        **extra,
    }
    env.pop("FLEETPULSE_CONFIG", None)
    return env


def test_the_lake_sink_dead_letters_every_poison_and_keeps_every_row(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_kafka_topics(kafka)
    topics: dict[str, type[Event] | None] = {
        topic_name(kafka, spec.topic_suffix): spec.event for spec in TABLES.values()
    }
    made = {table: make() for table, make in fx.EVERYTHING.items()}
    kafka_producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=20)
    sent: dict[Coordinates, str] = {}
    for i, kind in enumerate(KINDS):
        sent |= _send_poisons(kafka_producer, topics, kind, {})
        for table, events in made.items():
            topic = topic_name(kafka, TABLES[table].topic_suffix)
            step = len(events) // len(KINDS) + 1
            for event in events[i * step : (i + 1) * step]:
                kafka_producer.send(topic, key=_key(event), value=encode(event))
    kafka_producer.flush(timeout=60)
    kafka_producer.close()
    compacted = {topic_name(kafka, s.suffix) for s in TOPICS if s.compacted}
    skipped = {at for at, kind in sent.items() if kind == "tombstone" and at[0] in compacted}
    assert skipped  # node-state is compacted, and read by the sink

    group = f"lake-{uuid.uuid4().hex[:8]}"
    lake = tmp_path / "lake"
    started = time.monotonic()
    out = _run(
        ["sink", "lake", "--lake", str(lake), "--exit-when-idle", "3"],
        _env(kafka, FLEETPULSE_LAKE__GROUP_ID=group, FLEETPULSE_LAKE__FLUSH_SECONDS="1"),
        timeout=120,
    )
    elapsed = time.monotonic() - started
    counted = re.search(r"(\d+) dead letters, (\d+) tombstones skipped", out)
    assert counted is not None, out
    assert (int(counted[1]), int(counted[2])) == (len(sent) - len(skipped), len(skipped)), out

    rows = 0
    with Lake(lake) as reader:
        for table, events in made.items():
            count = reader.sql(f"SELECT count(*) FROM {table}").rows[0][0]
            assert count == len(events), f"{table}: {count} rows, produced {len(events)}"
            rows += count
        for table, column in {"findings": "finding_id", "actions": "action_id"}.items():
            distinct = reader.sql(f"SELECT count(DISTINCT {column}) FROM {table}").rows[0][0]
            assert distinct == len(made[table])
    _assert_offsets_committed_to_the_end(kafka, group)
    dlq = TopicReader(kafka.bootstrap, [topic_name(kafka, "dlq")])
    try:
        dlq.until(lambda: len(dlq.records[dlq.topics[0]]) >= len(sent) - len(skipped), 30, "dlq")
        letters = _letters(dlq, dlq.topics[0])
    finally:
        dlq.close()
    _check_letters(letters, sent, skipped)
    valid_in = sum(len(events) for events in made.values())
    reliability.record(
        "poison",
        f"lake sink: {len(KINDS)} kinds in each of its 7 topics",
        {
            "poison_in": len(sent),
            "dead_lettered": len(letters),
            "tombstones_skipped": len(skipped),
            "valid_in": valid_in,
            "valid_out": rows,
            "lost": valid_in - rows,
            "seconds": round(elapsed, 1),
        },
    )


# --- the alerts process -------------------------------------------------------------------


def test_the_alerts_process_dead_letters_every_poison_and_delivers_every_alert(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_kafka_topics(kafka)
    topic = topic_name(kafka, "alerts")
    alerts = [_alert(f"gpu-node-{i:03d}") for i in range(30)]
    receiver = Receiver()
    kafka_producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=5)
    sent: dict[Coordinates, str] = {}
    step = len(alerts) // len(KINDS) + 1
    for i, kind in enumerate(KINDS):
        sent |= _send_poisons(kafka_producer, {topic: TOPIC_VALUES["alert"]}, kind, {})
        for alert in alerts[i * step : (i + 1) * step]:
            kafka_producer.send(topic, key=alert.fingerprint.encode(), value=encode(alert))
    kafka_producer.flush(timeout=60)
    kafka_producer.close()
    try:
        started = time.monotonic()
        out = _run(
            ["alerts", "--idle-exit", "3"],
            _env(
                kafka,
                FLEETPULSE_ALERTS__WEBHOOK_URLS=json.dumps([receiver.url]),
                FLEETPULSE_ALERTS__GROUP_ID=f"alerts-{uuid.uuid4().hex[:8]}",
            ),
            timeout=120,
        )
        elapsed = time.monotonic() - started
    finally:
        receiver.server.shutdown()
    counted = re.search(r"(\d+) delivered .*, (\d+) dead letters, (\d+) tombstones skipped", out)
    assert counted is not None, out
    assert tuple(int(n) for n in counted.groups()) == (len(alerts), len(KINDS) - 1, 1), out
    delivered = {a["fingerprint"] for body in receiver.bodies for a in body["alerts"]}
    assert delivered == {a.fingerprint for a in alerts}
    skipped = {at for at, kind in sent.items() if kind == "tombstone"}  # nothing to deliver
    dlq = TopicReader(kafka.bootstrap, [topic_name(kafka, "dlq")])
    try:
        dlq.until(lambda: len(dlq.records[dlq.topics[0]]) >= len(KINDS) - 1, 30, "dlq")
        letters = _letters(dlq, dlq.topics[0])
    finally:
        dlq.close()
    _check_letters(letters, sent, skipped)
    reliability.record(
        "poison",
        f"alerts process: {len(KINDS)} kinds in fleet.alerts",
        {
            "poison_in": len(sent),
            "dead_lettered": len(letters),
            "tombstones_skipped": len(skipped),
            "valid_in": len(alerts),
            "valid_out": len(delivered),
            "lost": len(alerts) - len(delivered),
            "seconds": round(elapsed, 1),
        },
    )


def test_the_broker_refuses_a_10_mb_value(kafka_settings: KafkaSettings) -> None:
    """Why too_large is tested against a low max_value_bytes: 10 MB never reaches a consumer."""
    create_kafka_topics(kafka_settings)
    big = KafkaProducer(
        bootstrap_servers=kafka_settings.bootstrap, max_request_size=16 << 20, retries=0
    )
    try:
        future = big.send(topic_name(kafka_settings, "alerts"), value=b"x" * (10 << 20))
        with pytest.raises(KafkaError, match=r"MessageSizeTooLarge|RecordTooLarge"):
            future.get(timeout=60)
    finally:
        big.close()
    reliability.record("poison", "10 MB value", {"refused by": "the broker (message.max.bytes)"})
