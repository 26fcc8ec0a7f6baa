"""docs/sizing.md's generated tables, from the benchmarks' result files.

    python -m bench.sizing --docs     # rewrite the generated sections from bench/results

Each section sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers
(pipeline/docs_markers.py) and is a pure function of result files:

- `sizing-fleet`, `sizing-topics-gpu`, `sizing-topics-tpu`: bench/results/sizing.json
  (bench/sizing.py: values per second and bytes per value per accelerator), the worker's
  measured cost (bench/results/scaling.json, the 1-worker run) and the Prometheus adapter's
  (bench/results/prometheus.json), scaled to 1k, 10k and 100k GPUs or TPU chips by the rules
  below;
- `sizing-scaling`: bench/results/scaling.json (bench/scaling.py: 1, 2 and 3 workers);
- `sizing-prometheus`: bench/results/prometheus.json (bench/bench_prometheus.py);
- `sizing-compression`: bench/results/compression.json (bench/bench_compression.py).

The rules, stated once here and in the page:
- every topic's values scale with the accelerators (telemetry exactly; fault-driven topics at
  the simulator's fault rates, which are per node or per slice);
- workers: the fleet's metric samples per second over half of what one worker process does per
  core-second (half: room to catch up after an outage at twice the live rate);
- partitions: at least 12, and a multiple of 12 at least twice the workers (workers can be
  added without repartitioning, which would move every key);
- Prometheus adapters: the adapter CPU per poll (sharded, bounded queries) over a 15 s poll,
  one adapter per third of a core (a poll then takes a third of the poll interval).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pipeline.docs_markers import rewrite_sections
from pipeline.wire.topics import TOPICS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "sizing.md"
RESULTS = ROOT / "bench" / "results"
SOURCES = ("sizing", "scaling", "prometheus", "compression")
FLEET_SIZES = (1_000, 10_000, 100_000)
UNIT = {"gpu": "GPUs", "tpu": "TPU chips"}
DAY_S = 86_400
HEADROOM = 0.5  # a worker sized to run at half a core
PARTITION_STEP = 12
POLL_S = 15  # the Prometheus adapter's poll (prometheus_lag_s's scrape interval)
ADAPTER_CORES = 1 / 3  # one adapter process per third of a core
GPUS_PER_NODE = 8


def load(results: Path = RESULTS) -> dict[str, dict[str, Any] | None]:
    """The result files the sections read (None for a benchmark not run yet)."""
    found: dict[str, dict[str, Any] | None] = {}
    for name in SOURCES:
        path = results / f"{name}.json"
        found[name] = json.loads(path.read_text()) if path.exists() else None
    return found


def num(x: float | None) -> str:
    """Three significant digits, thousands separated, whole numbers as such; below 0.001 only
    "< 0.001"; "-" for nothing."""
    if x is None:
        return "-"
    if x == 0 or isinstance(x, int):
        return f"{x:,}"
    if abs(x) < 0.001:
        return "< 0.001"
    if abs(x) >= 100:
        return f"{round(x):,}"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


# --- the rules ---------------------------------------------------------------------------


def worker_samples_per_core_s(scaling: dict[str, Any] | None) -> float | None:
    """Metric samples one worker process handles per CPU second (the 1-worker scaling run)."""
    if scaling is None or "workers_1" not in scaling.get("figures", {}):
        return None
    figures = scaling["figures"]
    cpu = sum(w["cpu_s"] for w in figures["workers_1"]["per_worker"])
    return float(figures["metric_samples"] / cpu) if cpu else None


def workers_for(samples_per_s: float, per_core_s: float) -> int:
    return max(1, math.ceil(samples_per_s / (per_core_s * HEADROOM)))


def partitions_for(workers: int) -> int:
    return max(PARTITION_STEP, math.ceil(2 * workers / PARTITION_STEP) * PARTITION_STEP)


def prometheus_adapters(gpus: int, prometheus: dict[str, Any] | None,
                        ) -> tuple[int, float, float] | None:
    """(adapters, their cores, Prometheus's query cores) for `gpus`, from the sharded mode."""
    if prometheus is None:
        return None
    sharded = prometheus["per_10k_gpus"]["sharded_sum"]
    cores = sharded["cpu_s"] * gpus / 10_000 / POLL_S
    query_cores = sharded["prometheus_cpu_s"] * gpus / 10_000 / POLL_S
    return max(1, math.ceil(cores / ADAPTER_CORES)), cores, query_cores


# --- the sections ------------------------------------------------------------------------


def topic_rows(fleet: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The fleet's topics with values, in the topic table's order."""
    topics = fleet["topics"]
    return [(s.suffix, topics[s.suffix]) for s in TOPICS
            if topics.get(s.suffix, {}).get("values")]  # fmt: skip


def topics_table(kind: str, fleet: dict[str, Any]) -> str:
    head = ["topic", "bytes per value, raw / zstd"]
    for size in FLEET_SIZES:
        k = f"{size // 1000}k"
        head += [f"{k}: values/s", f"{k}: MB/s", f"{k}: GB/day"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suffix, t in topic_rows(fleet):
        cells = [f"`{suffix}`", f"{num(t['value_bytes'])} / {num(t['wire_bytes_per_value'])}"]
        for size in FLEET_SIZES:
            per_s = t["values_per_s_per_unit"] * size
            mb_s = per_s * t["wire_bytes_per_value"] / 1e6
            cells += [num(per_s), num(mb_s), num(mb_s * DAY_S / 1000)]
        lines.append("| " + " | ".join(cells) + " |")
    silent = [s.suffix for s in TOPICS if not fleet["topics"].get(s.suffix, {}).get("values")]
    hours = fleet["seconds"] / 3600
    lines += ["", f"Measured on {fleet['units']:,} {UNIT[kind]} over {num(hours)} simulated hours. "
              f"No values in that run: {', '.join(f'`{s}`' for s in silent) or 'none'}."]
    return "\n".join(lines)


def fleet_figures(kind: str, size: int, fleet: dict[str, Any], per_core_s: float | None,
                  prometheus: dict[str, Any] | None) -> dict[str, Any]:
    """One fleet's totals: values/s, MB/s, GB/day, workers, partitions, adapters, lake."""
    topics = fleet["topics"].values()
    per_s = sum(t["values_per_s_per_unit"] for t in topics) * size
    samples = sum(t["metric_samples_per_s_per_unit"] for t in topics) * size
    mb_s = sum(t["values_per_s_per_unit"] * (t["wire_bytes_per_value"] or 0)
               for t in topics) * size / 1e6  # fmt: skip
    lake_rows = lake_bytes = 0.0
    for table in fleet["lake"].values():
        rows = fleet["topics"][table["topic"]]["values_per_s_per_unit"] * size * DAY_S
        lake_rows += rows
        lake_bytes += rows * table["bytes_per_row"]
    workers = workers_for(samples, per_core_s) if per_core_s else None
    adapters = "Cloud Monitoring adapter: not measured"
    if kind == "gpu":
        sized = prometheus_adapters(size, prometheus)
        nodes = f"XID reader on each of {size // GPUS_PER_NODE:,} nodes"
        adapters = nodes if sized is None else (
            f"{sized[0]} Prometheus ({num(sized[1])} cores; Prometheus {num(sized[2])} cores "
            f"for their queries) + {nodes}")
    return {"values_per_s": per_s, "samples_per_s": samples, "mb_s": mb_s,
            "gb_day": mb_s * DAY_S / 1000, "workers": workers,
            "partitions": partitions_for(workers) if workers else None, "adapters": adapters,
            "lake_rows_day": lake_rows, "lake_gb_day": lake_bytes / 1e9}  # fmt: skip


def fleet_table(sizing: dict[str, Any], per_core_s: float | None,
                prometheus: dict[str, Any] | None) -> str:
    head = ["fleet", "input + output values/s", "metric samples/s", "MB/s (zstd)",
            "GB/day (one replica)", "partitions", "workers", "adapter processes",
            "lake rows/day", "lake GB/day"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind in UNIT:
        for size in FLEET_SIZES:
            f = fleet_figures(kind, size, sizing[kind], per_core_s, prometheus)
            cells = [f"{size:,} {UNIT[kind]}", num(f["values_per_s"]), num(f["samples_per_s"]),
                     num(f["mb_s"]), num(f["gb_day"]), num(f["partitions"]), num(f["workers"]),
                     f["adapters"], num(f["lake_rows_day"]), num(f["lake_gb_day"])]
            lines.append("| " + " | ".join(cells) + " |")
    per_core = ("not measured yet (run `python -m bench --only scaling`)" if per_core_s is None
                else f"{num(per_core_s)} metric samples per CPU second")
    single = ", ".join(f"`{s.suffix}`" for s in TOPICS if s.single)
    lines += ["", f"One worker process: {per_core} (bench/results/scaling.json, the 1-worker "
              "run); workers are sized to half of that. Every topic has the partitions shown "
              f"except {single} (one partition: read in one order)."]
    return "\n".join(lines)


def prometheus_table(prometheus: dict[str, Any]) -> str:
    per = prometheus["per_10k_gpus"]
    labels = {
        "raw": "raw: one HTTP GET of the whole query, bytes not decoded (baseline)",
        "json": "before: prometheus-api-client `response.json()` + parse",
        "adapter": "adapter, one query (msgspec decode + parse)",
        "sharded_sum": (f"{prometheus['settings']['shards']} adapters (`prometheus_shard` "
                        f"i/{prometheus['settings']['shards']}, "
                        f"{prometheus['settings']['per_query']} nodes per query), sum"),
        "sharded_max": f"the largest of those {prometheus['settings']['shards']}",
    }
    lines = ["| per poll, per 10k GPUs | adapter CPU | wall | Prometheus CPU | "
             "adapter CPU vs raw | wall vs raw |", "|---|---|---|---|---|---|"]
    for mode, label in labels.items():
        m = per[mode]
        lines.append(f"| {label} | {num(m['cpu_s'])} s | {num(m['wall_s'])} s | "
                     f"{num(m['prometheus_cpu_s'])} s | {num(m['cpu_vs_raw'])} | "
                     f"{num(m['wall_vs_raw'])} |")
    at = prometheus_adapters(100_000, prometheus)
    assert at is not None
    lines += ["", f"Scaled from the {prometheus['per_10k_from_gpus']:,}-GPU run. The whole query "
              f"is {num(per['raw_mb'])} MB of JSON per 10k GPUs. At 100k GPUs and a "
              f"{num(POLL_S)} s poll: {num(at[1])} cores of adapters in bounded queries, so "
              f"**{at[0]} adapters** (`prometheus_shard = \"0/{at[0]}\"` ... "
              f"`\"{at[0] - 1}/{at[0]}\"`, one per third of a core), and {num(at[2])} cores of "
              "Prometheus (or Thanos / Mimir querier) answering them, on top of its scraping."]
    return "\n".join(lines)


def compression_table(compression: dict[str, Any]) -> str:
    lines = ["| records | raw values | zstd | gzip | producer CPU per MB (none / zstd / gzip) |",
             "|---|---|---|---|---|"]
    for key, label in (("telemetry_batches", "telemetry batches (default)"),
                       ("record_per_node", "one record per node")):
        part = compression[key]
        codecs = part["codecs"]
        cells = [f"{label}, {part['records']:,} records of {num(part['mean_value_bytes'] / 1000)} kB",
                 f"{num(part['value_bytes'] / 1e6)} MB"]
        for codec in ("zstd", "gzip"):
            c = codecs[codec]
            cells.append(f"{num(c['stored_bytes'] / 1e6)} MB ({num(c['ratio'])}x)"
                         if "stored_bytes" in c else c.get("skipped", "-"))
        cpu = " / ".join(num(codecs[c].get("producer_cpu_s_per_mb")) for c in
                         ("none", "zstd", "gzip"))
        lines.append("| " + " | ".join(cells) + f" | {cpu} s |")
    return "\n".join(lines)


def scaling_table(scaling: dict[str, Any]) -> str:
    f = scaling["figures"]
    if "workers_1" not in f:
        return f"Not measured: {f.get('kafka_skipped', 'no result')}."
    lines = ["| workers | wall (every run) | input records/s | metric samples/s | MB/s | vs 1 worker | "
             "each worker: records/s (CPU s) | workers' CPU in all | "
             "actions, findings as 1 worker's | a worker leaves: assigned / consuming | "
             "one joins: assigned / consuming |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in (1, 2, 3):
        row = f.get(f"workers_{n}")
        if row is None:
            continue
        each = ", ".join(f"{num(w['records_per_s'])} ({num(w['cpu_s'])})"
                         for w in row["per_worker"])
        same = ("yes" if row["same_actions_as_1_worker"] else "**no**") + ", " + (
            "yes" if row["same_findings_as_1_worker"] else "**no**")
        moves = ["-", "-"]
        if "rebalance" in row:
            leave, join = row["rebalance"]["leave"], row["rebalance"]["join"]
            moves = [f"{num(leave['assigned_s'])} / {num(leave['consuming_s'])} s",
                     f"{num(join['assigned_s'])} / {num(join['consuming_s'])} s "
                     f"({num(join['after_startup_s'])} s after its start-up)"]
        cpu = sum(w["cpu_s"] for w in row["per_worker"])
        walls = ", ".join(num(w) for w in row.get("runs_wall_s", [row["wall_s"]]))
        lines.append(f"| {n} | {num(row['wall_s'])} s ({walls}) | {num(row['records_per_s'])} | "
                     f"{num(row['samples_per_s'])} | {num(row['mb_per_s'])} | "
                     f"{num(row['ratio_vs_1'])} | {each} | {num(cpu)} s | {same} | "
                     f"{' | '.join(moves)} |")
    one = f["workers_1"]
    embedded = "equal" if one["same_actions_as_embedded"] else "**not equal**"
    machine = scaling.get("machine", {})
    options = scaling.get("settings", {})
    load = f"{options.get('load_average_before', '?')} before, {options.get('load_average')} after"
    lines += ["", f"Input: {f['events']:,} events ({num(f['value_bytes'] / 1e6)} MB of values, "
              f"{f['metric_samples']:,} metric samples), {f['partitions']} partitions, "
              f"{len(one['actions'])} actions; the 1-worker run's actions are {embedded} to the "
              f"embedded runtime's. Measured on {machine.get('cores', '?')} cores "
              f"({machine.get('cpu', '?')}), load averages {load}, "
              f"{machine.get('date', '?')}."]
    return "\n".join(lines)


def sections(results: dict[str, dict[str, Any] | None]) -> dict[str, str]:
    """Every generated section of docs/sizing.md from the result files (`load()`)."""
    missing = "Not measured yet: run `python -m bench.{}`."
    sizing = results.get("sizing")
    prometheus, compression = results.get("prometheus"), results.get("compression")
    found = {
        "sizing-fleet": missing.format("sizing"),
        "sizing-topics-gpu": missing.format("sizing"),
        "sizing-topics-tpu": missing.format("sizing"),
        "sizing-prometheus": (missing.format("bench_prometheus") if prometheus is None
                              else prometheus_table(prometheus)),
        "sizing-compression": (missing.format("bench_compression") if compression is None
                               else compression_table(compression)),
        "sizing-scaling": (missing.format("scaling") if results.get("scaling") is None
                           else scaling_table(results["scaling"])),  # type: ignore[arg-type]
    }
    if sizing is not None:
        figures = sizing["figures"]
        per_core = worker_samples_per_core_s(results.get("scaling"))
        found["sizing-fleet"] = fleet_table(figures, per_core, prometheus)
        found["sizing-topics-gpu"] = topics_table("gpu", figures["gpu"])
        found["sizing-topics-tpu"] = topics_table("tpu", figures["tpu"])
    return found


def write(doc: Path = DOC, results: Path = RESULTS) -> bool:
    """Rewrite the generated sections of `doc`; True if it changed."""
    return rewrite_sections(doc, sections(load(results)))
