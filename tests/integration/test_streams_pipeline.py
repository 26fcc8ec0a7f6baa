"""The Kafka runtime end to end: simulator → Kafka → `fleetpulse worker` → output topics.

One worker serves every test here (faust starts slowly): a simulated fleet with forced faults
and a confounder, preceded by a poison record in every topic the worker reads, is produced
once; each test checks one promise against what came out — and against the embedded runtime
fed the same events, which must decide the same actions with the same ids.
"""

from __future__ import annotations

import base64
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import (
    Action,
    CapacitySnapshot,
    DeadLetter,
    Event,
    Finding,
    NodeState,
    Utilization,
)
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import InjectedFault
from pipeline.wire.batches import is_batch, partition_of, unpack
from pipeline.wire.codec import decode
from pipeline.wire.topics import capacity_key, scoped, topic_name
from streams.app import LAG_INTERVAL_S
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    embedded_outputs,
    metric_sum,
    produce_events,
    producer,
    scenario,
    side_by_side,
    wait_worked_off,
    worker_env,
)

pytestmark = pytest.mark.kafka

# A poison record for every topic the worker reads: what arrives, and what the letter must say.
POISON: dict[str, tuple[bytes | None, bytes, str]] = {
    "telemetry.gpu": (b"node-x", b"{not json", "expected a JSON object"),
    "telemetry.tpu": (b"slice-x", b'{"schema": "gpu_sample/3"}', "$.ts"),
    "telemetry.ici": (b"slice-x", b'{"schema": "ici_sample/9", "ts": 1}', "$.schema"),
    "events.xid": (b"node-x", b"[]", "expected"),
    "events.node": (None, b"\xff\xfe", "expected a JSON object"),
    "events.capacity": (b"zone-x", b'{"schema": "capacity_event/1"}', "required field"),
    "findings": (b"node-x", b"null", "expected"),
    "actions": (b"node-x", b'{"schema": "action/3", "action_id": 7}', "expected"),
}


@dataclass
class Run:
    settings: Settings
    sim: Simulation
    expected: dict[str, list[Event]]  # the embedded runtime's outputs, by topic suffix
    reader: TopicReader
    worker: WorkerProcess
    poison_at: dict[str, tuple[int, int]]  # topic suffix -> (partition, offset)

    def topic(self, suffix: str) -> str:
        return topic_name(self.settings.kafka, suffix)

    def actions(self) -> list[Action]:
        return self.reader.values(self.topic("actions"), Action)


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    sim = scenario()
    events = list(sim.events())
    expected = embedded_outputs(settings, events)
    workdir = tmp_path_factory.mktemp("worker")
    env = worker_env(settings, workdir)
    create_topics(env)
    worker = WorkerProcess(env, workdir / "worker.log").start()
    outputs = ["actions", "dlq", "node-state", "findings", "alerts", "utilization", "capacity"]
    reader = TopicReader(kafka_bootstrap, [topic_name(kafka, s) for s in outputs])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        print(f"worker assigned after {time.monotonic() - worker.started_at:.1f}s")
        kafka_producer = producer(kafka_bootstrap)
        poison_at = {}
        for suffix, (key, value, _) in POISON.items():
            meta = kafka_producer.send(topic_name(kafka, suffix), key=key, value=value).get(60)
            poison_at[suffix] = (meta.partition, meta.offset)
        produce_events(settings, events, kafka_producer)
        kafka_producer.close()
        result = Run(settings, sim, expected, reader, worker, poison_at)
        poisoned_inputs = sum(s.startswith(("telemetry.", "events.")) for s in POISON)
        _wait_until_processed(result, len(events) + poisoned_inputs)
        yield result
    finally:
        reader.close()
        code = worker.stop()
        print(worker.tail(5))
        assert code == 0, f"worker did not stop cleanly on SIGTERM:\n{worker.tail()}"


def _wait_until_processed(run: Run, inputs: int) -> None:
    """All inputs consumed (the worker's own counter), then every expected action is out:
    nothing left to read anywhere (internal topics included) and the outputs no longer growing
    across two looks at the lag."""

    def outputs() -> int:
        run.reader.poll()
        return sum(len(records) for records in run.reader.records.values())

    # the inputs' topics (the simulator also writes the fleet's inventory)
    wait_worked_off(run.worker.metrics_port(), r"\.telemetry\.|\.events\.|\.inventory\b",
                    inputs, timeout=240, quiet_s=2 * LAG_INTERVAL_S + 1, outputs=outputs,
                    why=run.worker.tail)


def _targets(faults: list[InjectedFault], klass: str) -> set[str]:
    return {f.target.name for f in faults if f.klass == klass}


def test_injected_faults_are_acted_on_and_confounders_left_alone(run: Run) -> None:
    hard = _targets(run.sim.ground_truth, "hard")
    innocent = _targets(run.sim.ground_truth, "confounder") - hard
    assert len(hard) == 3 and innocent, run.sim.ground_truth  # the scenario is what it claims
    acted = {}
    for action in run.actions():
        acted.setdefault(action.target.name, set()).add(action.kind)
    for target in hard:
        assert "cordon" in acted.get(target, set()), f"{target} not cordoned: {acted}"
    assert not innocent & acted.keys(), f"confounder targets acted on: {acted}"


def test_the_kafka_runtime_decides_what_the_embedded_runtime_decides(run: Run) -> None:
    actions = run.actions()
    expected = {a.action_id: a for a in run.expected["actions"] if isinstance(a, Action)}
    assert {a.action_id for a in actions} == expected.keys(), side_by_side(
        actions, list(expected.values())
    )
    for action in actions:  # an id names one decision: same kind, same target, same proposal
        twin = expected[action.action_id]
        assert (action.kind, action.target, action.proposal_id, action.dry_run) == (
            twin.kind,
            twin.target,
            twin.proposal_id,
            twin.dry_run,
        )
    findings = run.reader.values(run.topic("findings"), Finding)
    embedded_findings = {f.finding_id for f in run.expected["findings"] if isinstance(f, Finding)}
    assert {f.finding_id for f in findings} == embedded_findings



def test_utilization_rows_are_the_embedded_ones_in_a_batch_record_per_partition(run: Run) -> None:
    """`kafka.utilization_batch` (the default): the rows come as batch records, each value in
    the partition its own key picks, many rows a record; the rows are the embedded runtime's
    (the last windows may still be open in the worker: its partitions' clocks stop with the
    input)."""
    records = [r for r in run.reader.records[run.topic("utilization")] if r.value]
    assert records and all(is_batch(r) for r in records)
    rows: list[Utilization] = []
    for record in records:
        values = [decode(raw, Utilization, content_type=ct) for ct, raw in unpack(record.value)]
        keys = {scoped(u.cluster, u.slice or u.node) for u in values}
        assert {partition_of(k, run.settings.kafka.partitions) for k in keys} == {
            record.partition
        }
        rows += values
    assert len(rows) > 10 * len(records)  # a flush's windows of many devices in each

    def by_window(values: list[Utilization]) -> dict[tuple[str, str, int], Utilization]:
        return {(u.node, u.device, u.window_start): u for u in values}

    kafka_rows = by_window(rows)
    assert len(kafka_rows) == len(rows)  # each window once
    embedded = by_window([u for u in run.expected["utilization"] if isinstance(u, Utilization)])
    assert kafka_rows.keys() <= embedded.keys()
    assert len(kafka_rows) >= 0.9 * len(embedded)
    assert all(row == embedded[key] for key, row in kafka_rows.items())


def test_node_states_end_where_the_embedded_ones_end(run: Run) -> None:
    # `ts` and `since` say when the health machine saw a change, and through Kafka an action
    # reaches it later than in the embedded cascade: the rest must agree
    def last_by_target(states: list[NodeState]) -> dict[str, NodeState]:
        ordered = sorted(states, key=lambda s: s.ts)
        return {s.target.name: msgspec.structs.replace(s, ts=0, since=0) for s in ordered}

    kafka_states = last_by_target(run.reader.values(run.topic("node-state"), NodeState))
    embedded = [s for s in run.expected["node-state"] if isinstance(s, NodeState)]
    assert kafka_states == last_by_target(embedded)
    assert {s.state for s in kafka_states.values()} >= {"healthy", "draining"}


def test_the_capacity_stage_publishes_the_fleets_capacity_as_embedded(run: Run) -> None:
    """fleet.capacity from the worker's capacity agent (one partition, fed by the telemetry,
    health and zone agents through capacity-input): a snapshot for every key the embedded
    runtime publishes, counting the inventory's devices as it does. (Allocation and the
    publish times follow arrival order through Kafka, so only the inventory is compared.)"""
    records = [r for r in run.reader.records[run.topic("capacity")] if r.value]
    snapshots = [decode(r.value, CapacitySnapshot) for r in records]
    assert snapshots, "no fleet.capacity from the worker"
    assert all(r.key is not None and r.key.decode() == capacity_key(s)
               for r, s in zip(records, snapshots, strict=True))  # fmt: skip
    embedded = [s for s in run.expected["capacity"] if isinstance(s, CapacitySnapshot)]

    def devices(values: list[CapacitySnapshot]) -> dict[str, int]:
        return {capacity_key(s): s.devices for s in sorted(values, key=lambda s: s.ts)}

    assert devices(snapshots) == devices(embedded)


def test_a_poison_record_in_every_input_topic_is_dead_lettered(run: Run) -> None:
    letters = run.reader.values(run.topic("dlq"), DeadLetter)
    at = {(letter.topic, letter.partition, letter.offset): letter for letter in letters}
    for suffix, (key, value, says) in POISON.items():
        letter = at.get((run.topic(suffix), *run.poison_at[suffix]))
        assert letter is not None, f"no dead letter for the poison in {suffix}: {sorted(at)}"
        assert base64.b64decode(letter.raw_b64) == value
        assert letter.key == (None if key is None else key.decode())
        assert says in letter.error, letter.error
    # Nothing else went there but the simulator's events the codec rejects, if any (the
    # embedded runtime dead-letters those too). The stream went on after every poison record:
    # the actions of the other tests come from records behind them.
    poison = {(run.topic(s), *run.poison_at[s]) for s in POISON}
    others = sorted(letter.error for key, letter in at.items() if key not in poison)
    assert others == sorted(
        d.error for d in run.expected.get("dlq", []) if isinstance(d, DeadLetter)
    )


def test_metrics_count_what_went_through(run: Run) -> None:
    port = run.worker.metrics_port()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    dead = metric_sum(port, "fleetpulse_worker_dead_letters_total", "reason=")
    assert dead == len(POISON) + len(run.expected.get("dlq", []))
    actions = metric_sum(port, "fleetpulse_worker_actions_total", "kind=")
    assert actions == len(run.expected["actions"])
    lags = re.findall(r"^fleetpulse_worker_consumer_lag\{.*\} (\S+)$", text, re.M)
    assert lags and all(float(lag) == 0 for lag in lags), "backlog left after processing"
    assert re.search(
        r"^fleetpulse_worker_processing_seconds_count\{agent=\"telemetry\"\} [1-9]", text, re.M
    )


def test_actions_alerts_and_node_states_carry_cloudevents_headers(run: Run) -> None:
    # consumers route on ce_type / ce_subject without decoding; the SDK reads each record as a
    # CloudEvent whose data is the record value, unchanged
    from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
    from cloudevents.core.formats.json import JSONFormat

    from pipeline.model import TOPIC_VALUES
    from pipeline.wire import codec

    kinds = {"actions": "action", "alerts": "alert", "node-state": "node_state"}
    for suffix, name in kinds.items():
        records = [r for r in run.reader.records[run.topic(suffix)] if r.value]
        valid = [r for r in records if r.value != POISON["actions"][1]]  # not our poison
        assert valid, f"no {suffix} records to check"
        for record in valid:
            headers = {key: bytes(value) for key, value in record.headers}
            ce = from_binary(KafkaMessage(headers, record.key, record.value), JSONFormat())
            event = codec.decode(record.value, TOPIC_VALUES[name])
            assert ce.get_type().startswith(f"io.fleetpulse.{name}."), ce.get_type()
            assert ce.get_data() == msgspec.to_builtins(event)
            assert headers["content-type"] == b"application/json"
            if isinstance(event, Action):
                assert ce.get_id() == event.action_id
                assert ce.get_subject() == f"{event.target.cluster}/{event.target.name}"
