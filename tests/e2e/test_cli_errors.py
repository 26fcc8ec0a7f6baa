"""The CLI's edges as a newcomer meets them: exact options only, defaults in help, errors that
name the command and say what to do — never a traceback, never a hang."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cli import build_parser
from tests import lake_fixture as fx


def fleetpulse(*args: str, env: dict[str, str] | None = None, timeout: float = 120
               ) -> subprocess.CompletedProcess[str]:
    """The real command in its own process (imports, entry point, exit code)."""
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", **(env or {})})


def _no_traceback(run: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in run.stderr, run.stderr


# --- parsing --------------------------------------------------------------------------------


def test_an_abbreviated_option_is_refused_not_guessed(tmp_path: Path) -> None:
    run = fleetpulse("demo", "--out", str(tmp_path / "d"), "--hour", "0.01", "--no-report")
    assert run.returncode == 2
    assert "unrecognized arguments: --hour 0.01" in run.stderr
    assert not (tmp_path / "d").exists(), "the demo ran on a guessed option"


def test_abbreviations_are_off_for_every_parser() -> None:
    seen = 0
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        seen += 1
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if action.choices and isinstance(action.choices, dict):
                todo.extend(action.choices.values())
    assert seen > 20  # the top level, every command and every sub-action


def test_a_misspelt_option_prints_the_commands_usage_not_the_top_level() -> None:
    run = fleetpulse("sql", "--qurey", "x")
    assert run.returncode == 2
    assert run.stderr.startswith("usage: fleetpulse sql "), run.stderr
    assert "fleetpulse sql: error: unrecognized arguments: --qurey" in run.stderr


def test_help_shows_defaults_and_keeps_hand_formatted_text() -> None:
    report = fleetpulse("report", "--help").stdout
    assert "(default: report.html)" in report
    assert "(default: None)" not in report and "(default: False)" not in report
    ingest = fleetpulse("ingest", "--help").stdout
    # ingest's description is a hand-aligned table: RawDescription layout survives
    assert "    fleetpulse ingest prometheus     DCGM metrics" in ingest
    assert "    fleetpulse ingest capacity       the cloud's capacity signals" in ingest


def test_sink_lake_takes_lake_like_every_other_command() -> None:
    run = fleetpulse("sink", "lake", "--help")
    assert "--lake LAKE" in run.stdout and "--to" not in run.stdout
    assert build_parser().parse_args(["sink", "lake", "--lake", "x"]).lake == "x"


def test_sink_lake_still_takes_to_as_a_deprecated_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["sink", "lake", "--to", "x"]).lake == "x"
    assert "--to is deprecated, use --lake" in capsys.readouterr().err


# --- clear errors, bounded time -------------------------------------------------------------


def _free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ingest_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path / "state"),
            "FLEETPULSE_METRICS__PORT": "0", **extra}


def test_ingest_cloudmon_without_credentials_says_what_is_missing(tmp_path: Path) -> None:
    # HOME without gcloud config and no GOOGLE_APPLICATION_CREDENTIALS: no ADC anywhere
    env = _ingest_env(tmp_path, GCE_METADATA_HOST="127.0.0.1:1", GCE_METADATA_IP="127.0.0.1:1")
    run = fleetpulse("ingest", "cloudmon", "--once", "--stdout", env=env, timeout=60)
    _no_traceback(run)
    assert run.returncode == 2
    assert "needs Google Cloud credentials" in run.stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS" in run.stderr
    assert "gcloud auth application-default login" in run.stderr


def test_ingest_capacity_without_credentials_says_what_is_missing(tmp_path: Path) -> None:
    env = _ingest_env(tmp_path, GCE_METADATA_HOST="127.0.0.1:1", GCE_METADATA_IP="127.0.0.1:1",
                      FLEETPULSE_CAPACITY__FEEDS='["tpu"]')
    run = fleetpulse("ingest", "capacity", "--once", "--stdout", env=env, timeout=60)
    _no_traceback(run)
    assert run.returncode == 2
    assert "The TPU API needs Google Cloud credentials" in run.stderr
    assert "FLEETPULSE_CAPACITY__TPU_ENDPOINT" in run.stderr


def test_ingest_prometheus_once_with_prometheus_down_exits_with_a_clear_error(
        tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    env = _ingest_env(tmp_path, FLEETPULSE_SOURCES__PROMETHEUS_URL=url,
                      FLEETPULSE_SOURCES__BACKOFF_INITIAL_S="0.1")
    run = fleetpulse("ingest", "prometheus", "--once", "--stdout", env=env, timeout=60)
    _no_traceback(run)
    assert run.returncode == 2
    assert f"fleetpulse: error: prometheus: gave up after 3 failed attempts: cannot reach " \
           f"Prometheus at {url}" in run.stderr
    # our retries only: one line of ours per failed poll, none of urllib3's underneath
    assert "Retrying (Retry(" not in run.stderr
    assert run.stderr.count("retrying in") == 2


def test_topics_create_without_a_broker_says_what_it_waits_for_and_gives_up() -> None:
    bootstrap = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    run = fleetpulse("topics", "create", "--timeout", "2",
                     env={"FLEETPULSE_KAFKA__BOOTSTRAP": bootstrap}, timeout=60)
    elapsed = time.monotonic() - started
    _no_traceback(run)
    assert run.returncode == 2
    first, *_ = run.stderr.splitlines()
    assert first == f"connecting to Kafka at {bootstrap} (up to 2 s)…"
    assert f"fleetpulse: error: cannot reach Kafka at {bootstrap} within 2 s" in run.stderr
    assert "FLEETPULSE_KAFKA__BOOTSTRAP" in run.stderr
    assert elapsed < 20, f"took {elapsed:.0f} s"


def test_topics_create_waits_ten_seconds_by_default() -> None:
    assert "give up when no broker answers within SECONDS (default: 10.0)" in \
        fleetpulse("topics", "create", "--help").stdout.replace("\n", " ").replace("  ", " ")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fx.build_lake(tmp_path_factory.mktemp("lake"))


def test_report_with_a_duration_before_the_year_one_is_a_clear_error(lake: Path, tmp_path: Path
                                                                      ) -> None:
    for since in ("999999d", "99999999999d"):
        run = fleetpulse("report", "--lake", str(lake), "--since", since,
                         "-o", str(tmp_path / "r.html"))
        _no_traceback(run)
        assert run.returncode == 2
        assert run.stderr.startswith(f"fleetpulse: error: --since {since}") or \
            run.stderr.startswith(f"fleetpulse: error: duration '{since}' is too long"), run.stderr


def test_sql_names_the_views_there_are_for_an_unknown_table(lake: Path) -> None:
    run = fleetpulse("sql", "--lake", str(lake), "SELECT * FROM utilisation")
    assert run.returncode == 2
    assert "Table with name utilisation does not exist" in run.stderr
    assert "The lake has: accelerator_types, actions, alerts, capacity, capacity_snapshots, " \
           "findings, node_state, prices, utilization, withheld, xid, xid_catalog." in run.stderr


def test_serve_sim_with_a_bad_fault_spec_is_the_same_clear_error_as_simulate(tmp_path: Path
                                                                             ) -> None:
    errors = []
    for command in (["serve-sim", "--out", str(tmp_path / "s")], ["simulate", "--to", "stdout"]):
        run = fleetpulse(*command, "--inject", "G1-at-noon")
        _no_traceback(run)
        assert run.returncode == 2
        errors.append(run.stderr)
    assert errors[0] == errors[1] == \
        "fleetpulse: error: fault spec 'G1-at-noon': expected TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]]\n"


@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["sql", "--query", "top_offenders"],
                                     ["report", "-o", "r.html"], ["lake", "status"]],
                         ids=["sql", "sql-canned", "report", "lake-status"])  # fmt: skip
def test_a_folder_holding_no_lake_is_refused_in_one_line(tmp_path: Path, command: list[str]
                                                         ) -> None:
    """It was an empty report dated 1970 (or no rows) and exit 0: a typo in --lake looked
    like a quiet fleet. Now: exit 2, one line naming the folder and what was expected."""
    empty = tmp_path / "not-a-lake"
    (empty / "utilization").mkdir(parents=True)  # a table folder, but no Parquet file in it
    (empty / "notes.txt").write_text("hello")
    for folder, expected in ((empty, f"{empty} holds no lake: expected Parquet files under "
                              "<table>/date=YYYY-MM-DD/hour=HH/ for one of utilization, "),
                             (tmp_path / "missing", f"lake folder {tmp_path / 'missing'} "
                              "does not exist")):  # fmt: skip
        run = fleetpulse(*command, "--lake", str(folder), env={"HOME": str(tmp_path)})
        _no_traceback(run)
        assert run.returncode == 2, run.stdout
        assert run.stderr.startswith(f"fleetpulse: error: {expected}"), run.stderr
        assert run.stderr.count("\n") == 1 and run.stdout == "", run.stderr
    assert not (tmp_path / "r.html").exists()
