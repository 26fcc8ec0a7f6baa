"""Latency: from a fatal fault's record landing on the broker to its action on `fleet.actions`.

    python -m bench.latency            # writes bench/results/latency.json
    python -m bench.latency --quick    # shorter warm-up, fewer faults
    python -m bench.latency --take 500 # the worker taking batches (writes latency-take.json)

One `fleetpulse worker` runs under a steady background load paced in real time: 10,000
simulated GPUs (1,250 nodes) scraped every 10 s plus TPU slices (chip and ICI samples), each
interval's samples spread evenly over it, as scrapes of many targets are, and written as
FleetPulse's producers write them by default: a batch record per topic and partition. After a warm-up, fatal
XIDs (79, GPU fallen off the bus) are injected one at a time on distinct nodes, round robin
over the pools. Both the XID topic and the actions topic are set to LogAppendTime, so every
latency is two timestamps of the broker's own clock: the XID's append and its action's append.

Baseline in the same run: the same XID records read back by a plain consumer in this process
(append → delivered to a do-nothing reader), so the ratio says how much of the time is the
pipeline's (four topic hops: telemetry → findings → health → policy → actions) and how much the
broker's. The worker's CPU share and its backlog at the end say whether it kept up with the load.
The findings and proposals topics are stamped by the broker too, so the time splits per hop:
XID → its finding (the telemetry stage), finding → proposal (health), proposal → action (policy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from bench import broker
from bench.common import load_average, ratio, result_name, write_result
from bench.sim import metric_samples
from pipeline.config import Settings, SimSettings
from pipeline.model import Action, Event, Finding, GpuSample, Proposal, XidEvent
from pipeline.sim.engine import Simulation
from pipeline.sim.messages import xid_line
from pipeline.wire import codec
from pipeline.wire.batches import is_batch
from pipeline.wire.kafka import client_kwargs
from pipeline.wire.topics import record_key, topic_name

GPUS = 10_000
TPU_SLICES = 8
INTERVAL_S = 10
SLICES_PER_INTERVAL = 20  # each interval's records go out in this many evenly spaced bursts
FATAL_XID = 79
HOP_TOPICS = ("findings", "proposals")  # between the XID and its action, broker-stamped too


@dataclass(frozen=True)
class Plan:
    warmup_s: int
    faults: int
    every_s: float
    tail_s: int = 30  # after the last fault: time for its action, then stop

    @property
    def duration_s(self) -> int:
        return int(self.warmup_s + self.faults * self.every_s + self.tail_s) + INTERVAL_S


def plan(quick: bool) -> Plan:
    return Plan(warmup_s=30, faults=8, every_s=3, tail_s=10) if quick else Plan(60, 24, 5)


def background(p: Plan) -> SimSettings:
    return SimSettings(
        gpu_nodes=GPUS // 8, tpu_slices=TPU_SLICES, duration_s=p.duration_s,
        gpu_interval_s=INTERVAL_S, tpu_interval_s=INTERVAL_S, ici_interval_s=INTERVAL_S,
        random_faults=False, fault_types=("S5",),  # a healthy fleet: only injected faults
    )


@dataclass
class Injection:
    node: str
    sent_at: float  # perf_counter when handed to the producer
    appended_ms: int | None = None  # broker LogAppendTime of the XID record
    delivered_ms: int | None = None  # when this process's plain consumer got it (wall ms)
    action_ms: int | None = None  # broker LogAppendTime of its first action
    action_kind: str | None = None
    finding_ms: int | None = None  # ... of the first unhealthy finding on its node
    proposal_ms: int | None = None  # ... of the first proposal for its node


@dataclass
class Load:
    """The paced producer: background ticks, and fatal XIDs at their planned moments."""

    settings: Settings
    ticks: list[list[broker.Record]]
    xids: list[tuple[float, XidEvent]]  # (seconds after start, event with ts set at send)
    start_ms: int  # event time of the first tick
    injections: list[Injection] = field(default_factory=list)
    sent: int = 0
    late_s: float = 0.0  # how far the producer fell behind its schedule, at worst
    error: BaseException | None = None
    _futures: list[tuple[Injection, Any]] = field(default_factory=list)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        kafka = broker.producer(self.settings, linger_ms=5)
        xid_topic = topic_name(self.settings.kafka, "events.xid")
        schedule = sorted(
            [(k * INTERVAL_S + j * INTERVAL_S / SLICES_PER_INTERVAL, 1, (k, j))
             for k in range(len(self.ticks)) for j in range(SLICES_PER_INTERVAL)]
            + [(at, 0, (i, -1)) for i, (at, _) in enumerate(self.xids)])
        t0 = time.perf_counter()
        for at, kind, (a, b) in schedule:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.late_s = max(self.late_s, -delay)
            if kind == 0:
                self._inject(kafka, xid_topic, a, t0)
            else:
                tick = self.ticks[a]
                share = len(tick) // SLICES_PER_INTERVAL + 1
                records = tick[b * share:(b + 1) * share]
                # as FleetPulse's producers write it by default: a batch per topic and partition
                for topic, key, value, headers, partition in broker.wire_records(
                        self.settings, records, batched=True):
                    kafka.send(topic, key=key.encode(), value=value, headers=headers,
                               partition=partition)
                self.sent += len(records)
        kafka.flush()
        for injection, future in self._futures:
            injection.appended_ms = future.get(timeout=60).timestamp
        kafka.close()

    def _inject(self, kafka: Any, topic: str, index: int, t0: float) -> None:
        _, template = self.xids[index]
        now_ms = self.start_ms + int((time.perf_counter() - t0) * 1000)
        event = msgspec.structs.replace(template, ts=now_ms)
        injection = Injection(node=event.node, sent_at=time.perf_counter())
        future = kafka.send(topic, key=record_key(event).encode(), value=codec.encode(event))
        kafka.flush()  # the fault goes out now, not after the next background burst
        self.injections.append(injection)
        self._futures.append((injection, future))


def fatal_xids(sim: Simulation, first_tick: list[Event], p: Plan) -> list[tuple[float, XidEvent]]:
    """One XID 79 per fault on distinct nodes, round robin over the pools, evenly spaced."""
    by_pool: dict[str, list[GpuSample]] = {}
    for event in first_tick:
        if isinstance(event, GpuSample):
            by_pool.setdefault(event.pool, []).append(event)
    chosen = [s for s in itertools.chain(*itertools.zip_longest(*by_pool.values())) if s]
    xids = []
    for i, sample in enumerate(chosen[: p.faults]):
        gpu = sample.gpus[i % len(sample.gpus)]
        assert gpu.pci_bus_id is not None, "the simulator names every GPU's PCI bus id"
        pci = codec.normalize_pci(gpu.pci_bus_id)
        xids.append((p.warmup_s + i * p.every_s, XidEvent(
            ts=sim.start_ms, cluster=sample.cluster, node=sample.node, pool=sample.pool,
            zone=sample.zone, pci_bus_id=pci, gpu_index=gpu.index, uuid=gpu.uuid,
            xid=FATAL_XID, message=xid_line(FATAL_XID, pci, "GPU has fallen off the bus.",
                                             None, None),
            source="simulator")))
    return xids


def watch(settings: Settings, load: Load, producer: threading.Thread, tail_s: float) -> None:
    """Read the XID and action topics until the load is done and every fault has its action
    (or `tail_s` more seconds passed); fill in delivery and action times."""
    xid_topic = topic_name(settings.kafka, "events.xid")
    actions_topic = topic_name(settings.kafka, "actions")
    hops = {topic_name(settings.kafka, s): s for s in HOP_TOPICS}
    consumer = KafkaConsumer(**client_kwargs(settings.kafka),
                             enable_auto_commit=False, fetch_max_wait_ms=10)
    partitions = [TopicPartition(t, p) for t in (xid_topic, actions_topic, *hops)
                  for p in sorted(consumer.partitions_for_topic(t) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    first_action: dict[str, tuple[int, str]] = {}
    first_hop: dict[tuple[str, str], int] = {}  # (topic suffix, node) -> append time
    delivered: dict[str, int] = {}
    deadline: float | None = None
    try:
        while deadline is None or time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=50).values():
                got_ms = int(time.time() * 1000)
                for record in batch:
                    if record.topic == xid_topic:  # keyed cluster/node: the node is in the value
                        if is_batch(record):  # the background's own XIDs, not an injection
                            continue
                        delivered.setdefault(codec.decode(record.value, XidEvent).node, got_ms)
                    elif record.topic in hops:
                        node = _hop_node(hops[record.topic], record.value)
                        if node is not None:
                            first_hop.setdefault((hops[record.topic], node), record.timestamp)
                    else:
                        action = codec.decode(record.value, Action)
                        first_action.setdefault(action.target.name,
                                                (record.timestamp, action.kind))
            if not producer.is_alive() and deadline is None:
                deadline = time.monotonic() + tail_s
            if deadline is not None and all(i.node in first_action for i in load.injections):
                break
    finally:
        consumer.close()
    for injection in load.injections:
        injection.delivered_ms = delivered.get(injection.node)
        injection.finding_ms = first_hop.get(("findings", injection.node))
        injection.proposal_ms = first_hop.get(("proposals", injection.node))
        if injection.node in first_action:
            injection.action_ms, injection.action_kind = first_action[injection.node]


def _hop_node(suffix: str, value: bytes) -> str | None:
    """The node an unhealthy finding or a proposal is about (None: healthy, or not a node)."""
    if suffix == "findings":
        finding = codec.decode(value, Finding)
        return None if finding.healthy else finding.entity.target.name
    return codec.decode(value, Proposal).target.name


def hop_latencies(injections: list[Injection]) -> dict[str, dict[str, float | None]]:
    """Each hop's share of the path, from the broker's append times."""
    def gaps(a: str, b: str) -> list[float]:
        pairs = [(getattr(i, a), getattr(i, b)) for i in injections]
        return [(end - start) / 1000 for start, end in pairs if start is not None and end is not None]

    return {"xid_to_finding_s": quantiles(gaps("appended_ms", "finding_ms")),
            "finding_to_proposal_s": quantiles(gaps("finding_ms", "proposal_ms")),
            "proposal_to_action_s": quantiles(gaps("proposal_ms", "action_ms"))}


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "count": 0}
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 4),
            "p99": round(float(np.percentile(arr, 99)), 4),
            "max": round(float(arr.max()), 4), "count": len(values)}


def bench_latency(quick: bool, take: int = 0) -> dict[str, Any]:
    p = plan(quick)
    settings = broker.bench_settings("latency")
    unreachable = broker.reachable(settings)
    if unreachable is not None:
        return {"skipped": unreachable}
    sim = Simulation(background(p))
    ticks_events = list(sim.ticks())
    ticks = [broker.records(settings, tick) for tick in ticks_events]
    samples = sum(metric_samples(e) for e in ticks_events[1])
    xids = fatal_xids(sim, ticks_events[0], p)
    load = Load(settings, ticks, xids, sim.start_ms)
    with broker.private_topics(settings), tempfile.TemporaryDirectory() as tmp:
        broker.set_log_append_time(settings, ["events.xid", "actions", *HOP_TOPICS])
        # worker.take > 0: agents take batches from faust (0: one event at a time, the default)
        worker = broker.Worker(settings, Path(tmp), {"FLEETPULSE_WORKER__TAKE": str(take)})
        worker.start()
        try:
            worker.wait_assigned(timeout=180)
            cpu0, wall0 = worker.cpu_seconds(), time.perf_counter()
            producer = threading.Thread(target=load.run, name="load", daemon=True)
            producer.start()
            watch(settings, load, producer, p.tail_s)
            producer.join(60)
            cpu_share = (worker.cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
            backlog = _backlog(settings, worker)
        finally:
            worker.stop()
    if load.error is not None:
        raise load.error
    latencies = [(i.action_ms - i.appended_ms) / 1000 for i in load.injections
                 if i.action_ms is not None and i.appended_ms is not None]
    delivery = [(i.delivered_ms - i.appended_ms) / 1000 for i in load.injections
                if i.delivered_ms is not None and i.appended_ms is not None]
    fault_to_action = quantiles(latencies)
    broker_delivery = quantiles(delivery)
    return {
        **({"take": take} if take else {}),
        "fault_to_action_s": fault_to_action,
        "broker_delivery_s": broker_delivery,
        "hops": hop_latencies(load.injections),
        "p99_vs_broker_delivery": ratio(fault_to_action["p99"], broker_delivery["p99"], 1),
        "faults": len(load.injections),
        "actions": len(latencies),
        "action_kinds": sorted({i.action_kind for i in load.injections if i.action_kind}),
        "missing": [i.node for i in load.injections if i.action_ms is None],
        "background": {
            "gpus": GPUS, "tpu_chips": sum(len(s.coords) for s in sim.fleet.slices),
            "values_per_s": round(len(ticks[1]) / INTERVAL_S, 1),  # events (a value each)
            "samples_per_s": round(samples / INTERVAL_S),
            "values_sent": load.sent,
            "producer_late_s": round(load.late_s, 3),
        },
        "worker_cpu_share": round(cpu_share, 3),
        "worker_backlog_at_end": backlog,
        "mean_latency_s": round(statistics.fmean(latencies), 4) if latencies else None,
    }


def _backlog(settings: Settings, worker: broker.Worker) -> int:
    """Input records not yet committed by the worker when the load stopped."""
    inputs = [topic_name(settings.kafka, s) for s in
              ("telemetry.gpu", "telemetry.tpu", "telemetry.ici", "events.xid")]
    ends = broker.end_offsets(settings, inputs)
    admin = KafkaAdminClient(**client_kwargs(settings.kafka))
    try:
        return sum(ends.values()) - worker.committed(admin, ends)
    finally:
        admin.close()


def run(quick: bool, take: int = 0) -> dict[str, Any]:
    p = plan(quick)
    figures = bench_latency(quick, take)
    settings = {"quick": quick, "take": take, "warmup_s": p.warmup_s, "faults": p.faults,
                "fault_every_s": p.every_s, "gpus": GPUS, "tpu_slices": TPU_SLICES,
                "interval_s": INTERVAL_S, "xid": FATAL_XID, "load_average": load_average()}
    path = write_result(result_name("latency-take" if take else "latency", quick), figures,
                        settings)
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short warm-up, fewer faults")
    parser.add_argument("--take", type=int, default=0, metavar="N",
                        help="run the worker with worker.take = N (results: latency-take.json)")
    args = parser.parse_args()
    result = run(args.quick, args.take)
    print(json.dumps(result["figures"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
