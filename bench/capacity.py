"""Capacity benchmarks (issue 37): how early and how well the quota forecast sees exhaustion on
simulated ramps, how often it cries wolf on flat and stepped quotas, and what the capacity fold
costs beside the worker's throughput.

    python -m bench.capacity            # writes bench/results/capacity.json
    python -m bench.capacity --quick    # fewer series, a smaller fleet: a smoke run

Forecast: a quota of 512 devices read every 5 minutes, usage starting at 30 % and rising at
`rate` of the limit per hour with Gaussian noise `noise` (of the limit); the forecast is
re-run at each point over the last 6 h (the default quota window). The crunch rule fires when
the forecast says "out within 6 h" at confidence >= 0.5 (the defaults). Lead time: true
exhaustion - first firing; error: the forecast exhaustion at first firing - true exhaustion.
Flat and stepped quotas (usage that never rises after the step) are run for 24 h: any firing
is a false alarm.

Fold: a fleet of `nodes` 8-GPU nodes, one utilization row per GPU per minute for an hour,
folded row by row; then one publish (snapshots, crunch, advice) of the whole fleet. The share
of a worker: utilization rows/s the worker makes at its measured embedded throughput
(bench/results/throughput.json: GPU samples/s, 4 per row at 15 s scrapes into 60 s windows)
over the fold's rows/s.

Stage cost: the default simulated fleet (bench/throughput.py's, 64 GPU nodes and 4 TPU slices,
10 min; 5 min with --quick) fed as encoded records through the embedded runtime twice in each
round, with every stage and with the stage table less the capacity stage, rounds interleaved so
both see the same machine; records/s of each and their ratio. Without the capacity stage the
other stages still hand it their outputs (utilization rows, node states, capacity events),
which the runtime drops: the ratio is the capacity stage's own cost (its fold, timer, snapshots,
advice, alerts). Through Kafka each utilization row is also written a second time, to
`capacity-input`: the encoding of those rows is timed on its own, as a share of the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, measure, timing, write_result
from pipeline import docs_markers
from pipeline.capacity import view
from pipeline.capacity.forecast import ForecastRules, QuotaPoint, forecast
from pipeline.capacity.prices import catalog_book
from pipeline.capacity.state import CapacityState, fold
from pipeline.config import CapacitySettings
from pipeline.model import Inventory, Utilization

DOCS_MARKER = "capacity-measured"  # docs/capacity.md's generated list
LIMIT = 512.0
STEP_MS = 300_000
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000
SETTINGS = CapacitySettings()
RULES = ForecastRules(min_points=SETTINGS.forecast_min_points)


def _fires(points: list[QuotaPoint]) -> tuple[int, int] | None:
    """(time, forecast exhaustion) when the crunch rule first fires on a growing series."""
    window_ms = SETTINGS.quota_window_s * 1000
    for end in range(1, len(points) + 1):
        now = points[end - 1].ts
        seen = [p for p in points[:end] if p.ts >= now - window_ms]
        result = forecast(seen, RULES)
        if result.exhausts_at is None or result.confidence < SETTINGS.crunch_confidence:
            continue
        if result.exhausts_at - now <= SETTINGS.crunch_quota_within_s * 1000:
            return now, result.exhausts_at
    return None


def _ramp(
    rng: np.random.Generator, rate: float, noise: float, limit: float = LIMIT, whole: bool = False
) -> tuple[list[QuotaPoint], int]:
    hours = (1 - 0.3) / rate
    n = int(hours * 12) + 1
    usage = 0.3 * limit + rate * limit * np.arange(n) / 12 + rng.normal(0, noise * limit, n)
    if whole:  # quota usage is counted in devices: a slow ramp is a staircase
        usage = np.floor(usage)
    points = [QuotaPoint(T0 + i * STEP_MS, float(min(u, limit)), limit) for i, u in enumerate(usage)]
    return points, T0 + int(hours * HOUR_MS)


SCENARIOS = [
    *((rate, noise, LIMIT, False) for rate in (0.02, 0.05, 0.10) for noise in (0.0, 0.01, 0.03)),
    # a 64-device quota in whole devices: +1.3 and +3.2 devices an hour, steps of 1
    (0.02, 0.0, 64.0, True), (0.05, 0.0, 64.0, True),
]  # fmt: skip


def ramps(series: int) -> list[dict[str, Any]]:
    return [_scenario(series, *scenario) for scenario in SCENARIOS]


def _scenario(series: int, rate: float, noise: float, limit: float, whole: bool) -> dict[str, Any]:
    rng = np.random.default_rng([int(rate * 100), int(noise * 100), int(limit)])
    leads, errors, missed = [], [], 0
    for _ in range(series):
        points, true_end = _ramp(rng, rate, noise, limit, whole)
        fired = _fires(points)
        if fired is None or fired[0] >= true_end:
            missed += 1
            continue
        leads.append((true_end - fired[0]) / 60_000)
        errors.append((fired[1] - true_end) / 60_000)
    return {
        "rate_per_h": rate, "noise": noise, "limit": limit, "whole_devices": whole,
        "series": series, "missed": missed,
        "lead_min_p50": _p(leads, 50), "lead_min_p10": _p(leads, 10),
        "error_min_p50": _p(errors, 50), "abs_error_min_p90": _p([abs(e) for e in errors], 90),
    }  # fmt: skip


def false_alarms(series: int) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    flat_fired = step_fired = 0
    n = 24 * 12
    for _ in range(series):
        level = rng.uniform(0.2, 0.9) * LIMIT
        flat = level + rng.normal(0, 0.02 * LIMIT, n)
        step = np.where(np.arange(n) < n // 2, level * 0.6, level) + rng.normal(0, 0.01 * LIMIT, n)
        for usage, counter in ((flat, "flat"), (step, "step")):
            points = [QuotaPoint(T0 + i * STEP_MS, float(u), LIMIT) for i, u in enumerate(usage)]
            if _fires(points) is not None:
                if counter == "flat":
                    flat_fired += 1
                else:
                    step_fired += 1
    return {"series": series, "hours": 24, "flat_noise": 0.02, "flat_false_alarms": flat_fired,
            "step_false_alarms": step_fired}  # fmt: skip


def fold_cost(nodes: int) -> dict[str, Any]:
    state = CapacityState()
    zones = [f"us-central1-{z}" for z in "abc"] + [f"us-east5-{z}" for z in "abc"]
    for i in range(nodes):
        fold(state, Inventory(ts=T0, cluster="c1", kind="node", name=f"n{i:05d}", pool=f"p{i % 8}",
                              zone=zones[i % len(zones)], accelerator="nvidia-h100-80gb",
                              capacity=8))  # fmt: skip
    rows = [
        Utilization(window_start=T0 + minute * 60_000, window_s=60, cluster="c1", pool=f"p{i % 8}",
                    zone=zones[i % len(zones)], node=f"n{i:05d}", device=str(gpu),
                    accelerator="NVIDIA H100 80GB HBM3", allocated=gpu < 6, util_mean=55.0,
                    util_max=90.0, mem_used_frac=0.5, samples=4)
        for minute in range(60) for i in range(nodes) for gpu in range(8)
    ]  # fmt: skip
    started = time.process_time()
    for row in rows:
        fold(state, row)
    fold_s = time.process_time() - started
    book = catalog_book()
    started = time.process_time()
    _, out = view.publish(state, SETTINGS, book)
    publish_s = time.process_time() - started
    rows_per_s = len(rows) / fold_s
    worker = _worker_samples_per_s()
    share = None if worker is None else round(worker / 4 / rows_per_s, 4)
    return {"nodes": nodes, "devices": nodes * 8, "rows": len(rows),
            "fold_rows_per_cpu_s": round(rows_per_s), "publish_cpu_s": round(publish_s, 4),
            "snapshots": len(out.snapshots), "worker_gpu_samples_per_s": worker,
            "fold_share_of_worker_at_full_rate": share}  # fmt: skip


def stage_cost(quick: bool) -> dict[str, Any]:
    """The embedded runtime with and without the capacity stage, on the same records."""
    from bench import broker
    from bench.throughput import fleet
    from pipeline.runtime.embedded import EmbeddedRuntime
    from pipeline.sim.engine import Simulation
    from pipeline.stages import topology
    from pipeline.wire import codec

    settings = broker.bench_settings("capacity")
    events = list(Simulation(fleet(quick)).events())
    batch = broker.records(settings, events)
    prefix = settings.kafka.topic_prefix + "."
    work = [(r.topic.removeprefix(prefix), r.value, r.key, r.content_type) for r in batch]
    without = tuple(stage for stage in topology.STAGES if stage.name != "capacity")
    outputs: dict[str, list[Any]] = {}

    def run(stages: tuple[Any, ...], keep: bool) -> Callable[[], None]:
        def feed() -> None:
            emitted: dict[str, list[Any]] = {}
            runtime = EmbeddedRuntime(
                settings, (lambda topic, event: emitted.setdefault(topic, []).append(event))
                if keep else None, stages=stages)  # fmt: skip
            for offset, (suffix, value, key, content_type) in enumerate(work):
                runtime.feed_raw(suffix, value, offset, key, content_type)
            runtime.finish()
            if keep:
                outputs.update(emitted)
        return feed

    run(topology.STAGES, keep=True)()  # warm up, and count what it publishes
    rounds = 3 if quick else 5
    with_runs, without_runs = [], []
    for _ in range(rounds):
        with_runs.append(measure(run(topology.STAGES, keep=False), 1))
        without_runs.append(measure(run(without, keep=False), 1))
    with_all = timing([(t.wall_s, t.cpu_s) for t in with_runs])
    no_capacity = timing([(t.wall_s, t.cpu_s) for t in without_runs])
    rows = outputs.get("utilization", [])
    encode = measure(lambda: [codec.encode(row) for row in rows], rounds)
    return {
        "records": len(work), "utilization_rows": len(rows),
        "snapshots": len(outputs.get("capacity", [])),
        "advice": len(outputs.get("capacity.advice", [])),
        "with_capacity": {**with_all.summary(), "records_per_s": round(len(work) / with_all.wall_s),
                          "records_per_cpu_s": round(len(work) / with_all.cpu_s)},
        "without_capacity": {**no_capacity.summary(),
                             "records_per_s": round(len(work) / no_capacity.wall_s),
                             "records_per_cpu_s": round(len(work) / no_capacity.cpu_s)},
        # CPU seconds with the stage over without it, in the same rounds; the runs' spread
        # ((max - min) / median of each side's CPU seconds, the larger): the ratio's noise
        "cpu_ratio": round(with_all.cpu_s / no_capacity.cpu_s, 3),
        "cpu_spread": round(max(_spread(with_all.runs_cpu_s), _spread(no_capacity.runs_cpu_s)), 3),
        "throughput_ratio": round(no_capacity.wall_s / with_all.wall_s, 3),
        # encoding every utilization row once more (the worker's second write), over the run
        "second_write_encode_cpu_s": round(encode.cpu_s, 4),
        "second_write_encode_share": round(encode.cpu_s / with_all.cpu_s, 4),
    }  # fmt: skip


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def stage_cost_words(figures: dict[str, Any], settings: dict[str, Any], machine: dict[str, Any],
                     ) -> str:  # fmt: skip
    """The docs' paragraph of the stage cost, from a result file's parts."""
    cost = figures["stage_cost"]
    extra = round(100 * (cost["cpu_ratio"] - 1), 1)
    spread = round(100 * cost["cpu_spread"], 1)
    verdict = (f"within the runs' spread of {spread} %, so not measurable here"
               if abs(extra) <= spread else f"beyond the runs' spread of {spread} %")
    return (
        f"- The capacity stage in the embedded runtime ({cost['records']:,} records of the "
        f"default simulated fleet, {cost['utilization_rows']:,} utilization rows, "
        f"{cost['snapshots']:,} snapshots): {cost['with_capacity']['records_per_s']:,} "
        f"records/s with it, {cost['without_capacity']['records_per_s']:,} without, in the same "
        f"run. CPU ratio with / without {cost['cpu_ratio']} ({extra:+} %: {verdict}); "
        f"throughput ratio {cost['throughput_ratio']} (wall time, noisier on a shared machine)."
        f" Encoding each utilization row a second time, as the "
        f"worker's write to `capacity-input` does, is {100 * cost['second_write_encode_share']:.1f}"
        f" % of the run's CPU. (`python -m bench --only capacity`"
        f"{' --quick' if settings.get('quick') else ''}, {machine.get('date')}, "
        f"{machine.get('cores')} cores, commit {machine.get('commit')}.)"
    )


def forecast_words(figures: dict[str, Any]) -> str:
    """The docs' bullet of the quota forecast: lead time, error, misses, false alarms."""
    smooth = [r for r in figures["ramps"] if not r["whole_devices"]]
    whole = [r for r in figures["ramps"] if r["whole_devices"]]
    leads = [r["lead_min_p50"] for r in smooth if r["lead_min_p50"] is not None]
    rates = ", ".join(f"{100 * r:g}" for r in sorted({r["rate_per_h"] for r in smooth}))
    noises = sorted({r["noise"] for r in smooth})
    worst = max(smooth, key=lambda r: r["abs_error_min_p90"])
    clean = [r["abs_error_min_p90"] for r in smooth if r["noise"] == 0]
    alarms = figures["false_alarms"]
    steps = ", ".join(f"+{r['rate_per_h'] * r['limit']:g} per hour: {r['lead_min_p50']:g} min"
                      for r in whole)  # fmt: skip
    return (
        f"- Forecast on ramps of {rates} % of the limit per hour with {100 * noises[0]:g}-"
        f"{100 * noises[-1]:g} % noise ({smooth[0]['series']} series each): the crunch rule "
        f"fires at a median {min(leads):g}-{max(leads):g} min before exhaustion, "
        f"{sum(r['missed'] for r in smooth)} missed; the forecast's error at that moment (p90) "
        f"is {max(clean):g} min without noise and up to {worst['abs_error_min_p90']:g} min at "
        f"{100 * worst['noise']:g} % noise. Whole-device staircases ({whole[0]['limit']:g}-device "
        f"quota; {steps} ahead). False alarms over {alarms['hours']} h: "
        f"{alarms['flat_false_alarms']} on {alarms['series']} flat "
        f"({100 * alarms['flat_noise']:g} % noise), {alarms['step_false_alarms']} on "
        f"{alarms['series']} stepped quotas."
    )


def fold_words(figures: dict[str, Any]) -> str:
    """The docs' bullet of the fold's cost."""
    fold = figures["fold"]
    return (
        f"- The fold: {fold['fold_rows_per_cpu_s']:,} utilization rows per CPU-second; a publish "
        f"of a {fold['nodes']:,}-node fleet {1000 * fold['publish_cpu_s']:.1f} ms. At the "
        f"embedded runtime's measured rate ({fold['worker_gpu_samples_per_s']:,.0f} GPU "
        f"samples/s, bench/results/throughput.json) the fold would take "
        f"{fold['fold_share_of_worker_at_full_rate']:.0%} of a core more."
    )


def _write_docs(path: Path) -> None:
    body = json.loads(path.read_text())
    figures = body["figures"]
    words = "\n".join([forecast_words(figures), fold_words(figures),
                       stage_cost_words(figures, body["settings"], body["machine"])])
    docs_markers.rewrite_section(ROOT / "docs" / "capacity.md", DOCS_MARKER, words)


def _worker_samples_per_s() -> float | None:
    path = ROOT / "bench" / "results" / "throughput.json"
    if not path.exists():
        return None
    figures = json.loads(Path(path).read_text())["figures"]
    return float(figures["pipeline"]["embedded"]["samples_per_s"])


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(values, q)), 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer series, a smaller fleet")
    args = parser.parse_args(argv)
    series, nodes = (5, 100) if args.quick else (40, 1000)
    scenarios = ramps(series)
    figures = {"ramps": scenarios, "false_alarms": false_alarms(series),
               "fold": fold_cost(nodes), "stage_cost": stage_cost(args.quick)}  # fmt: skip
    path = write_result("capacity", figures, {"quick": args.quick, "series": series,
                                              "nodes": nodes})  # fmt: skip
    print(json.dumps(figures, indent=2))
    print(f"written: {path}")
    _write_docs(path)
    lead = [r["lead_min_p50"] for r in scenarios if r["lead_min_p50"] is not None]
    if lead:
        print(f"median lead time over scenarios: {statistics.median(lead):.0f} min")


if __name__ == "__main__":
    main()
