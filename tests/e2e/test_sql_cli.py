"""`fleetpulse sql` end to end on the fixture lake: canned and ad-hoc queries, table/CSV/JSON,
bound parameters, clear errors. On both lake backends: the local Parquet lake and the same
tables as Iceberg on s3proxy (tests/iceberg_fixture.py; the settings through FLEETPULSE_LAKE__*,
as a deployment gives them)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.catalog import price_for
from pipeline.cli import main
from pipeline.lake.query import canned_queries
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake, settings_env

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, dict[str, str]]:
    """The fixture lake's folder (`--lake`) and the environment that selects its backend."""
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("lake"))
    return root, settings_env(settings) if settings.uri else {}


@pytest.fixture
def lake(backend: tuple[Path, dict[str, str]]) -> Path:
    return backend[0]


@pytest.fixture
def sql(backend: tuple[Path, dict[str, str]]) -> Cli:
    """The real command in its own process (imports, entry point, exit code)."""
    root, env = backend

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "sql", "--lake", str(root), *args],
            capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env})
        assert (done.returncode == 0) == ok, done.stderr
        return done

    return run


@pytest.fixture
def cli(backend: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The same command in this process: much faster, same parser and handler."""
    lake, env = backend
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        code = main(["sql", "--lake", str(lake), *args])
        out, err = capsys.readouterr()
        assert (code == 0) == ok, err
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def test_list_names_every_canned_query_with_its_question(cli: Cli) -> None:
    out = cli("--list").stdout
    for name, query in canned_queries().items():
        assert f"{name}  [" in out and query.question[:40] in out


def test_canned_query_as_json_with_a_relative_window_and_pool(sql: Cli, cli: Cli) -> None:
    out = sql("--query", "cost_of_idle", "--since", "4h", "--pool", "train",
              "--format", "json").stdout
    (row,) = json.loads(out)
    price = price_for(fx.H100)
    assert price is not None
    assert (row["pool"], row["idle_hours"]) == ("train", fx.HOURS * 1.0)
    assert row["idle_cost_usd"] == pytest.approx(fx.HOURS * price.usd_per_hour, abs=0.01)
    timeline = json.loads(cli("-q", "actions_timeline", "--since", "2026-01-01T00:00Z",
                              "--until", "2026-01-01T02:00Z", "-f", "json").stdout)
    assert [r["ts"] for r in timeline] == ["2026-01-01T01:05:00Z"] * 2 + ["2026-01-01T01:10:00Z"]


def test_ad_hoc_sql_binds_parameters_and_writes_csv(cli: Cli) -> None:
    text = "SELECT pool, count(*) AS n FROM utilization WHERE pool = $pool GROUP BY pool"
    rows = list(csv.reader(io.StringIO(cli(text, "--pool", "infer", "-f", "csv").stdout)))
    assert rows == [["pool", "n"], ["infer", str(2 * fx.HOURS * 60)]]
    hostile = cli(text, "--pool", "x' OR '1'='1", "-f", "csv").stdout
    assert hostile.strip() == "pool,n"


def test_table_output_and_errors(sql: Cli, cli: Cli) -> None:
    table = cli("-q", "xid_frequency").stdout.splitlines()
    assert table[0].split()[:4] == ["xid", "mnemonic", "severity", "events"]
    assert set(table[1]) <= {"-", " "} and len(table) == 4
    unknown = sql("-q", "nope", ok=False)
    assert unknown.returncode == 2 and "no canned query 'nope'" in unknown.stderr
    bad = cli("SELECT * FROM nowhere", ok=False)
    assert "nowhere" in bad.stderr and "Traceback" not in bad.stderr
    extra = cli("-q", "quota_headroom", "--pool", "train", ok=False)
    assert "takes no pool" in extra.stderr


def test_a_missing_local_lake_folder_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # local only: with lake.uri set, --lake is not read
    assert main(["sql", "--lake", str(tmp_path / "nowhere"), "-q", "fleet_summary"]) != 0
    assert "does not exist" in capsys.readouterr().err


def test_why_not_removed_takes_its_target_as_a_param(sql: Cli, cli: Cli) -> None:
    out = sql("--query", "why_not_removed", "--param", "target=c1/g2", "--until",
              "2026-01-01T04:00", "--format", "json").stdout
    assert [row["reason"] for row in json.loads(out)] == [
        "budget", "common_cause", "dropped: cleared"]
    assert "why_not_removed  [--until --param target=…]" in cli("--list").stdout
    assert "expected NAME=VALUE" in cli("--query", "why_not_removed", "--param", "target",
                                        ok=False).stderr
    assert "give --pool instead" in cli("--query", "why_not_removed", "--param", "pool=train",
                                        ok=False).stderr
