"""Detection quality: FleetPulse against static thresholds, scored on the simulator's truth.

    python -m bench.detection            # writes bench/results/detection.json
    python -m bench.detection --quick    # fewer seeds, shorter runs
    python -m bench.detection --only nab # one part; the other keeps its last figures

Simulated GPU + TPU fleet runs at the fault model's rates × 10, × 100 and × 1000, several seeds
each; faults begin in the first hours of a run, then a quiet tail (TAIL_S, 4.5 h) lets the
pipeline finish deciding about the last of them. Each run's events go once through the embedded pipeline and through the static-threshold
baseline (bench/baseline_thresholds.py), and both are scored by pipeline.backtest.score against the
ground truth, by class and by type: found / acted / withheld (with the rule) / missed, time to
detect, precision, confounder cordons and false cordons per 1,000 node-days with its 95 %
bound. The table is printed and written beside the JSON (bench/results/detection.md). Scrapes every 30 s (dcgm-exporter's default collection
interval), which triples the node-days a CPU second buys against 10 s scrapes.

The NAB machine-metric series (../shared/datasets/nab-machine-dev) are scored too, through the
backtest path (`fleetpulse backtest`), beside a static threshold set from each series' first
15 % (NAB's probationary period): mean ± 3 standard deviations. Then FleetPulse's series
detector, a rolling z-score (288 samples) and an EWMA (alpha 0.02) are swept over their
thresholds and compared at matched false alarms per series-week (pipeline/backtest/sweep.py),
with two generalisation checks: threshold picked on half the series and scored on the other
half, and leave one series out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baseline_thresholds import ThresholdDetector
from bench.common import RESULTS, ROOT, load_average, result_name, write_result
from pipeline.backtest import run as bt
from pipeline.backtest import sweep as sw
from pipeline.backtest.score import POLICY_OUTPUTS, ClassScore, HeldLog, Score, score
from pipeline.config import Settings, SimSettings
from pipeline.model import Action, Event, Finding
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation

NAB = ROOT.parent / "shared" / "datasets" / "nab-machine-dev"
INTENSITIES = (10.0, 100.0, 1000.0)  # fault-model rates times this
HEADLINE_INTENSITY = 1000.0  # the README's goal rows
INTERVAL_S = 30
NAB_BUDGET = 1.3  # false alarms per series-week the goal allows
PROBATION = 0.15  # NAB: the first 15 % of a series is for learning, not scored by a threshold
DETECTORS = ("fleetpulse", "baseline")
FABRIC_TYPES = ("F1", "F3", "N1")  # the fabric goal
# After the hours in which faults begin, a tail without new ones: a fault found near the end
# would otherwise be scored "found, not acted" only because the run stopped before its rule
# came due. The slowest rule is XID recurrence: a GPU is blamed at a job's fourth application
# strike (or the third job's), and a G4's strikes come 15-90 min apart (pipeline/sim/
# signatures_gpu.py), so up to 4.5 h after onset. With a 1 h tail, 5 G4s at x1000 ended the
# run found (on their first strikes) and not yet blamed, which says nothing about the policy.
TAIL_S = 4 * 3600 + 1800


def runs(quick: bool) -> tuple[list[int], int]:
    """Seeds and hours per seed (at each intensity)."""
    return ([1, 2], 2) if quick else ([1, 2, 3, 4], 6)


def fleet(seed: int, hours: int, intensity: float = HEADLINE_INTENSITY) -> SimSettings:
    """`hours` in which faults begin, then a quiet tail (TAIL_S)."""
    return SimSettings(
        seed=seed, duration_s=hours * 3600 + TAIL_S, faults_for_s=hours * 3600,
        intensity=intensity,
        gpu_interval_s=INTERVAL_S, tpu_interval_s=INTERVAL_S, ici_interval_s=INTERVAL_S,
    )


def one_seed(settings: Settings, sim_settings: SimSettings) -> dict[str, Any]:
    """One simulated run through both detectors; their Scores and the run's size. The
    proposals FleetPulse's policy withholds are read from its state whenever it may have
    changed (the baseline has no policy: it withholds nothing)."""
    sim = Simulation(sim_settings)
    actions: list[Action] = []
    findings: list[Finding] = []
    held = HeldLog()
    dirty = [False]

    def keep(suffix: str, event: Event) -> None:
        dirty[0] = dirty[0] or suffix in POLICY_OUTPUTS
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
            if dirty[0]:
                held.note_policy(runtime.policy.values())
                dirty[0] = False
        middle = time.process_time()
        baseline.feed_all(tick)
        pipeline_cpu += middle - started
        baseline_cpu += time.process_time() - middle
    runtime.finish()
    truth = sim.ground_truth
    return {
        "fleetpulse": score(truth, actions, findings, sim.node_days, held=held.held()),
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
                out[key].add(part)
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
    """The figures the goals speak of (recall is of found), plus the 95 % upper bound on the
    false-cordon rate (zero events in N node-days bounds the rate at ~3/N: the run's
    resolution)."""
    def recall(klass: str) -> float | None:
        part = s.by_class.get(klass)
        return None if part is None or part.recall is None else round(part.recall, 4)

    fabric = [s.by_type[t] for t in FABRIC_TYPES if t in s.by_type]
    fabric_faults = sum(p.faults for p in fabric)
    upper = 1000 * max(s.false_cordons, 3) / s.node_days if s.node_days else None
    rate = s.false_cordons_per_1k_node_days
    return {
        "recall_hard": recall("hard"),
        "recall_gray": recall("gray"),
        "recall_flapping": recall("flapping"),
        # the fabric goal: found, and the finding names the switch / link / node that failed
        "recall_fabric": round(sum(p.found for p in fabric) / fabric_faults, 4)
        if fabric_faults else None,
        "named_fabric": round(sum(p.named for p in fabric) / fabric_faults, 4)
        if fabric_faults else None,
        "precision": None if s.precision is None else round(s.precision, 4),
        "confounder_cordons": s.confounder_cordons,
        "false_cordons": s.false_cordons,
        "false_cordons_per_1k_node_days": None if rate is None else round(rate, 2),
        "false_cordons_per_1k_node_days_95_upper": None if upper is None else round(upper, 1),
        "node_days": round(s.node_days, 2),
    }


def bench_intensity(settings: Settings, intensity: float, quick: bool) -> dict[str, Any]:
    seeds, hours = runs(quick)
    per_seed = [one_seed(settings, fleet(seed, hours, intensity)) for seed in seeds]
    out: dict[str, Any] = {"intensity": intensity}
    for name in DETECTORS:
        merged = merge([run[name] for run in per_seed])
        out[name] = {"headline": headline(merged), **merged.summary()}
    out["seeds"] = [
        {"seed": seed, "events": run["events"], "faults": run["faults"],
         "node_days": round(run["node_days"], 2), "cpu_s": run["cpu_s"],
         "fleetpulse": headline(run["fleetpulse"]), "baseline": headline(run["baseline"])}
        for seed, run in zip(seeds, per_seed, strict=True)
    ]
    return out


def bench_fleet(quick: bool) -> dict[str, Any]:
    """Every intensity; `fleet` keeps the headline intensity's figures where the README's goal
    rows read them, `by_intensity` has all of them (keyed "x10", "x100", ...)."""
    settings = Settings()
    by_intensity = {f"x{i:g}": bench_intensity(settings, i, quick) for i in INTENSITIES}
    return {**by_intensity[f"x{HEADLINE_INTENSITY:g}"], "by_intensity": by_intensity}


COLUMNS = ("faults", "found", "acted", "withheld", "missed", "found, not acted",
           "element named", "detect p50 / p95")


def _row(name: str, part: dict[str, Any]) -> list[str]:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:,.0f} s"

    rules = ", ".join(f"{k} {v}" for k, v in part["withheld_rules"].items())
    withheld = f"{part['withheld']}" + (f" ({rules})" if rules else "")
    actions = f"{part['acted']}/{part['action_faults']}" if part["action_faults"] else "-"
    elements = part.get("element_faults", 0)
    named = f"{part['named']}/{elements}" if elements else "-"
    return [name, str(part["faults"]), str(part["found"]), actions, withheld,
            str(part["missed"]), str(part["found_not_acted"]), named,
            f"{s(part['median_delay_s'])} / {s(part['p95_delay_s'])}"]


def table(fleet_figures: dict[str, Any]) -> str:
    """Markdown: per intensity and detector, found / acted / withheld / missed by class and by
    type, then precision, confounder cordons and the false-cordon rate with its 95 % bound."""
    lines = []
    for key, part in fleet_figures["by_intensity"].items():
        for name in DETECTORS:
            fig, h = part[name], part[name]["headline"]
            lines += [
                f"#### {name}, fault rates {key}",
                "",
                f"precision {_fmt(h['precision'])} ({fig['episodes']} removal episodes), "
                f"confounder cordons {h['confounder_cordons']}, false cordons "
                f"{h['false_cordons']} = {_fmt(h['false_cordons_per_1k_node_days'])} per "
                f"1,000 node-days (95 % bound {_fmt(h['false_cordons_per_1k_node_days_95_upper'])}"
                f", {h['node_days']} node-days)",
                "",
                "| class / type | " + " | ".join(COLUMNS) + " |",
                "|---" * (len(COLUMNS) + 1) + "|",
            ]
            for group in ("by_class", "by_type"):
                for label, bucket in fig[group].items():
                    lines.append("| " + " | ".join(_row(label, bucket)) + " |")
            lines.append("")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


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


def bench_nab(nab: Path = NAB) -> dict[str, Any]:
    """FleetPulse's series detector at its default sensitivity beside the static threshold, then
    FleetPulse, the rolling z-score and the EWMA swept over their thresholds and compared at
    matched false-alarm rates, with the split-half and leave-one-out checks."""
    if not (nab / "windows.json").exists():
        return {"skipped": f"no NAB data at {nab}"}
    windows = bt.read_windows(nab / "windows.json")
    params = bt.params_for(Settings().detect)
    ours: list[bt.SeriesResult] = []
    static: list[bt.SeriesResult] = []
    data: list[sw.Series] = []
    for path in bt.csv_files([nab]):
        name = str(path.relative_to(nab))
        points = bt.read_csv_series(path)
        key = bt.lookup(windows, name)
        spans = windows.get(key, []) if key else []
        data.append(sw.Series(name, points, spans))
        for results, result in ((ours, bt.run_series(name, points, params)),
                                (static, threshold_series(name, points))):
            bt.score_series(result, spans)
            results.append(result)
    swept = sw.sweep(data, params)
    split = sw.halves([s.name for s in data])
    return {
        "fleetpulse": _nab_summary(ours),
        "baseline_static_3sd": _nab_summary(static),
        "sensitivity": params.sensitivity,
        "at_stated_thresholds": {
            "fleetpulse": sw.point(sw.at_threshold(swept["fleetpulse"], params.sensitivity)),
            "zscore": sw.point(sw.at_threshold(swept["zscore"], 4.0)),
            "ewma": sw.point(sw.at_threshold(swept["ewma"], 5.0)),
        },
        "matched": sw.matched(swept),
        "default_on_halves": [
            sw.point(sw.at_threshold(swept["fleetpulse"], params.sensitivity), half)
            for half in split
        ],
        "split_check": sw.split_check(swept, split, NAB_BUDGET),
        "leave_one_out": sw.leave_one_out(swept, NAB_BUDGET),
        "curves": {d: sw.curve(runs) for d, runs in swept.items()},
        "per_series": {
            r.series: {"windows": len(r.windows), "hits": sum(h is not None for h in r.hits),
                       "false_alarms": r.false_alarms, "weeks": round(r.weeks, 2)}
            for r in ours
        },
    }


def _nab_summary(results: list[bt.SeriesResult]) -> dict[str, Any]:
    s = bt.summarise(results)
    return {"series": s.series, "windows": s.windows, "hits": s.hits,
            "recall": None if s.recall is None else round(s.recall, 3),
            "false_alarms": s.false_alarms,
            "false_alarms_per_week": s.false_alarms_per_week,
            "delay_median_s": s.delay_median_s}


PARTS = ("fleet", "nab")


def run(quick: bool, parts: tuple[str, ...] = PARTS, nab: Path = NAB) -> dict[str, Any]:
    """`parts` picks what to run; the others keep their figures from the last result file."""
    seeds, hours = runs(quick)
    name = result_name("detection", quick)
    last = RESULTS / f"{name}.json"
    figures = json.loads(last.read_text())["figures"] if last.exists() else {}
    if "fleet" in parts:
        figures["fleet"] = bench_fleet(quick)
    if "nab" in parts:
        figures["nab"] = bench_nab(nab)
    settings = {"quick": quick, "seeds": seeds, "hours_per_seed": hours,
                "intensities": list(INTENSITIES), "headline_intensity": HEADLINE_INTENSITY,
                "interval_s": INTERVAL_S,
                "fleet": "64 GPU nodes (512 GPUs) + 4 TPU slices (30 hosts), SimSettings "
                         "defaults otherwise", "load_average": load_average()}
    path = write_result(name, figures, settings)
    path.with_suffix(".md").write_text(table(figures["fleet"]) + "\n")
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer seeds, shorter runs")
    parser.add_argument("--only", choices=PARTS, help="run one part; the other keeps its "
                        "figures from the last result file")
    parser.add_argument("--nab-dir", type=Path, default=NAB,
                        help=f"the NAB development series (default {NAB})")
    args = parser.parse_args()
    result = run(args.quick, (args.only,) if args.only else PARTS, args.nab_dir)
    print(table(result["figures"]["fleet"]))
    nab = result["figures"].get("nab")  # absent: --only fleet with no earlier NAB figures
    if nab is not None:
        print(json.dumps({k: nab.get(k) for k in ("fleetpulse", "baseline_static_3sd",
                                                  "matched", "leave_one_out")}, indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
