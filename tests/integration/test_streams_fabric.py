"""A leaf switch failing, through Kafka: `fleetpulse worker` names the switch as the embedded
runtime does, and cordons no node for it.

The fleet stage that localises fabric faults reads the worker's own fleet-input topic: port
findings and fabric samples of every node of a cluster, which the Kafka driver writes in
batches (pipeline/wire/batches.py). The fabric samples themselves arrive batched too, as a
producer batching each scrape writes them: one record per partition and scrape, holding the samples of
every node of that partition; the GPU samples come one record per node. What the embedded
runtime decides from the same events is the reference: the same findings and the same
actions, with the same ids.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest

from pipeline.backtest.score import REMOVALS
from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import Action, DeadLetter, Event, FabricSample, Finding
from pipeline.sim import Simulation, parse_forced
from pipeline.wire.batches import BATCH_HEADER, partition_of
from pipeline.wire.codec import encode_as
from pipeline.wire.internal import FLEET_INPUT
from pipeline.wire.topics import record_key, topic_name
from streams.app import LAG_INTERVAL_S, app_id
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    embedded_outputs,
    metric_sum,
    produce_events,
    producer,
    side_by_side,
    wait_worked_off,
    worker_env,
)

pytestmark = pytest.mark.kafka

# batches the worker cannot read: not a batch at all, and a batch holding a bad value
POISON_BATCHES = [b"\xc1", msgspec.msgpack.encode([["application/json", b"{not json"]])]


@dataclass
class Run:
    settings: Settings
    expected: dict[str, list[Event]]
    reader: TopicReader
    port: int
    fabric_samples: int  # each one the telemetry stage admits goes on to the fleet stage

    def values(self, suffix: str, cls: type[Event]) -> list[Event]:
        return self.reader.values(topic_name(self.settings.kafka, suffix), cls)


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    # Three partitions, the whole run produced at once: a backlog, read a partition at a time
    # (each fits in one fetch), so the nodes' records reach the fleet stage up to 15 minutes
    # of event time apart and some nodes go unheard for 10 minutes of the cluster's time, a
    # few seconds of wall time. The fleet stage waits for the nodes it still hears
    # (pipeline/stages/cluster.py), so the switch is named from all its nodes, as in the
    # embedded runtime. A fleet this small lags by whole partitions: it may wait an hour.
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    base = load_settings(environ={})
    sim_settings = msgspec.structs.replace(
        base.sim, gpu_nodes=12, clusters=1, tpu_slices=0, duration_s=20 * 60,
        random_faults=False, diurnal=False, seed=3,
    )  # fmt: skip
    settings = msgspec.structs.replace(base, kafka=kafka, sim=sim_settings)
    sim = Simulation(sim_settings, [parse_forced("F1/tor@300")])
    events = list(sim.events())
    expected = embedded_outputs(settings, events)
    workdir = tmp_path_factory.mktemp("worker")
    env = worker_env(settings, workdir, FLEETPULSE_DETECT__FLEET_WAIT_MAX_S="3600")
    create_topics(env)
    worker = WorkerProcess(env, workdir / "worker.log").start()
    reader = TopicReader(kafka_bootstrap, [topic_name(kafka, s) for s in ("actions", "findings", "dlq")])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        print(f"worker assigned after {time.monotonic() - worker.started_at:.1f}s")
        kafka_producer = producer(kafka_bootstrap)
        fleet_input = f"{app_id(settings)}-{FLEET_INPUT}"
        for value in POISON_BATCHES:  # before the fleet's records, on the cluster's key
            kafka_producer.send(fleet_input, key=b"fp-us-central1", value=value,
                                headers=[(BATCH_HEADER, b"1")]).get(60)  # fmt: skip
        produce_events(settings, events, kafka_producer, batched=frozenset({"telemetry.fabric"}))
        # a batch holding a sample of another partition's node: its state would split
        stray = next(e for e in events if isinstance(e, FabricSample))
        home = partition_of(record_key(stray), kafka.partitions)
        value, content_type = encode_as(stray, settings.kafka.telemetry_format)
        kafka_producer.send(topic_name(kafka, "telemetry.fabric"), key=record_key(stray).encode(),
                            value=msgspec.msgpack.encode([[content_type, value]]),
                            partition=(home + 1) % kafka.partitions, headers=[(BATCH_HEADER, b"1")],
                            ).get(60)  # fmt: skip
        kafka_producer.close()

        def outputs() -> int:
            reader.poll()
            return sum(len(records) for records in reader.records.values())

        port = worker.metrics_port()
        fabric = [e for e in events if isinstance(e, FabricSample)]
        scrapes = {(e.ts, partition_of(record_key(e), kafka.partitions)) for e in fabric}
        records = len(events) - len(fabric) + len(scrapes) + 1  # and the stray batch
        wait_worked_off(port, r"\.telemetry\.|\.events\.|\.inventory\b", records,
                        timeout=240, quiet_s=2 * LAG_INTERVAL_S + 1, outputs=outputs,
                        why=worker.tail)  # fmt: skip
        yield Run(settings, expected, reader, port, len(fabric))
    finally:
        reader.close()
        code = worker.stop()
        assert code == 0, f"worker did not stop cleanly on SIGTERM:\n{worker.tail()}"


def test_the_switch_is_named_through_kafka_as_embedded_and_no_node_is_cordoned(run: Run) -> None:
    actions = [a for a in run.values("actions", Action) if isinstance(a, Action)]
    expected = [a for a in run.expected["actions"] if isinstance(a, Action)]
    repairs = [(a.kind, a.target.kind) for a in expected if a.kind == "repair_switch"]
    assert repairs == [("repair_switch", "switch")]  # the scenario is what it claims
    assert {a.action_id for a in actions} == {a.action_id for a in expected}, side_by_side(
        actions, expected
    )
    assert not [a for a in actions if a.kind in REMOVALS]


def test_findings_are_the_embedded_ones_each_written_once(run: Run) -> None:
    findings = [f for f in run.values("findings", Finding) if isinstance(f, Finding)]
    embedded = {f.finding_id for f in run.expected["findings"] if isinstance(f, Finding)}
    assert {f.finding_id for f in findings} == embedded
    # port findings travel on to the fleet stage on its own topic, not again on this one
    ids = [f.finding_id for f in findings]
    assert len(ids) == len(set(ids))


def test_batches_that_cannot_be_read_are_dead_lettered_and_the_rest_goes_on(run: Run) -> None:
    letters = [d for d in run.values("dlq", DeadLetter) if isinstance(d, DeadLetter)]
    internal = [d for d in letters if d.topic.endswith(FLEET_INPUT)]
    assert sorted(d.error.split(":")[0] for d in internal) == ["$", "value 0"], letters
    stray = [d for d in letters if d not in internal]
    assert [d.topic.endswith(".telemetry.fabric") for d in stray] == [True], letters
    assert stray[0].error.startswith("value 0: key: expected a value of partition"), stray
    assert "keys decide partitions" in stray[0].error


def test_fabric_samples_arrived_in_batches(run: Run) -> None:
    records = metric_sum(run.port, "fleetpulse_worker_records_in_total", r"\.telemetry\.fabric\"")
    assert 0 < records < run.fabric_samples / 2
    # each value is counted, the stray one too (it was handled: dead-lettered)
    values = metric_sum(run.port, "fleetpulse_worker_values_in_total", r"\.telemetry\.fabric\"")
    assert values == run.fabric_samples + 1


def test_fleet_input_travels_in_batches(run: Run) -> None:
    # one record per cluster and flush, not one per value passed on (a backlog here: big ones)
    records = metric_sum(run.port, "fleetpulse_worker_records_in_total", r"-fleet-input\"")
    assert 0 < records < run.fabric_samples / 2

