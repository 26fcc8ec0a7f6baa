"""The report's tables as people read them (pipeline/report/html.py): column names in words,
numbers rounded by what they are, names in natural order where the query leaves a tie."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from pipeline.lake.query import Result
from pipeline.report.html import _cell, _header, _natural_ties, natural_key


def test_names_sort_naturally() -> None:
    names = ["node-10", "node-2", "node-1", "a100-serve-9", "a100-serve-10", "node-02b"]
    assert sorted(names, key=natural_key) == [
        "a100-serve-9", "a100-serve-10", "node-1", "node-2", "node-02b", "node-10"]


def test_only_ties_are_reordered_the_querys_order_is_kept() -> None:
    # ORDER BY actions DESC, name: node-10 and node-2 tie on 3 actions, node-1 has 1
    result = Result(["name", "actions", "checks"],
                    [("node-10", 3, "x"), ("node-2", 3, "y"), ("node-1", 1, "z")])
    assert [r[0] for r in _natural_ties(result, "name").rows] == ["node-2", "node-10", "node-1"]
    # a different number is no tie: the query's order stands
    apart = Result(["name", "actions"], [("node-10", 3), ("node-2", 2)])
    assert [r[0] for r in _natural_ties(apart, "name").rows] == ["node-10", "node-2"]


def test_headers_are_words() -> None:
    assert _header("util_mean_pct") == "mean utilization %"
    assert _header("usd_per_useful_hour") == "USD per useful hour"
    assert _header("critical_findings") == "critical findings"
    assert _header("headroom_pct") == "headroom %"
    assert _header("fatal_xids") == "fatal XIDs"


def test_numbers_are_rounded_by_what_they_are() -> None:
    assert _cell(97.4567, "util_mean_pct") == "97.5"
    assert _cell(1946.5612, "total_cost_usd") == "1,946.56"
    assert _cell(Decimal("12.345"), "usd_per_hour") == "12.35"
    assert _cell(7.9999, "device_hours") == "8.0"
    assert _cell(1234567, "findings") == "1,234,567"
    assert (_cell(1234.5678, "x"), _cell(12.345, "x"), _cell(1.2345, "x")) == (
        "1,235", "12.3", "1.23")
    assert (_cell(True, "dry_run"), _cell(None, "x")) == ("yes", "")
    assert _cell(datetime(2026, 1, 1, 0, 23, 50), "ts") == "2026-01-01 00:23"
    assert _cell("gpu.ecc.dbe,xid.48", "checks") == "gpu.ecc.dbe, xid.48"  # may wrap
