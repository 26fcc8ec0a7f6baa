"""The connections of report, canned analyses and `lake status` reach nothing but the lake;
ad-hoc `fleetpulse sql` keeps the user's own rights. The lock is checked on both lake backends
(local Parquet, and Iceberg on s3proxy, whose readers may read only their cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import LakeSettings
from pipeline.lake.query import Lake, QueryError
from tests.iceberg_fixture import BACKENDS, build_fixture_lake

# a lake: its folder and the settings that open it (the backend's)
Stored = tuple[Path, LakeSettings]


@pytest.fixture(scope="module", params=BACKENDS)
def stored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return build_fixture_lake(request.param, tmp_path_factory.mktemp("locked"))


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside.csv"
    outside.write_text("a,b\n1,2\n")
    return outside


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_csv('{outside}')",
        "COPY (SELECT 1 AS x) TO '{tmp}/copied.csv'",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
    ],
)
def test_a_locked_lake_refuses_files_outside_and_settings(
    tmp_path: Path, stored: Stored, query: str
) -> None:
    outside = _outside(tmp_path)
    with Lake(*stored) as lake, pytest.raises(QueryError):
        lake.sql(query.format(outside=outside, tmp=tmp_path))
    assert not (tmp_path / "copied.csv").exists()


def test_a_locked_lake_still_reads_its_own_views(stored: Stored) -> None:
    with Lake(*stored) as lake:
        assert lake.sql("SELECT count(*) FROM prices").rows[0][0] > 0
        assert lake.sql("SELECT count(*) FROM utilization").rows[0][0] > 0


def test_adhoc_sql_keeps_the_users_rights(tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"
    lake_dir.mkdir()
    outside = _outside(tmp_path)
    with Lake(lake_dir, locked=False) as lake:
        assert lake.sql(f"SELECT b FROM read_csv('{outside}')").rows == [(2,)]
