"""`fleetpulse capacity` over the fixture lake: the table, the JSON records, the crunch lines. On
both lake backends (local Parquet, Iceberg on s3proxy through FLEETPULSE_LAKE__*), but for the
error of a folder without a local lake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.model import CapacitySnapshot
from pipeline.wire import codec
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake, fixture_writer, settings_env

# a fixture lake: its `--lake` folder and the environment that selects its backend
Stored = tuple[Path, dict[str, str]]


@pytest.fixture(scope="module", params=BACKENDS)
def lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("capacity-cli"))
    return root, settings_env(settings) if settings.uri else {}


# the free rule is off by default (a fleet kept full is healthy): the fixture's is on
FREE_RULE = {"FLEETPULSE_CAPACITY__CRUNCH_FREE_BELOW": "8"}


def capacity(lake: Stored, *args: str, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    root, backend = lake
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "capacity", "--lake", str(root), *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **backend, **(env or {})},
    )  # fmt: skip


def test_json_records_are_capacity_snapshots_with_the_price_they_used(lake: Stored) -> None:
    done = capacity(lake, "--json")
    assert done.returncode == 0, done.stderr
    records = [codec.decode(line.encode(), CapacitySnapshot) for line in done.stdout.splitlines()]
    by_type = {r.accelerator_type: r for r in records}
    assert set(by_type) == {"nvidia-h100-80gb", "nvidia-a100-80gb", "tpu-v5e"}
    h100 = by_type["nvidia-h100-80gb"]
    # g1 and g2, two GPUs each, all allocated; g1 degraded at the end (suspect), g2/1 idles
    assert (h100.devices, h100.healthy, h100.suspect, h100.allocated, h100.allocated_idle) == (
        4, 2, 2, 4, 1
    )  # fmt: skip
    assert h100.quota is not None
    assert (h100.quota.limit, h100.quota.usage) == (fx.QUOTA_LIMIT, fx.QUOTA_USAGE)
    tpu = by_type["tpu-v5e"]
    assert tpu.useful_pct == fx.TPU_BUSY
    assert tpu.price is not None and tpu.price.basis == "on-demand"
    assert tpu.usd_per_useful_hour == round(tpu.price.usd_per_hour * 100 / fx.TPU_BUSY, 4)
    assert json.loads(done.stdout.splitlines()[0])["schema"] == "capacity_snapshot/1"


def test_the_table_and_the_crunch_naming_what_is_short(lake: Stored) -> None:
    done = capacity(lake, "--type", "nvidia-a100-80gb", env=FREE_RULE)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    assert header.split()[:3] == ["Zone", "Type", "Bought"]
    assert row.split()[:5] == ["z-b", "nvidia-a100-80gb", "on-demand", "2", "2"]
    assert "FleetPulseCapacityCrunch z/nvidia-a100-80gb: 2 healthy free devices" in done.stdout
    # no snapshots in the fixture lake: the fold, and it says so
    assert "Capacity folded from the lake's utilization, node states and capacity" in done.stdout
    assert "FleetPulseCapacityCrunch" not in capacity(lake).stdout  # the default: rule off


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_stage_s_snapshots_are_shown_when_the_lake_has_them(
    tmp_path: Path, backend: str
) -> None:
    root, settings = build_fixture_lake(backend, tmp_path / "lake")
    writer = fixture_writer(root, settings)
    for offset, value in enumerate(fx.CAPACITY_SNAPSHOTS):
        writer.add("capacity_snapshots", value, ("t.capacity", 0, offset))
    writer.checkpoint()
    stored = root, settings_env(settings) if settings.uri else {}
    done = capacity(stored, "--json")
    assert done.returncode == 0, done.stderr
    shown = [codec.decode(line.encode(), CapacitySnapshot) for line in done.stdout.splitlines()]
    assert shown == [fx.CAPACITY_SNAPSHOTS[2]]  # z-a's latest; z-c's is hours old
    assert "capacity from the capacity stage's snapshots (fleet.capacity" in done.stderr
    table = capacity(stored)
    assert table.stdout.splitlines()[1].split()[:3] == ["z-a", "nvidia-h100-80gb", "on-demand"]
    assert "newest at 2026-01-01 03:55:00 UTC" in table.stdout


def test_a_folder_without_a_lake_is_a_clear_error(tmp_path: Path) -> None:
    done = capacity((tmp_path, {}))
    assert done.returncode == 2
    assert "holds no lake" in done.stderr


def test_ingest_capacity_reservations_without_credentials_says_what_is_missing(
    tmp_path: Path,
) -> None:
    # HOME without gcloud config, no GOOGLE_APPLICATION_CREDENTIALS, no metadata server
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FLEETPULSE_METRICS__PORT": "0",
        "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path / "state"),
        "GCE_METADATA_HOST": "127.0.0.1:1", "GCE_METADATA_IP": "127.0.0.1:1",
        "FLEETPULSE_CAPACITY__FEEDS": '["reservations"]',
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "ingest", "capacity", "--once", "--stdout"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2
    assert "The Compute Engine API (reservations) needs Google Cloud credentials" in done.stderr
    assert "FLEETPULSE_CAPACITY__COMPUTE_ENDPOINT" in done.stderr
