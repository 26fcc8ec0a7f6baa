"""Scale-out: 1, 2 and 3 `fleetpulse worker` processes on one broker, twelve partitions.

    python -m bench --only scaling        # writes bench/results/scaling.json (~5 min)
    python -m bench.scaling --quick       # 2 simulated minutes instead of 5, one round

For each group size N (1, then 2, then 3), on private topics of its own (twelve partitions),
with the same input each time: the default fleet (64 GPU nodes, 4 TPU slices) for 5 simulated
minutes with four forced faults (so that there are actions to compare), written as FleetPulse's
producers write it (telemetry in batch records per partition):

1. **Throughput.** N workers start in one consumer group; once together they own all twelve
   partitions, the input is produced, and the clock runs from the first record sent until the
   group has committed the last one (a worker commits only past acknowledged outputs). Input
   records/s, metric samples/s and MB/s in total, and each worker's share (its own
   `fleetpulse_worker_records_in_total` and CPU seconds). Ratios against the 1-worker run of
   the same invocation.
2. **The same decisions.** The group's fleet.actions (and fleet.findings) read back, compared
   with the 1-worker run's and with the embedded runtime's on the same events.
3. **Rebalance** (N >= 2). A worker leaves (SIGTERM: it leaves the group), then a fresh one
   joins. Each is timed from the signal (the new process's start) until the remaining or
   grown group's announced assignments cover all twelve partitions again (`assigned_s`), and
   until a probe (the next simulated tick, produced then) is committed (`consuming_s`). For a
   join, `after_startup_s` starts when the new process says it is about to join the group
   (Python start-up and topic checks left out).

The workers use the tests' settings (streams/testing.worker_env: event-time alignment always on,
so that the decisions do not depend on arrival order; 6 s session, 1 s heartbeat) with the
default alignment grace. On a machine with fewer cores than workers (this project's has 2 cores,
shared), 3 workers cannot scale linearly: the ratio says how much of a worker's time is spent
waiting on the broker that another worker can use, not how far the pipeline scales on 3 cores.
Read it with `cores` and the load averages in the result file. The sizes run in rounds (1, 2,
3 workers, then again: two rounds, one for --quick), so that each size sees about the same
background load; each size's figures are its median run (the faster of two), with every run's
wall in `runs_wall_s`; the rebalance is timed in the first round. Nothing here passes or fails; the
correctness of a scaled group mid-stream is tested in tests/faults/test_infra_scaling.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

from bench import broker
from bench.common import load_average, proc_cpu_seconds, ratio, result_name
from bench.common import write_result as _write
from bench.sim import metric_samples
from pipeline.config import Settings, SimSettings, WorkerSettings
from pipeline.model import Action, Event, Finding
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import ForcedFault
from pipeline.wire.kafka import client_kwargs, producer_kwargs
from pipeline.wire.topics import topic_name
from streams.testing import (
    INPUT_SUFFIX,
    TopicReader,
    WorkerProcess,
    embedded_outputs,
    metric_sum,
    worker_env,
)

PARTITIONS = 12
WORKERS = (1, 2, 3)
PROBE_S = 30  # simulated seconds after the measured input: the probes, one tick each
TIMEOUT_S = 300.0  # for any one wait; a stall is reported with the workers' last lines
FAULTS = (
    ForcedFault(fault_type="G1", at_s=60, target="fp-us-central1-h200-train-000"),
    ForcedFault(fault_type="G5", at_s=90, target="fp-us-east5-h100-train-000"),
    ForcedFault(fault_type="T2", at_s=80),
    ForcedFault(fault_type="J3", at_s=100),
)
SPREAD_TOPIC = "telemetry.gpu"  # the assignment checked: every input topic is co-partitioned


def fleet(quick: bool) -> SimSettings:
    """The default fleet (64 GPU nodes, 4 TPU slices), its random faults, and the probe ticks."""
    return SimSettings(duration_s=(120 if quick else 300) + PROBE_S)


def split(events: list[Event], start_ms: int, measured_s: int) -> tuple[list[Event],
                                                                       list[list[Event]]]:
    """The measured input, and the events after it grouped by timestamp (one probe a tick)."""
    end = start_ms + measured_s * 1000
    main = [e for e in events if getattr(e, "ts", 0) < end]
    ticks: dict[int, list[Event]] = {}
    for event in events:
        at = int(getattr(event, "ts", 0))
        if at >= end:
            ticks.setdefault(at, []).append(event)
    return main, [ticks[t] for t in sorted(ticks)]


def covers(owned: list[set[int]]) -> bool:
    """Each worker owns some partitions, and together they own every partition exactly once
    (a worker's stale line from before a rebalance makes a partition owned twice)."""
    return (all(owned) and sum(map(len, owned)) == PARTITIONS
            and set().union(*owned) == set(range(PARTITIONS)))


class Group:
    """N workers of one consumer group on the private topics of `settings`."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings = settings
        self.workdir = workdir
        self.workers: list[WorkerProcess] = []
        self.gone: list[WorkerProcess] = []  # left the group; stopped at close
        self.admin = KafkaAdminClient(**client_kwargs(settings.kafka))
        self.group = settings.worker.group_id or f"{settings.kafka.topic_prefix}-worker"
        self.inputs = sorted(topic_name(settings.kafka, s) for s in set(INPUT_SUFFIX.values()))

    def start(self) -> WorkerProcess:
        name = f"w{len(self.workers) + len(self.gone)}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        default = WorkerSettings()
        env = worker_env(self.settings, self.workdir / name,
                         FLEETPULSE_WORKER__ALIGN_GRACE_MS=str(default.align_grace_ms))
        worker = WorkerProcess(env, self.workdir / f"{name}.log").start()
        self.workers.append(worker)
        return worker

    def spread(self, marks: dict[int, int]) -> bool:
        """Every worker announced an assignment after its mark; together, all partitions once."""
        topic = topic_name(self.settings.kafka, SPREAD_TOPIC)
        owned = []
        for worker in self.workers:
            if worker.output().rfind("fleetpulse worker: assigned") < marks.get(id(worker), 0):
                return False
            owned.append(worker.assignment().get(topic, set()))
        return covers(owned)

    def committed(self, ends: dict[TopicPartition, int]) -> bool:
        offsets = self.admin.list_group_offsets(self.group).get(self.group, {})
        return all(tp in offsets and offsets[tp].offset >= end
                   for tp, end in ends.items() if end > 0)

    def ends(self) -> dict[TopicPartition, int]:
        return broker.end_offsets(self.settings, self.inputs)

    def settled(self) -> bool:
        """Every topic the group reads (its inputs and the internal topics between its stages,
        as the first worker lists them) committed to its end, twice a second apart: the
        stages downstream of the inputs (health, policy) are done too."""
        listed = re.findall(r"^  (?:inputs|internal): (.*)$", self.workers[0].output(), re.M)
        topics = sorted({*self.inputs, *(t for line in listed for t in line.split(", "))})
        for _ in range(2):
            time.sleep(1.0)
            if not self.committed(broker.end_offsets(self.settings, topics)):
                return False
        return True

    def records_in(self, worker: WorkerProcess) -> int:
        pattern = "|".join(re.escape(f'.{s}"') for s in set(INPUT_SUFFIX.values()))
        return int(metric_sum(worker.metrics_port(), "fleetpulse_worker_records_in_total",
                              pattern))

    def wait(self, done: Callable[[], bool], what: str) -> float:
        """Seconds until `done()`; RuntimeError with the workers' last lines after TIMEOUT_S."""
        start = time.perf_counter()
        while not done():
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None:
                    raise RuntimeError(f"a worker exited waiting for {what}:\n{worker.tail()}")
            if time.perf_counter() - start > TIMEOUT_S:
                tails = "\n---\n".join(w.tail(10) for w in self.workers)
                raise RuntimeError(f"no {what} within {TIMEOUT_S:.0f} s:\n{tails}")
            time.sleep(0.1)
        return time.perf_counter() - start

    def leave(self) -> None:
        """The last worker leaves the group (SIGTERM: a clean shutdown sends LeaveGroup)."""
        worker = self.workers.pop()
        worker.kill(signal.SIGTERM)
        self.gone.append(worker)

    def close(self) -> None:
        self.admin.close()
        for worker in [*self.workers, *self.gone]:
            worker.stop()


def marks_of(workers: Iterable[WorkerProcess]) -> dict[int, int]:
    return {id(w): len(w.output()) + 1 for w in workers}


def wire(settings: Settings, events: list[Event]) -> list[tuple[str, str, bytes, Any, Any]]:
    """`events` as the producers send them (telemetry batched): encoded before any clock runs."""
    return list(broker.wire_records(settings, broker.records(settings, events), batched=True))


def produce(settings: Settings, records: list[tuple[str, str, bytes, Any, Any]]) -> float:
    """Send pre-encoded records with the producers' compression (`kafka.compression`: a
    compressed batch costs kafka-python less CPU than a plain one) and wait for every
    acknowledgement; wall seconds."""
    start = time.perf_counter()
    kafka = KafkaProducer(**producer_kwargs(settings.kafka), acks="all", linger_ms=20,
                          batch_size=1 << 20, max_request_size=8 << 20)  # fmt: skip
    try:
        futures = [kafka.send(t, key=k.encode(), value=v, headers=h, partition=p)
                   for t, k, v, h, p in records]  # fmt: skip
        kafka.flush()
        for future in futures:
            future.get(timeout=60)
    finally:
        kafka.close()
    return time.perf_counter() - start


def decisions(settings: Settings) -> dict[str, list[str]]:
    """Every action and finding the group wrote, as sorted `id kind target` lines."""
    topics = {s: topic_name(settings.kafka, s) for s in ("actions", "findings")}
    total = sum(broker.end_offsets(settings, topics.values()).values())
    reader = TopicReader(settings.kafka.bootstrap, list(topics.values()), kafka=settings.kafka)
    try:
        reader.until(lambda: sum(map(len, reader.records.values())) >= total, 60, "outputs")
        actions = reader.values(topics["actions"], Action)
        findings = reader.values(topics["findings"], Finding)
    finally:
        reader.close()
    return summarised(actions, findings)


def summarised(actions: Iterable[Action], findings: Iterable[Finding]) -> dict[str, Any]:
    """Actions as sorted `id kind target` lines; findings (hundreds) as a count and a digest of
    theirs, enough to say two runs wrote the same set."""
    lines = described(findings)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return {"actions": described(actions),
            "findings": {"count": len(lines), "sha256": digest}}


def described(events: Iterable[Action | Finding]) -> list[str]:
    lines = set()
    for e in events:
        if isinstance(e, Action):
            lines.add(f"{e.action_id} {e.kind} {e.target.name}")
        else:
            lines.add(f"{e.finding_id} {e.check} {e.entity.target.name}")
    return sorted(lines)


def rebalance(group: Group, probe: list[Event], join: bool) -> dict[str, float]:
    """Time a worker leaving (`join` False) or a fresh one joining: from the signal (the new
    process's start) to the group's announced assignments covering every partition again, and
    to a probe, produced then, committed."""
    records = wire(group.settings, probe)
    marks = marks_of(group.workers)
    start = time.perf_counter()
    figures: dict[str, float] = {}
    if join:
        new = group.start()
        group.wait(lambda: "\n  internal:" in new.output(), "the new worker's start-up")
        ready = time.perf_counter()
    else:
        group.leave()
    group.wait(lambda: group.spread(marks), "assignment of every partition")
    figures["assigned_s"] = round(time.perf_counter() - start, 2)
    produce(group.settings, records)
    ends = group.ends()
    group.wait(lambda: group.committed(ends), "the probe committed")
    done = time.perf_counter()
    figures["consuming_s"] = round(done - start, 2)
    if join:
        figures["after_startup_s"] = round(done - ready, 2)
    return figures


def group_run(settings: Settings, inputs: list[Event], probes: list[list[Event]] | None, n: int,
              workdir: Path) -> dict[str, Any]:
    """One group of `n` workers on fresh private topics: throughput, decisions, and with
    `probes` (n > 1) a worker leaving and one joining."""
    row: dict[str, Any] = {}
    with broker.private_topics(settings):
        group = Group(settings, workdir)
        try:
            for _ in range(n):
                group.start()
            row["start_s"] = round(group.wait(lambda: group.spread({}), "the group's start"), 2)
            records = wire(settings, inputs)
            cpu = [proc_cpu_seconds(w.proc.pid) for w in group.workers if w.proc is not None]
            start = time.perf_counter()
            row["produce_s"] = round(produce(settings, records), 2)
            ends = group.ends()
            group.wait(lambda: group.committed(ends), "the input committed")
            row["wall_s"] = round(time.perf_counter() - start, 2)
            group.wait(group.settled, "the internal topics committed")
            row["settled_s"] = round(time.perf_counter() - start, 2)
            row["per_worker"] = [
                {"records": group.records_in(w),
                 "cpu_s": round(proc_cpu_seconds(w.proc.pid) - before, 2)}
                for w, before in zip(group.workers, cpu, strict=True) if w.proc is not None
            ]
            row["records"] = sum(ends.values())
            row |= decisions(settings)
            if probes and n > 1:
                row["rebalance"] = {"leave": rebalance(group, probes[0], join=False),
                                    "join": rebalance(group, probes[1], join=True)}
        finally:
            group.close()
    return row


def rates(row: dict[str, Any], samples: int, value_bytes: int) -> None:
    """Per second figures of a group's run, in place."""
    wall = row["wall_s"]
    row["records_per_s"] = round(row["records"] / wall)
    row["samples_per_s"] = round(samples / wall)
    row["mb_per_s"] = round(value_bytes / 1e6 / wall, 2)
    for worker in row["per_worker"]:
        worker["records_per_s"] = round(worker["records"] / wall)


def run(quick: bool, repeat: int | None = None) -> dict[str, Any]:
    repeat = repeat or (1 if quick else 2)
    load_before = load_average()
    sim_settings = fleet(quick)
    sim = Simulation(sim_settings, list(FAULTS))
    inputs, probes = split(list(sim.events()), sim.start_ms, sim_settings.duration_s - PROBE_S)
    base = broker.bench_settings("scaling")
    kafka = msgspec.structs.replace(base.kafka, partitions=PARTITIONS)
    base = msgspec.structs.replace(base, kafka=kafka)
    samples = sum(metric_samples(e) for e in inputs)
    value_bytes = sum(len(r.value) for r in broker.records(base, inputs))
    embedded = embedded_outputs(base, inputs)
    figures: dict[str, Any] = {
        "partitions": PARTITIONS, "events": len(inputs), "metric_samples": samples,
        "value_bytes": value_bytes, "cores": os.cpu_count(),
        "embedded": summarised(embedded.get("actions", []),  # type: ignore[arg-type]
                               embedded.get("findings", [])),  # type: ignore[arg-type]
    }
    unreachable = broker.reachable(base)
    if unreachable is not None:
        figures["kafka_skipped"] = unreachable
    else:
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in WORKERS}
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(repeat):  # 1, 2, 3, 1, 2, 3: each size sees the same load
                for n in WORKERS:
                    settings = broker.bench_settings(f"scaling{n}")
                    settings = msgspec.structs.replace(settings, kafka=msgspec.structs.replace(
                        settings.kafka, partitions=PARTITIONS))
                    row = group_run(settings, inputs, probes if round_ == 0 else None, n,
                                    Path(tmp) / f"r{round_}n{n}")
                    rates(row, samples, value_bytes)
                    runs[n].append(row)
                    print(f"{n} worker(s): {row['wall_s']} s, {row['records_per_s']} records/s",
                          flush=True)
        for n, rows in runs.items():
            figures[f"workers_{n}"] = median_run(rows)
        judge(figures)
    options = {"quick": quick, "fleet": msgspec.to_builtins(sim_settings),
               "forced_faults": [msgspec.to_builtins(f) for f in FAULTS],
               "workers": list(WORKERS), "repeat": repeat, "load_average_before": load_before,
               "load_average": load_average()}
    path = _write(result_name("scaling", quick), figures, options)
    return {"figures": figures, "settings": options, "path": str(path)}


def median_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall (the lower of two), with every run's wall, the first run's
    rebalance, and whether every run wrote the same decisions."""
    chosen = dict(sorted(rows, key=lambda r: r["wall_s"])[(len(rows) - 1) // 2])
    chosen["runs_wall_s"] = [r["wall_s"] for r in rows]
    if "rebalance" in rows[0]:
        chosen["rebalance"] = rows[0]["rebalance"]
    chosen["runs_agree"] = all(
        (r["actions"], r["findings"]) == (rows[0]["actions"], rows[0]["findings"]) for r in rows)
    return chosen


def judge(figures: dict[str, Any]) -> None:
    """Ratios against the 1-worker run and the decisions compared, in place."""
    one = figures["workers_1"]
    for n in WORKERS:
        row = figures[f"workers_{n}"]
        agree = row["runs_agree"] and one["runs_agree"]
        row["same_actions_as_1_worker"] = agree and row["actions"] == one["actions"]
        row["same_findings_as_1_worker"] = agree and row["findings"] == one["findings"]
        row["same_actions_as_embedded"] = row["actions"] == figures["embedded"]["actions"]
        row["same_findings_as_embedded"] = row["findings"] == figures["embedded"]["findings"]
        row["ratio_vs_1"] = ratio(row["samples_per_s"], one["samples_per_s"])
        figures[f"ratio_{n}_vs_1"] = row["ratio_vs_1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 simulated minutes, not 5")
    parser.add_argument("--repeat", type=int, help="rounds of 1, 2, 3 workers (2; quick: 1)")
    args = parser.parse_args()
    result = run(args.quick, args.repeat)
    print(json.dumps(result["figures"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
