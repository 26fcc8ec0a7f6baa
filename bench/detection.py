"""Detection quality: FleetPulse against static thresholds, scored on the simulator's truth.

    python -m bench.detection            # writes bench/results/detection.json
    python -m bench.detection --quick    # fewer seeds, shorter runs

Simulated GPU + TPU fleet runs at the fault model's rates with boosted intensity, several
seeds. Each run's events go once through the embedded pipeline and through the static-threshold
baseline (bench/baseline_thresholds.py), and both are scored by pipeline.score against the
ground truth: recall and time to detect per fault class, precision, confounder cordons and
false cordons per 1,000 node-days. Scrapes every 30 s (dcgm-exporter's default collection
interval), which triples the node-days a CPU second buys against 10 s scrapes.

The NAB machine-metric series (../shared/datasets/nab-machine-dev) are scored too, through the
backtest path (`fleetpulse backtest`), beside a static threshold set from each series' first
15 % (NAB's probationary period): mean ± 3 standard deviations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.baseline_thresholds import ThresholdDetector
from bench.common import ROOT, load_average, result_name, write_result
from pipeline import backtest as bt
from pipeline.config import Settings, SimSettings
from pipeline.model import Action, Event, Finding
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.score import ClassScore, Score, score
from pipeline.sim.engine import Simulation

NAB = ROOT.parent / "shared" / "datasets" / "nab-machine-dev"
INTENSITY = 1000.0
INTERVAL_S = 30
PROBATION = 0.15  # NAB: the first 15 % of a series is for learning, not scored by a threshold


def runs(quick: bool) -> tuple[list[int], int]:
    """Seeds and hours per seed."""
    return ([1, 2], 2) if quick else ([1, 2, 3, 4], 6)


def fleet(seed: int, hours: int) -> SimSettings:
    return SimSettings(
        seed=seed, duration_s=hours * 3600, intensity=INTENSITY,
        gpu_interval_s=INTERVAL_S, tpu_interval_s=INTERVAL_S, ici_interval_s=INTERVAL_S,
    )


def one_seed(settings: Settings, sim_settings: SimSettings) -> dict[str, Any]:
    """One simulated run through both detectors; their Scores and the run's size."""
    sim = Simulation(sim_settings)
    actions: list[Action] = []
    findings: list[Finding] = []

    def keep(suffix: str, event: Event) -> None:
        if isinstance(event, Action):
            actions.append(event)
        elif isinstance(event, Finding) and not event.healthy:
            findings.append(event)

    runtime = EmbeddedRuntime(settings, keep)
    baseline = ThresholdDetector()
    pipeline_cpu = baseline_cpu = 0.0
    events = 0
    for tick in sim.ticks():
        events += len(tick)
        started = time.process_time()
        for event in tick:
            runtime.feed(event)
        middle = time.process_time()
        baseline.feed_all(tick)
        pipeline_cpu += middle - started
        baseline_cpu += time.process_time() - middle
    runtime.finish()
    truth = sim.ground_truth
    return {
        "fleetpulse": score(truth, actions, findings, sim.node_days),
        "baseline": score(truth, baseline.actions, baseline.findings, sim.node_days),
        "node_days": sim.node_days, "events": events, "faults": len(truth),
        "cpu_s": {"fleetpulse": round(pipeline_cpu, 2), "baseline": round(baseline_cpu, 2)},
    }


def merge(scores: list[Score]) -> Score:
    """Seeds are separate fleets: add their counts (targets share names across seeds, so the
    runs are scored one by one, never as one)."""
    def add(field: Callable[[Score], dict[str, ClassScore]]) -> dict[str, ClassScore]:
        out: dict[str, ClassScore] = defaultdict(ClassScore)
        for s in scores:
            for key, part in field(s).items():
                out[key].faults += part.faults
                out[key].detected += part.detected
                out[key].delays_ms += part.delays_ms
        return dict(out)

    return Score(
        by_class=add(lambda s: s.by_class), by_type=add(lambda s: s.by_type),
        episodes=sum(s.episodes for s in scores),
        true_episodes=sum(s.true_episodes for s in scores),
        confounder_cordons=sum(s.confounder_cordons for s in scores),
        false_cordons=sum(s.false_cordons for s in scores),
        node_days=sum(s.node_days for s in scores),
    )


def headline(s: Score) -> dict[str, Any]:
    """The figures the goals speak of, plus the 95 % upper bound on the false-cordon rate
    (zero events in N node-days bounds the rate at ~3/N: the run's resolution)."""
    def recall(klass: str) -> float | None:
        part = s.by_class.get(klass)
        return None if part is None or part.recall is None else round(part.recall, 4)

    upper = 1000 * max(s.false_cordons, 3) / s.node_days if s.node_days else None
    rate = s.false_cordons_per_1k_node_days
    return {
        "recall_hard": recall("hard"),
        "recall_gray": recall("gray"),
        "recall_flapping": recall("flapping"),
        "precision": None if s.precision is None else round(s.precision, 4),
        "confounder_cordons": s.confounder_cordons,
        "false_cordons": s.false_cordons,
        "false_cordons_per_1k_node_days": None if rate is None else round(rate, 2),
        "false_cordons_per_1k_node_days_95_upper": None if upper is None else round(upper, 1),
        "node_days": round(s.node_days, 2),
    }


def bench_fleet(quick: bool) -> dict[str, Any]:
    settings = Settings()
    seeds, hours = runs(quick)
    per_seed = [one_seed(settings, fleet(seed, hours)) for seed in seeds]
    out: dict[str, Any] = {}
    for name in ("fleetpulse", "baseline"):
        merged = merge([run[name] for run in per_seed])
        out[name] = {"headline": headline(merged), **merged.summary()}
    out["seeds"] = [
        {"seed": seed, "events": run["events"], "faults": run["faults"],
         "node_days": round(run["node_days"], 2), "cpu_s": run["cpu_s"],
         "fleetpulse": headline(run["fleetpulse"]), "baseline": headline(run["baseline"])}
        for seed, run in zip(seeds, per_seed, strict=True)
    ]
    return out


# --- NAB backtest ----------------------------------------------------------------------------


def threshold_series(name: str, points: list[tuple[int, float]]) -> bt.SeriesResult:
    """Flags when a value leaves mean ± 3 sd of the series' first 15 % (rising edge only)."""
    learn = [v for _, v in points[: max(2, int(len(points) * PROBATION))] if v == v]
    mean, sd = statistics.fmean(learn), statistics.pstdev(learn)
    flags, outside = [], False
    for ts, value in points[len(learn):]:
        now = value == value and abs(value - mean) > 3 * sd
        if now and not outside:
            flags.append(bt.Flag(ts=ts, series=name, check="static_3sd", score=None,
                                 value=value, baseline=mean))
        outside = now
    return bt.SeriesResult(series=name, points=len(points), start_ts=points[0][0],
                           end_ts=points[-1][0], flags=flags)


def bench_nab() -> dict[str, Any]:
    if not (NAB / "windows.json").exists():
        return {"skipped": f"no NAB data at {NAB}"}
    windows = bt.read_windows(NAB / "windows.json")
    params = bt.params_for(Settings().detect)
    ours: list[bt.SeriesResult] = []
    static: list[bt.SeriesResult] = []
    for path in bt.csv_files([NAB]):
        name = str(path.relative_to(NAB))
        points = bt.read_csv_series(path)
        key = bt.lookup(windows, name)
        spans = windows.get(key, []) if key else []
        for results, result in ((ours, bt.run_series(name, points, params)),
                                (static, threshold_series(name, points))):
            bt.score_series(result, spans)
            results.append(result)

    def summary(results: list[bt.SeriesResult]) -> dict[str, Any]:
        s = bt.summarise(results)
        return {"series": s.series, "windows": s.windows, "hits": s.hits,
                "recall": None if s.recall is None else round(s.recall, 3),
                "false_alarms": s.false_alarms,
                "false_alarms_per_week": s.false_alarms_per_week,
                "delay_median_s": s.delay_median_s}

    return {"fleetpulse": summary(ours), "baseline_static_3sd": summary(static)}


def run(quick: bool) -> dict[str, Any]:
    seeds, hours = runs(quick)
    figures = {"fleet": bench_fleet(quick), "nab": bench_nab()}
    settings = {"quick": quick, "seeds": seeds, "hours_per_seed": hours,
                "intensity": INTENSITY, "interval_s": INTERVAL_S,
                "fleet": "64 GPU nodes (512 GPUs) + 4 TPU slices (30 hosts), SimSettings "
                         "defaults otherwise", "load_average": load_average()}
    path = write_result(result_name("detection", quick), figures, settings)
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer seeds, shorter runs")
    result = run(parser.parse_args().quick)
    fleet_figures = result["figures"]["fleet"]
    print(json.dumps({k: fleet_figures[k]["headline"] for k in ("fleetpulse", "baseline")},
                     indent=1))
    print(json.dumps(result["figures"]["nab"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
