"""Each row once: records an ingest adapter sends twice (restarted without its checkpoint: the
same records at new offsets, in new files) are counted once by the views of the tables it
fills and the small ones (TableSpec.once_in_views), and by every canned analysis. (A group
reset never stores a row twice: the sink skips offsets the lake holds; tests/faults.) The
whole-fixture test runs on both lake backends (local Parquet, Iceberg on s3proxy); the property
test, a fresh lake per example, on the local one."""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import LakeSettings
from pipeline.lake.query import Lake, canned_queries
from pipeline.lake.tables import TABLES
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake, fixture_writer

SIZES = {table: len(events()) for table, events in fx.EVERYTHING.items()}
ONCE = sorted(name for name, spec in TABLES.items() if spec.once_in_views)


def test_the_tables_an_ingest_adapter_fills_are_kept_once_in_the_views() -> None:
    assert {"xid", "capacity"} <= set(ONCE)


def _replay(root: Path, again: dict[str, list[int]], start: int,
            lake: LakeSettings | None = None) -> None:
    """Store the events at the given indices again, at new offsets from `start` (as a
    restarted adapter sends them: new records, new files)."""
    writer = fixture_writer(root, lake or LakeSettings())
    for table, indices in again.items():
        events = fx.EVERYTHING[table]()
        for n, index in enumerate(indices):
            writer.add(table, events[index], (f"t.{table}", 0, start + n))
    writer.checkpoint()


def _counts(lake: Lake, prefix: str) -> dict[str, int]:
    return {t: int(lake.sql(f"SELECT count(*) FROM {prefix}{t}").rows[0][0]) for t in TABLES}


def _answers(lake: Lake) -> dict[str, Any]:
    since, until = fx.T0, fx.END
    out = {}
    for name, query in canned_queries().items():
        params: dict[str, Any] = {"until": _at(until)}
        if "since" in query.params:
            params["since"] = _at(since)
        out[name] = sorted(map(repr, lake.run(name, **params).rows))
    return out


def _at(ms: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=ms)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_stored_row_twice_changes_no_view_and_no_analysis(
    tmp_path: Path, backend: str
) -> None:
    once = build_fixture_lake(backend, tmp_path / "once")
    twice = build_fixture_lake(backend, tmp_path / "twice")
    _replay(twice[0], {t: list(range(SIZES[t])) for t in ONCE}, start=10**6, lake=twice[1])
    with Lake(*once) as single, Lake(*twice) as double:
        assert _counts(double, "stored_") == {
            t: (2 if t in ONCE else 1) * n for t, n in _counts(single, "").items()}
        assert _counts(double, "") == _counts(single, "")
        assert _answers(double) == _answers(single)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({
    table: st.lists(st.integers(0, SIZES[table] - 1), max_size=8)
    for table in ONCE
    if SIZES[table]  # a table the fixture leaves empty has nothing to store again
}))
def test_any_records_stored_again_any_number_of_times_count_once(
    again: dict[str, list[int]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = fx.build_lake(Path(folder))
        _replay(root, again, start=10**6)
        with Lake(root) as lake:
            stored = _counts(lake, "stored_")
            assert stored == {t: SIZES[t] + len(again.get(t, [])) for t in TABLES}
            assert _counts(lake, "raw_") == SIZES  # the fixture's records are all distinct
            assert _counts(lake, "") == SIZES
