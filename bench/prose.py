"""The README's paragraphs of measured figures, written from the result files like the table.

Two sections, each between its own markers: "Where the time goes" (`bench-time`: the profile's
shares, the throughput ratios, the worker.take trade-off) and the detection results in words
(`bench-detection`: per-type counts, the goals, NAB). Every figure comes from a result file
in bench/results; where a file (or one figure in it) is missing, the sentence says it was not
measured in this checkout rather than keep a figure from an older run.

Pure: `sections(results)` maps a section name to its Markdown, from already-loaded results
(benchmark name -> the parsed JSON file, or None when the file is missing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipeline.sim.faults import FAULT_TYPES

Results = Mapping[str, "dict[str, Any] | None"]

NOT_MEASURED = "not measured in this checkout"
# what each section reads: one place, so bench/summary.py loads exactly these
NEEDS = ("throughput", "profile", "latency", "latency-take", "detection")
# the fabric and fail-slow types of issue 12, in the order the README lists them
SHOWN_TYPES = {
    "F1": "switch and cable failures",
    "F2": "link flapping",
    "F3": "silent link loss",
    "N1": "NIC failures",
    "S1": "fail-slow nodes",
    "G3": "PCIe degradation",
}
FABRIC_GOAL_TYPES = ("F1", "F3", "N1")  # the fabric goal is on these together
# (label, headline key, goal, met when the figure is at least the goal)
RECALL_GOALS = (
    ("hard", "recall_hard", 0.99),
    ("gray", "recall_gray", 0.9),
    ("flapping", "recall_flapping", 0.8),
)
PRECISION_GOAL = 0.95
FABRIC_GOAL = 0.9
NAB_RECALL_GOAL, NAB_ALARMS_GOAL = 0.85, 1.3
# classes a fault type is scored in (a code may span two: G2 is hard when fatal, else flapping)
SCORED = ("hard", "gray", "flapping")


def _classes() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for t in FAULT_TYPES:
        if t.klass in SCORED and t.klass not in found.get(t.code, ()):
            found[t.code] = (*found.get(t.code, ()), t.klass)
    return found


CLASSES = _classes()


def _get(tree: Any, *path: str) -> Any:
    """The value at `path` in nested dicts, or None where any step is missing."""
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _figures(results: Results, name: str) -> dict[str, Any] | None:
    figures = _get(results.get(name), "figures")
    return figures if isinstance(figures, dict) else None


def _when(results: Results, name: str) -> str:
    """Where a figure comes from: the result file, its date and commit."""
    m = _get(results.get(name), "machine") or {}
    return f"`{name}.json`, {m.get('date', '?')}, commit {m.get('commit', '?')}"


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def _shares(shares: Mapping[str, float]) -> str:
    """Largest first; shares under 1 % are left out (they would read as 0 %). Semicolons:
    the profile's component names hold commas."""
    ordered = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(f"{k} {_pct(v)}" for k, v in ordered if v >= 0.01)


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _x(x: float) -> str:
    return f"{x:.3g}×"


def _s(x: float) -> str:
    return f"{x:.2f} s"


# --- Where the time goes -----------------------------------------------------------------------


def embedded_bullet(results: Results) -> str:
    tp, prof = _figures(results, "throughput"), _figures(results, "profile")
    emb = _get(tp, "pipeline", "embedded")
    speed = (f"{_n(emb['samples_per_core_s'])} samples/s per core (median of "
             f"{len(emb['runs_cpu_s'])} runs; {_when(results, 'throughput')})"
             if emb else f"throughput {NOT_MEASURED}")
    stages = _get(prof, "embedded", "stage_share_of_busy")
    share = (f"Shares of busy time by stage ({_when(results, 'profile')}): {_shares(stages)} "
             "(`other` is the driver: door clocks, keys, ticks, routing)"
             if stages else f"Shares of busy time by stage: {NOT_MEASURED}")
    rolling = _get(prof, "embedded", "rolling_stats_share_of_busy")
    rolling_text = _pct(rolling) if rolling is not None else NOT_MEASURED
    return (f"- **Embedded runtime**: {speed}. {share}. The rolling statistics "
            f"(`pipeline/detect/stats.py`, inside the detectors): {rolling_text}. "
            f"{_memory(tp)}")


def _memory(tp: dict[str, Any] | None) -> str:
    points = [p for p in (_get(tp, "scale") or []) if "error" not in p]
    if not points:
        return f"Memory held per device: {NOT_MEASURED}."
    state = [p["state_bytes_per_device"] for p in points]
    rss = [p["rss_bytes_per_device"] for p in points]
    sizes = f"{_n(points[0]['gpus'])} to {_n(points[-1]['gpus'])} GPUs"
    return (f"Memory held per device, {sizes}: {_n(min(state))}–{_n(max(state))} B as table "
            f"state, {_n(min(rss))}–{_n(max(rss))} B of RSS growth.")


def worker_bullet(results: Results) -> str:
    tp, prof = _figures(results, "throughput"), _figures(results, "profile")
    ratio = _get(tp, "pipeline", "ratios", "kafka_pipeline_vs_embedded_per_core")
    rate = (f"{_x(ratio)} the embedded runtime's rate per core (same run)"
            if ratio is not None else f"rate against the embedded runtime {NOT_MEASURED}")
    parts = _get(prof, "worker", "component_share_of_busy")
    if parts:
        framework = sum(v for k, v in parts.items()
                        if k in ("faust + mode", "asyncio", "aiokafka"))
        tables = _get(prof, "worker", "stage_share_of_busy", "state_tables")
        busy = (f"Busy time by component ({_when(results, 'profile')}): {_shares(parts)}. "
                f"faust, asyncio and aiokafka together: {_pct(framework)}"
                + (f", the state tables (load, store, encode) {_pct(tables)}"
                   if tables is not None else ""))
    else:
        busy = f"Busy time by component: {NOT_MEASURED}"
    return f"- **Kafka worker**: {rate}. {busy}. {_take(results)}"


def _take(results: Results) -> str:
    gain = _get(_figures(results, "throughput"), "pipeline", "ratios",
                "kafka_pipeline_take_vs_per_record_per_core")
    one = _get(_figures(results, "latency"), "fault_to_action_s", "p99")
    batched = _get(_figures(results, "latency-take"), "fault_to_action_s", "p99")
    speed = (f"{_x(gain)} the one-at-a-time throughput per core" if gain is not None
             else f"throughput {NOT_MEASURED}")
    if one is None or batched is None:
        tail = f"fatal XID → action p99 against one at a time {NOT_MEASURED}"
    else:
        tail = (f"fatal XID → action p99 {_s(batched)} against {_s(one)} one at a time "
                f"({_when(results, 'latency-take')}; {_when(results, 'latency')})")
    producer = _get(_figures(results, "throughput"), "pipeline", "ratios",
                    "kafka_pipeline_producer_batched_vs_per_record_per_core")
    records = _get(_figures(results, "throughput"), "pipeline",
                   "kafka_pipeline_producer_batched", "records_in")
    batches = ("" if producer is None or records is None else
               f" Telemetry batched by the producer (a record per partition and scrape, "
               f"{_n(records)} records for the same samples): {_x(producer)} the "
               f"one-at-a-time throughput per core.")
    return f"Batching the telemetry stage (`worker.take`): {speed}; {tail}.{batches}"


def limit_bullet(results: Results) -> str:
    p = _get(_figures(results, "throughput"), "pipeline")
    limit = _get(p, "limit", "samples_per_core_s")
    if limit is None:
        why = f" (skipped: {p['kafka_skipped']})" if p and "kafka_skipped" in p else ""
        return f"- **The raw-consume limit**: {NOT_MEASURED}{why}."
    r = p.get("ratios", {})
    against = [f"{what} {_x(r[key])}" for what, key in (
        ("decoding alone (msgpack, the producers' default)", "decode_vs_limit_per_core"),
        ("the embedded runtime", "embedded_vs_limit_per_core"),
        ("the worker", "kafka_pipeline_vs_limit_per_core")) if key in r]
    return (f"- **The raw-consume limit** (aiokafka consuming, no work): "
            f"{limit / 1e6:.2f} M samples/s per core. Against it, per core: "
            f"{', '.join(against)}.")


def time_goes(results: Results) -> str:
    return "\n".join(_guarded(b, results) for b in (embedded_bullet, worker_bullet, limit_bullet))


# --- Detection ---------------------------------------------------------------------------------


def _found(part: Mapping[str, Any] | None) -> str:
    return f"{part['found']}/{part['faults']}" if part else "0/0"


def _acted(part: Mapping[str, Any]) -> str:
    """Acted and withheld (with the rules that held back), for faults expecting an action."""
    if not part.get("action_faults"):
        return ""
    rules = ", ".join(f"{k} {v}" for k, v in sorted(part.get("withheld_rules", {}).items()))
    return (f" ({part['acted']} acted, {part['withheld']} withheld"
            + (f": {rules}" if rules else "") + ")")


def intensity_paragraph(fig: Mapping[str, Any]) -> str:
    runs = []
    for run in fig["fleet"].get("by_intensity", {}).values():
        hard = _get(run, "fleetpulse", "by_class", "hard")
        if hard:
            runs.append(f"× {run['intensity']:g}: found {_found(hard)}, acted {hard['acted']}, withheld "
                        f"{hard['withheld']}")
    if not runs:
        return f"Hard faults by intensity: {NOT_MEASURED}."
    return ("Hard faults found, acted on and withheld by the policy's caps and budget, by fault "
            f"intensity: {'; '.join(runs)}. The caps are what keeps a pool serving at fault "
            "rates far above a real fleet's, so acted falls below found as the rate rises.")


def types_paragraph(fig: Mapping[str, Any]) -> str:
    fleet = fig["fleet"]
    ours, theirs = fleet["fleetpulse"]["by_type"], fleet["baseline"]["by_type"]
    listed = [f"{title} ({code}) {_found(ours[code])}{_acted(ours[code])} against "
              f"{_found(theirs.get(code))}"
              for code, title in SHOWN_TYPES.items() if code in ours]
    head = (f"At × {fleet['intensity']:g} over {len(fleet.get('seeds', []))} seeds, found by "
            "FleetPulse against the baseline: ")
    return head + (", ".join(listed) if listed else NOT_MEASURED) + "."


def goals_paragraph(fig: Mapping[str, Any]) -> str:
    fp = fig["fleet"]["fleetpulse"]
    h = fp["headline"]
    met: list[str] = []
    missed: list[str] = []
    for label, key, goal in RECALL_GOALS:
        part = fp["by_class"].get(label)
        if h.get(key) is None or part is None:
            continue
        text = f"{label} recall {h[key]:.3f} ({_found(part)}, goal ≥ {goal:g})"
        (met if h[key] >= goal else missed).append(text)
    fabric = [fp["by_type"][c] for c in FABRIC_GOAL_TYPES if c in fp["by_type"]]
    faults = sum(p["faults"] for p in fabric)
    if faults:
        found = sum(p["found"] for p in fabric)
        named = sum(p.get("named", 0) for p in fabric)  # the element that failed, named
        text = (f"fabric {'/'.join(FABRIC_GOAL_TYPES)} found {found}/{faults}, the failed "
                f"switch, link or NIC named {named}/{faults} (goal ≥ {FABRIC_GOAL:g} named)")
        (met if named >= FABRIC_GOAL * faults else missed).append(text)
    if h.get("precision") is not None:
        text = f"precision {h['precision']:.3f} (goal ≥ {PRECISION_GOAL:g})"
        (met if h["precision"] >= PRECISION_GOAL else missed).append(text)
    text = f"{h['confounder_cordons']} cordons caused by confounders (goal 0)"
    (met if h["confounder_cordons"] == 0 else missed).append(text)
    # acted + withheld must cover every action-fault found
    idle = sum(part.get("found_not_acted", 0) for part in fp["by_class"].values())
    text = f"{idle} action-faults found but neither acted on nor withheld (goal 0)"
    (met if idle == 0 else missed).append(text)
    return (f"Against the goals, met: {'; '.join(met) or 'none'}. Not met: "
            f"{'; '.join(missed) or 'none'}. {misses_sentence(fp['by_type'])}")


def misses_sentence(by_type: Mapping[str, Mapping[str, Any]]) -> str:
    """Misses per type, grouped by the class(es) the fault model gives each type, and faults
    found but neither acted on nor withheld."""
    groups: dict[str, list[str]] = {}
    for code, part in sorted(by_type.items(), key=lambda kv: (-kv[1]["missed"], kv[0])):
        if part["missed"]:
            klass = " or ".join(CLASSES.get(code, ("unclassified",)))
            groups.setdefault(klass, []).append(f"{code} {part['missed']}")
    misses = "; ".join(f"{k}: {', '.join(v)}" for k, v in groups.items()) or "none"
    idle = ", ".join(f"{code} {part['found_not_acted']}"
                     for code, part in sorted(by_type.items()) if part.get("found_not_acted"))
    return (f"Misses by type: {misses}. Found but neither acted on nor withheld (not escalated "
            f"within the run): {idle or 'none'}.")


def nab_paragraph(fig: Mapping[str, Any]) -> str:
    nab = fig.get("nab", {})
    ours = nab.get("fleetpulse")
    if not ours:
        return f"NAB machine series: {NOT_MEASURED}."
    per_series = nab.get("per_series", {})
    weeks = sum(s["weeks"] for s in per_series.values())
    size = (f"{ours['series']} series, {ours['windows']} windows"
            + (f", {weeks:.0f} series-weeks" if per_series else ""))
    needed = math.ceil(NAB_RECALL_GOAL * ours["windows"] - 1e-9)
    if ours["recall"] >= NAB_RECALL_GOAL and ours["false_alarms_per_week"] <= NAB_ALARMS_GOAL:
        verdict = "met"
    elif ours["false_alarms_per_week"] <= NAB_ALARMS_GOAL:
        short = needed - ours["hits"]
        verdict = f"missed by {short} window{'s' if short != 1 else ''}"
    else:
        verdict = "missed (too many false alarms)"
    unfound = ", ".join(f"{name.rsplit('/', 1)[-1].removesuffix('.csv')} {s['windows'] - s['hits']} "
                        f"of {s['windows']}" for name, s in sorted(per_series.items())
                        if s["hits"] < s["windows"])
    loo = _get(nab, "leave_one_out", "fleetpulse")
    loo_text = (f"{loo['recall']:.3f} ({loo['hits']}/{loo['windows']}) at "
                f"{loo['false_alarms_per_week']:.2f} false alarms/week" if loo else NOT_MEASURED)
    return (f"NAB machine series ({size}), default sensitivity {nab.get('sensitivity', '?')}: "
            f"{ours['hits']}/{ours['windows']} windows found = {ours['recall']:.3f} at "
            f"{ours['false_alarms_per_week']:.2f} false alarms per series-week; the goal (recall "
            f"≥ {NAB_RECALL_GOAL:g} at ≤ {NAB_ALARMS_GOAL:g}) is {verdict}. Windows not found, "
            f"by series: {unfound or 'none'}. Leave one series out: {loo_text}.")


def detection_text(results: Results) -> str:
    fig = _figures(results, "detection")
    if fig is None:
        return f"Detection results: {NOT_MEASURED} (no bench/results/detection.json)."
    head = f"From {_when(results, 'detection')}."
    paragraphs = (intensity_paragraph, types_paragraph, goals_paragraph, nab_paragraph)
    return "\n\n".join([head, *(_guarded(p, fig) for p in paragraphs)])


# --- the sections -------------------------------------------------------------------------------


def _guarded(build: Callable[[Any], str], arg: Any) -> str:
    """One part's text, or a line saying its result file could not be read (a renamed field
    must show in the README, not stop the table from being written)."""
    try:
        return build(arg)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return f"{build.__name__}: result file unreadable ({exc!r})."


SECTIONS: dict[str, Callable[[Results], str]] = {
    "bench-time": time_goes,
    "bench-detection": detection_text,
}


def sections(results: Results, names: Iterable[str] = SECTIONS) -> dict[str, str]:
    return {name: SECTIONS[name](results) for name in names}
