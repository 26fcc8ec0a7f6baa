"""The capacity benchmark's generated paragraph: written from a result's figures, between the
markers docs/capacity.md holds (never by hand)."""

from __future__ import annotations

from bench.capacity import DOCS_MARKER, stage_cost_words
from bench.common import ROOT
from pipeline import docs_markers

FIGURES = {"stage_cost": {
    "records": 11452, "utilization_rows": 6560, "snapshots": 214,
    "with_capacity": {"records_per_s": 9000}, "without_capacity": {"records_per_s": 9500},
    "cpu_ratio": 1.056, "cpu_spread": 0.031, "throughput_ratio": 0.947, "second_write_encode_share": 0.0044,
}}  # fmt: skip


def test_the_stage_cost_paragraph_says_both_rates_their_ratio_and_the_command() -> None:
    words = stage_cost_words(FIGURES, {"quick": False}, {"date": "2026-12-07", "cores": 2,
                                                         "commit": "abc1234"})  # fmt: skip
    assert "9,000 records/s with it, 9,500 without, in the same run" in words
    assert "CPU ratio with / without 1.056 (+5.6 %: beyond the runs' spread of 3.1 %)" in words
    assert "throughput ratio 0.947" in words
    noisy = {"stage_cost": {**FIGURES["stage_cost"], "cpu_ratio": 1.003}}
    assert "(+0.3 %: within the runs' spread of 3.1 %, so not measurable here)" in (
        stage_cost_words(noisy, {}, {}))
    assert "0.4 % of the run's CPU" in words
    assert "`python -m bench --only capacity`, 2026-12-07, 2 cores, commit abc1234" in words


def test_docs_hold_the_markers_the_benchmark_writes_between() -> None:
    text = (ROOT / "docs" / "capacity.md").read_text()
    start, end = docs_markers.markers(DOCS_MARKER)
    assert text.count(start) == 1 and text.count(end) == 1


def test_the_docs_list_is_what_the_committed_result_says() -> None:
    import json

    from bench.capacity import fold_words, forecast_words

    body = json.loads((ROOT / "bench" / "results" / "capacity.json").read_text())
    figures = body["figures"]
    words = "\n".join([forecast_words(figures), fold_words(figures),
                       stage_cost_words(figures, body["settings"], body["machine"])])
    assert docs_markers.read_section(ROOT / "docs" / "capacity.md", DOCS_MARKER).strip() == words
    assert f"{figures['fold']['fold_rows_per_cpu_s']:,} utilization rows per CPU-second" in words
    leads = [r["lead_min_p50"] for r in figures["ramps"] if not r["whole_devices"]]
    assert f"median {min(leads):g}-{max(leads):g} min before exhaustion" in words
