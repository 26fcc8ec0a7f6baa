"""The one table: rows built from the result files in bench/results, printed and as Markdown
(bench/results/summary.md, and the README's "Latest results" between its `bench` markers;
the README's paragraphs of figures are bench/prose.py's, written from the same files).

The table is rebuilt from the JSON files, not from memory, so `--only NAME` refreshes one
benchmark's rows and keeps the others' last figures (each row group names its run's date).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import prose
from bench.common import RESULTS, result_name
from pipeline import docs_markers


@dataclass(frozen=True)
class Row:
    bench: str
    figure: str
    value: str
    baseline: str = ""
    ratio: str = ""
    goal: str = ""
    met: bool | None = None


README = Path(__file__).resolve().parent.parent / "README.md"
README_MARKER = "bench"  # the section between <!-- bench:start --> and <!-- bench:end -->
WITHOUT_QUICK = frozenset({"sim", "remediation"})  # one result file whatever the mode
COLUMNS = ("benchmark", "figure", "value", "baseline (same run)", "ratio", "goal", "met")


def _n(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def _x(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}×"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1000 * s:,.0f} ms"


def _s(s: float | None) -> str:
    return "n/a" if s is None else f"{s:,.0f} s"


def throughput_rows(f: dict[str, Any]) -> list[Row]:
    p, rows = f["pipeline"], []
    name = "throughput"
    if "limit" not in p:
        rows.append(Row(name, "Kafka parts", f"skipped: {p.get('kafka_skipped', '?')}"))
    else:
        lim = p["limit"]["samples_per_core_s"]
        r = p["ratios"]
        rows += [
            Row(name, "limit: aiokafka consuming, no work",
                f"{_n(lim)} samples/s/core ({_n(p['limit']['records_per_s'])} rec/s)",
                ratio="1×"),
            Row(name, "limit + decode (codec only)",
                f"{_n(p['limit_decode']['samples_per_core_s'])} samples/s/core", _n(lim),
                _x(r["decode_vs_limit_per_core"])),
            Row(name, "Kafka pipeline: fleetpulse worker",
                f"{_n(p['kafka_pipeline']['samples_per_core_s'])} samples/s/core "
                f"({_n(p['kafka_pipeline']['records_per_s'])} rec/s wall)", _n(lim),
                _x(r["kafka_pipeline_vs_limit_per_core"]), "≥ 0.25× limit",
                r["kafka_pipeline_vs_limit_per_core"] >= 0.25),
        ]
    if "kafka_pipeline_take" in p:
        rows += take_rows(p)
    emb = p["embedded"]["samples_per_core_s"]
    lim_text = _n(p["limit"]["samples_per_core_s"]) if "limit" in p else ""
    rows.append(Row(name, "embedded runtime (decode + pipeline, no Kafka)",
                    f"{_n(emb)} samples/s/core", lim_text,
                    _x(p.get("ratios", {}).get("embedded_vs_limit_per_core")),
                    "≥ 2,000,000/core", emb >= 2_000_000))
    first = next((pt for pt in f["scale"] if "error" not in pt), None)
    for pt in f["scale"]:
        label = f"scale: embedded, healthy fleet, events in (no decode), {pt['gpus'] // 1000}k GPUs"
        if "error" in pt:
            rows.append(Row(name, label, f"failed: {pt['error']}"))
            continue
        rows.append(Row(
            name, label + f" + {_n(pt['tpu_chips'])} TPU chips",
            f"{_n(pt['samples_per_core_s'])} samples/s/core; {_n(pt['rss_bytes_per_device'])} "
            f"B/device RSS ({_n(pt['state_bytes_per_device'])} B as table state)",
            f"{_n(first['samples_per_core_s'])} at 1k" if first else "",
            _x(pt["samples_per_core_s"] / first["samples_per_core_s"]) if first else "",
            "state ≤ 1,500 B/device", pt["state_bytes_per_device"] <= 1_500))
    return rows


def _batched(background: dict[str, Any]) -> str:
    """How the latency benchmark's background was written (runs before 12-05 sent a record per
    sample; they have no `values_sent`)."""
    return " in producer batches" if "values_sent" in background else ""


def take_rows(p: dict[str, Any]) -> list[Row]:
    """The worker with `worker.take` (batches from faust) and on producer-batched telemetry,
    beside the one-at-a-time default."""
    lim, take, r = p["limit"]["samples_per_core_s"], p["kafka_pipeline_take"], p["ratios"]
    rows = [
        Row("throughput", f"Kafka pipeline: fleetpulse worker, worker.take = {take['take']}",
            f"{_n(take['samples_per_core_s'])} samples/s/core "
            f"({_n(take['records_per_s'])} rec/s wall)", _n(lim),
            _x(r["kafka_pipeline_take_vs_limit_per_core"])),
    ]
    against = [r["kafka_pipeline_vs_embedded_per_core"],
               r["kafka_pipeline_take_vs_embedded_per_core"]]
    label = "one at a time / take"
    batched = p.get("kafka_pipeline_producer_batched")
    if batched is not None and "kafka_pipeline_producer_batched_vs_limit_per_core" in r:
        rows.append(Row(
            "throughput", "Kafka pipeline: fleetpulse worker, telemetry batched by the producer "
            "(a record per partition and scrape, as FleetPulse's producers write it by default)",
            f"{_n(batched['samples_per_core_s'])} samples/s/core "
            f"({_n(batched['records_in'])} records in)", _n(lim),
            _x(r["kafka_pipeline_producer_batched_vs_limit_per_core"]), "≥ 0.25× limit",
            r["kafka_pipeline_producer_batched_vs_limit_per_core"] >= 0.25))
        against.append(r["kafka_pipeline_producer_batched_vs_embedded_per_core"])
        label += " / producer batches"
    rows.append(Row("throughput", f"worker per core against the embedded runtime: {label}",
                    " / ".join(_x(a) for a in against), _n(p["embedded"]["samples_per_core_s"]),
                    goal="≥ 0.8×", met=max(against) >= 0.8))
    same = r.get("kafka_pipeline_producer_batched_vs_embedded_batched_per_core")
    if same is not None:  # both runtimes driving the same batch records through Stage.items
        rows.append(Row(
            "throughput", "worker per core against the embedded runtime fed the same batch "
            "records (EmbeddedRuntime.feed_batch)", _x(same),
            _n(p["embedded_batched"]["samples_per_core_s"]), goal="≥ 0.6×", met=same >= 0.6))
    return rows


def latency_rows(f: dict[str, Any], name: str = "latency") -> list[Row]:
    if "take" in f:
        name = f"latency, worker.take = {f['take']}"
    if "skipped" in f:
        return [Row(name, "fault → action", f"skipped: {f['skipped']}")]
    q, d, bg = f["fault_to_action_s"], f["broker_delivery_s"], f["background"]
    return [
        Row(name, f"fatal XID → action, p50 / p99 / max ({f['actions']}/{f['faults']} acted)",
            f"{_ms(q['p50'])} / {_ms(q['p99'])} / {_ms(q['max'])}",
            f"broker delivery p99 {_ms(d['p99'])}", _x(f["p99_vs_broker_delivery"]),
            "p99 < 1 s", q["p99"] is not None and q["p99"] < 1.0 and not f["missing"]),
        Row(name, "background load on the worker",
            f"{_n(bg['gpus'])} GPUs + {_n(bg['tpu_chips'])} TPU chips, {_n(bg['samples_per_s'])} "
            f"samples/s{_batched(bg)}; worker CPU {_pct(f['worker_cpu_share'])}, backlog at end "
            f"{_n(f['worker_backlog_at_end'])} records"),
        *_hop_rows(f, name),
    ]


def _hop_rows(f: dict[str, Any], name: str) -> list[Row]:
    hops = f.get("hops")  # absent in results measured before the split
    if not hops:
        return []
    parts = [("XID → finding", "xid_to_finding_s"), ("finding → proposal", "finding_to_proposal_s"),
             ("proposal → action", "proposal_to_action_s")]
    return [Row(name, "per hop, p50 / p99: " + ", ".join(label for label, _ in parts),
                ", ".join(f"{_ms(hops[k]['p50'])} / {_ms(hops[k]['p99'])}" for _, k in parts))]


def detection_rows(f: dict[str, Any]) -> list[Row]:
    fp, th = f["fleet"]["fleetpulse"], f["fleet"]["baseline"]
    a, b = fp["headline"], th["headline"]
    name = "detection"

    def delays(klass: str, which: dict[str, Any]) -> str:
        part = which["by_class"].get(klass, {})
        return f"{_s(part.get('median_delay_s'))} / {_s(part.get('p95_delay_s'))}"

    def faults(klass: str) -> str:
        part = fp["by_class"].get(klass, {})
        return f"{part.get('found', 0)}/{part.get('faults', 0)} found"

    rows = [
        Row(name, f"recall, hard faults ({faults('hard')}, × 1000)", _n(a["recall_hard"], 3),
            _n(b["recall_hard"], 3), goal="≥ 0.99",
            met=a["recall_hard"] is not None and a["recall_hard"] >= 0.99),
        Row(name, f"recall, gray / slow faults ({faults('gray')}, × 1000)", _n(a["recall_gray"], 3),
            _n(b["recall_gray"], 3), goal="≥ 0.9",
            met=a["recall_gray"] is not None and a["recall_gray"] >= 0.9),
        Row(name, f"recall, flapping ({faults('flapping')}, finding expected)",
            _n(a["recall_flapping"], 3), _n(b["recall_flapping"], 3), goal="≥ 0.8",
            met=a["recall_flapping"] is not None and a["recall_flapping"] >= 0.8),
        Row(name, "fabric faults (F1, F3, N1): found / the failed element named",
            f"{_n(a.get('recall_fabric'), 3)} / {_n(a.get('named_fabric'), 3)}",
            f"{_n(b.get('recall_fabric'), 3)} / {_n(b.get('named_fabric'), 3)}", goal="≥ 0.9 named",
            met=(a.get("named_fabric") or 0) >= 0.9),
        Row(name, "time to detect, hard: median / p95", delays("hard", fp), delays("hard", th)),
        Row(name, "time to detect, gray: median / p95", delays("gray", fp), delays("gray", th)),
        Row(name, f"precision ({fp['episodes']} removal episodes)", _n(a["precision"], 3),
            _n(b["precision"], 3), goal="≥ 0.95",
            met=a["precision"] is not None and a["precision"] >= 0.95),
        Row(name, "cordons caused by confounders", str(a["confounder_cordons"]),
            str(b["confounder_cordons"]), goal="0", met=a["confounder_cordons"] == 0),
        Row(name, f"false cordons per 1,000 node-days ({_n(a['node_days'], 1)} node-days)",
            f"{_n(a['false_cordons_per_1k_node_days'], 2)} ({a['false_cordons']} seen; "
            f"95 % bound {_n(a['false_cordons_per_1k_node_days_95_upper'], 1)})",
            _n(b["false_cordons_per_1k_node_days"], 1), goal="≤ 0.1",
            met=_false_cordons_met(a)),
    ]
    rows += intensity_rows(f["fleet"].get("by_intensity", {}))
    rows += nab_rows(f.get("nab", {}))
    return rows


def nab_rows(nab: dict[str, Any]) -> list[Row]:
    """The series detector on the NAB development series: at its default, at matched false-alarm
    budgets against the rolling z-score and the EWMA, and the generalisation checks."""
    if "fleetpulse" not in nab:
        return []
    name = "detection"
    ours, static = nab["fleetpulse"], nab["baseline_static_3sd"]
    rows = [Row(
        name, f"NAB machine series, default sensitivity {nab.get('sensitivity', '?')}: window "
        f"recall ({ours['hits']}/{ours['windows']}), false alarms/week",
        f"{_n(ours['recall'], 3)}, {_n(ours['false_alarms_per_week'], 2)}",
        f"{_n(static['recall'], 3)}, {_n(static['false_alarms_per_week'], 2)} (mean ± 3 sd)")]

    def at(p: dict[str, Any] | None) -> str:
        if not p:
            return "none within"
        return (f"{_n(p['recall'], 3)} ({p['hits']}/{p['windows']}) at "
                f"{_n(p['false_alarms_per_week'], 2)}, threshold {p['threshold']:g}")

    for budget, row in nab.get("matched", {}).items():
        if budget not in ("1.3", "2.8"):
            continue
        fp = row["fleetpulse"]
        goal = budget == "1.3"
        rows.append(Row(
            name, f"NAB, best recall within {budget} false alarms/week (each swept)", at(fp),
            f"z-score {at(row['zscore'])}; EWMA {at(row['ewma'])}",
            goal="≥ 0.85 at ≤ 1.3" if goal else "",
            met=(fp is not None and fp["recall"] >= 0.85) if goal else None))
    loo = nab.get("leave_one_out")
    if loo:
        def cell(d: str) -> str:
            p = loo[d]
            return (f"{_n(p['recall'], 3)} ({p['hits']}/{p['windows']}) at "
                    f"{_n(p['false_alarms_per_week'], 2)}")

        rows.append(Row(
            name, "NAB, leave one series out (threshold picked within 1.3/week on the others)",
            cell("fleetpulse"), f"z-score {cell('zscore')}; EWMA {cell('ewma')}"))
    return rows


def intensity_rows(by_intensity: dict[str, Any]) -> list[Row]:
    """Per fault intensity and class: found / acted / withheld / missed, then precision and
    false cordons (bench/results/detection.md has the same by type)."""
    rows = []

    def cell(part: dict[str, Any] | None) -> str:
        if not part:
            return "-"
        acted = (f", acted {part['acted']}, withheld {part['withheld']}"
                 if part["action_faults"] else "")
        return f"found {part['found']}/{part['faults']}{acted}, missed {part['missed']}"

    for key, run in by_intensity.items():
        fp, th = run["fleetpulse"], run["baseline"]
        for klass in sorted(set(fp["by_class"]) | set(th["by_class"])):
            rows.append(Row("detection", f"{key}: {klass}", cell(fp["by_class"].get(klass)),
                            cell(th["by_class"].get(klass))))
        a, b = fp["headline"], th["headline"]
        rows.append(Row(
            "detection", f"{key}: precision / confounder cordons / false cordons per 1k "
            f"node-days ({_n(a['node_days'], 1)} node-days)",
            f"{_n(a['precision'], 3)} / {a['confounder_cordons']} / "
            f"{_n(a['false_cordons_per_1k_node_days'], 2)} (95 % bound "
            f"{_n(a['false_cordons_per_1k_node_days_95_upper'], 1)})",
            f"{_n(b['precision'], 3)} / {b['confounder_cordons']} / "
            f"{_n(b['false_cordons_per_1k_node_days'], 1)}"))
    return rows


def _false_cordons_met(h: dict[str, Any]) -> bool | None:
    """Met only when the run can show it: with none seen, the 95 % bound must be under the
    goal too; none seen in too few node-days is left open (blank), not claimed."""
    rate, upper = h["false_cordons_per_1k_node_days"], h["false_cordons_per_1k_node_days_95_upper"]
    if rate is None or rate > 0.1:
        return False
    return True if upper is not None and upper <= 0.1 else None


def lake_rows(f: dict[str, Any]) -> list[Row]:
    w, q = f["writes"], f["queries"]
    slowest = q["query_s"][q["slowest"]]
    return [
        Row("lake", f"Parquet writes via LakeWriter ({_n(w['rows'])} rows)",
            f"{_n(w['lake_writer_rows_per_s'])} rows/s", f"raw pyarrow {_n(w['raw_pyarrow_rows_per_s'])}",
            _x(w["lake_writer_vs_raw_pyarrow"]), "≥ 1,000,000 rows/s",
            w["lake_writer_rows_per_s"] >= 1_000_000),
        *([Row("lake", f"Parquet writes via LakeWriter.extend ({_n(w['rows'])} rows)",
               f"{_n(w['lake_writer_batches_rows_per_s'])} rows/s",
               f"raw pyarrow {_n(w['raw_pyarrow_rows_per_s'])}",
               _x(w["lake_writer_batches_vs_raw_pyarrow"]), "≥ 0.3× raw pyarrow",
               w["lake_writer_batches_vs_raw_pyarrow"] >= 0.3)]
          if "lake_writer_batches_rows_per_s" in w else []),
        *([Row("lake", f"the lake sink's whole path, JSON record bytes to Parquet ({_n(w['rows'])} rows)",
               f"{_n(w['sink_from_bytes_rows_per_s'])} rows/s",
               f"raw pyarrow {_n(w['raw_pyarrow_rows_per_s'])}",
               _x(w["sink_from_bytes_vs_raw_pyarrow"]), "", None)]
          if "sink_from_bytes_rows_per_s" in w else []),
        *([Row("lake", f"the lake sink's whole path from batch records of 500 JSON rows, as the "
               f"worker writes utilization ({_n(w['rows'])} rows)",
               f"{_n(w['sink_from_batches_rows_per_s'])} rows/s",
               f"raw pyarrow {_n(w['raw_pyarrow_rows_per_s'])}",
               _x(w["sink_from_batches_vs_raw_pyarrow"]), "", None)]
          if "sink_from_batches_rows_per_s" in w else []),
        Row("lake", f"canned queries under 1 s ({_n(q['utilization_rows'])} utilization rows)",
            f"{q['under_1s']}/{q['queries']} ({q.get('under_1s_on_idle_cores', '?')}/"
            f"{q['queries']} in CPU s per core); slowest {q['slowest']} {slowest:.2f} s",
            f"1-column scan {q['baseline_scan_s']:.2f} s", _x(slowest / q["baseline_scan_s"]),
            "every query < 1 s", q["under_1s"] == q["queries"]),
    ]


def profile_rows(f: dict[str, Any]) -> list[Row]:
    rows = []
    for which in ("embedded", "worker"):
        part = f.get(which, {})
        for key, what in (("stage_share_of_busy", "per pipeline stage"),
                          ("component_share_of_busy", "per component")):
            shares = part.get(key)
            if not shares or (which == "embedded" and key.startswith("component")):
                continue
            ordered = sorted(shares.items(), key=lambda kv: -kv[1])
            text = ", ".join(f"{k} {100 * v:.0f} %" for k, v in ordered if v >= 0.01)
            rows.append(Row("profile", f"{which}: busy time {what}", text))
    return rows


def sim_rows(f: dict[str, Any]) -> list[Row]:
    return [Row("sim", "simulator: metric samples generated",
                f"{_n(f['sim.events.samples_per_cpu_s'])} samples/s/core",
                f"objects only {_n(f['floor.objects.gpu_samples_per_cpu_s'])}",
                _x(f["sim.events.samples_per_cpu_s"] / f["floor.objects.gpu_samples_per_cpu_s"]))]


def remediation_rows(f: dict[str, Any]) -> list[Row]:
    return [Row("remediation", "health heartbeats / policy proposals (pool of 1,000)",
                f"{_n(f.get('health_heartbeats_per_s'))} / "
                f"{_n(f.get('policy_proposals_per_s_pool_1000'))} per s")]


def scaling_rows(f: dict[str, Any]) -> list[Row]:
    if "workers_3" not in f:
        return [Row("scaling", "3 workers against 1", "skipped (no Kafka)")]
    one, three = f["workers_1"], f["workers_3"]
    return [Row("scaling", f"3 workers / 1, {f['partitions']} partitions",
                f"{_n(three['samples_per_s'])} samples/s",
                f"1 worker: {_n(one['samples_per_s'])} samples/s", _x(f["ratio_3_vs_1"]))]


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "throughput": throughput_rows,
    "latency": latency_rows,
    "latency-take": latency_rows,
    "detection": detection_rows,
    "lake": lake_rows,
    "profile": profile_rows,
    "sim": sim_rows,
    "remediation": remediation_rows,
    "scaling": scaling_rows,
}


def load(name: str, quick: bool) -> dict[str, Any] | None:
    path = RESULTS / f"{result_name(name, quick and name not in WITHOUT_QUICK)}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def collect(quick: bool) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """Rows of every benchmark with a result file, and each file's machine description."""
    rows: list[Row] = []
    machines: dict[str, dict[str, Any]] = {}
    for name, build in ROWS.items():
        result = load(name, quick)
        if result is None:
            continue
        try:
            rows += build(result["figures"])
        except (KeyError, TypeError, ZeroDivisionError) as exc:
            rows.append(Row(name, "result file", f"unreadable: {exc!r}"))
        busy = result.get("settings", {}).get("load_average")
        machines[name] = {**result.get("machine", {}),
                          **({"load": busy[0]} if isinstance(busy, list) and busy else {})}
    return rows, machines


def markdown(rows: list[Row], machines: dict[str, dict[str, Any]], quick: bool) -> str:
    intro = (
        f"Benchmarks ({'quick' if quick else 'full'} run), `make bench` / `python -m bench`. "
        "Speeds: medians of repetitions, per CPU second of the measuring process "
        "(\"per core\"), ratios against a baseline measured in the same run."
    )
    return f"{intro}\n\n{results_markdown(rows, machines)}\n"


def results_markdown(rows: list[Row], machines: dict[str, dict[str, Any]]) -> str:
    """The table and where each benchmark was measured: summary.md and the README section."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def met(value: bool | None) -> str:
        return "" if value is None else ("yes" if value else "**no**")

    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        cells = (r.bench, r.figure, r.value, r.baseline, r.ratio, r.goal, met(r.met))
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines += ["", "Where and when each was measured:", ""]
    for name, m in machines.items():
        lines.append(f"- {name}: {m.get('date', '?')}, commit {m.get('commit', '?')}, "
                     f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
                     f"Python {m.get('python', '?')}"
                     + (f", load average {m['load']:.1f} at the end" if "load" in m else ""))
    return "\n".join(lines)


def write_markdown(quick: bool) -> Path:
    rows, machines = collect(quick)
    path = RESULTS / f"{result_name('summary', quick)}.md"
    path.write_text(markdown(rows, machines, quick))
    return path


def readme_sections() -> dict[str, str]:
    """Every generated section of the README, from the full-run result files: the table and
    the paragraphs of figures (bench/prose.py)."""
    rows, machines = collect(quick=False)
    results = {name: load(name, quick=False) for name in prose.NEEDS}
    return {README_MARKER: results_markdown(rows, machines), **prose.sections(results)}


def write_readme(readme: Path = README) -> bool:
    """Rewrite the README's generated sections (the table between the `bench` markers, the
    paragraphs between the `bench-time` and `bench-detection` ones) from the full-run result
    files; True if any changed. Quick runs never reach the README."""
    return docs_markers.rewrite_sections(readme, readme_sections())
