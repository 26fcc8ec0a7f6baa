"""The capacity analyses over the fixture lake, whose answers are known by construction, on
both lake backends (local Parquet, and Iceberg on s3proxy: tests/iceberg_fixture.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.config import CapacitySettings, LakeSettings
from pipeline.lake.query import Lake
from pipeline.model import CapacityEvent, QuotaInfo
from pipeline.report.capacity import FROM_FOLD, FROM_SNAPSHOTS, lake_snapshots
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake, fixture_writer

START = datetime.fromtimestamp(fx.T0 / 1000, UTC).replace(tzinfo=None)
END = datetime.fromtimestamp(fx.END / 1000, UTC).replace(tzinfo=None)


# a fixture lake: its folder and the settings that open it (the backend's)
Stored = tuple[Path, LakeSettings]


@pytest.fixture(scope="module", params=BACKENDS)
def lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("capacity"))
    writer = fixture_writer(root, settings)
    for offset, (minute, in_use, state) in enumerate(
        [(10, 16, "READY"), (70, 8, "READY"), (130, 12, "READY")]
    ):
        writer.add("capacity", reservation("res-a", minute, 16, in_use, state), ("t.res", 0, offset))
    writer.add("capacity", reservation("res-gone", 20, 8, 0, "READY"), ("t.res", 0, 3))
    writer.add("capacity", reservation("res-gone", 90, 0, 0, "DELETED"), ("t.res", 0, 4))
    writer.checkpoint()
    return root, settings


def reservation(name: str, minute: int, limit: int, usage: int, state: str) -> CapacityEvent:
    return CapacityEvent(
        event_id=f"cap-res-{name}-{minute}", ts=fx.T0 + minute * fx.MINUTE, provider="gcp",
        source="gcp.compute.reservation", kind="RESERVATION_CHANGED", severity="info",
        region="z", zone="z-a", accelerator_type="nvidia-h100-80gb", state=state,
        quota=QuotaInfo(metric=f"projects/p/zones/z-a/reservations/{name}", limit=limit,
                        usage=usage, unit="devices"),
    )  # fmt: skip


def run(lake: Stored, name: str) -> list[dict[str, object]]:
    with Lake(*lake) as opened:
        return opened.run(name, since=START, until=END).records()


def test_accelerator_roi_compares_types_per_useful_pflop_hour(lake: Stored) -> None:
    rows = {r["accelerator_type"]: r for r in run(lake, "accelerator_roi")}
    tpu = rows["tpu-v5e"]
    assert (tpu["device_hours"], tpu["useful_hours"], tpu["bf16_tflops"]) == (16.0, 8.0, 197.0)
    price = float(str(tpu["usd_per_hour"]))
    assert tpu["usd_per_useful_pflop_hour"] == round(1000 * 16 * price / (8 * 197), 3)
    assert rows["nvidia-h100-80gb"]["family"] == "nvidia-hopper"
    assert rows["nvidia-a100-80gb"]["usd_per_useful_hour"] is None  # idle all along
    assert next(iter(rows)) == "tpu-v5e"  # cheapest useful compute first


def test_accelerator_roi_costs_a_job_step_where_jobs_publish_step_times(lake: Stored) -> None:
    rows = {r["accelerator_type"]: r for r in run(lake, "accelerator_roi")}
    h100 = rows["nvidia-h100-80gb"]
    # job-g1: 2 ranks x 0.5 s, job-g2: 2 x 0.25 s a step: 0.75 device-seconds a job step
    # on average, at the H100's list price; a rank computes 0.375 s a step
    price = float(str(h100["usd_per_hour"]))
    assert h100["step_s"] == 0.375
    assert h100["usd_per_1000_job_steps"] == round(1000 * 0.75 * price / 3600, 4)
    assert rows["tpu-v5e"]["step_s"] is None and rows["tpu-v5e"]["usd_per_1000_job_steps"] is None
    assert rows["nvidia-a100-80gb"]["usd_per_1000_job_steps"] is None  # no job there


def test_time_back_in_service_per_stage_and_end_to_end(lake: Stored) -> None:
    rows = {(r["pool"], r["stage"]): r for r in run(lake, "time_back_in_service")}
    slice_out = rows[("tpu", "out of service (end to end)")]
    assert (slice_out["done"], slice_out["p50_min"]) == (1, 30.0)  # s1: T0+1h to T0+1h30
    assert rows[("tpu", "cordoned")]["p95_min"] == 30.0


def test_reservations_latest_figures_and_the_deleted_left_out(lake: Stored) -> None:
    rows = run(lake, "reservations")
    assert [(r["reservation"], r["reserved"], r["in_use"], r["unused"], r["changes"])
            for r in rows] == [("res-a", 16.0, 12.0, 4.0, 3)]  # fmt: skip


def test_quota_headroom_leaves_reservations_out(lake: Stored) -> None:
    # a reservation's figures ride in quota_*: they are no quota
    assert [r["quota_metric"] for r in run(lake, "quota_headroom") if r["zone"] == "z-a"] == [
        "NVIDIA_H100_GPUS"
    ]


def test_quota_outlook_needs_enough_points_for_a_forecast(lake: Stored) -> None:
    (row,) = run(lake, "quota_outlook")
    assert (row["usage"], row["headroom"], row["points"]) == (50.0, 14.0, 2)
    assert row["hours_left"] is None  # two points are no trend to bet on
    assert row["trend_per_h"] == round(10 / (110 / 60), 3)


def test_capacity_timeline_splits_devices_by_status(lake: Stored) -> None:
    first = [r for r in run(lake, "capacity_timeline") if r["bucket"] == START]
    by_zone = {(r["zone"], r["accelerator"]): (r["out_of_service"], r["allocated"], r["free"])
               for r in first}  # fmt: skip
    assert by_zone[("z-a", fx.H100)] == (0, 4, 0)
    assert by_zone[("z-b", fx.A100)] == (0, 0, 2)


# --- the capacity stage's snapshots (fleet.capacity → capacity_snapshots) ------------------

@pytest.fixture(scope="module", params=BACKENDS)
def snap_lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Stored:
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("snapshots"))
    writer = fixture_writer(root, settings)
    for offset, value in enumerate(fx.CAPACITY_SNAPSHOTS):
        writer.add("capacity_snapshots", value, ("t.capacity", 0, offset))
    writer.checkpoint()
    return root, settings


def test_the_stage_s_latest_snapshot_per_key_is_what_capacity_shows(snap_lake: Stored) -> None:
    with Lake(*snap_lake) as lake:
        shown = lake_snapshots(lake, END, CapacitySettings())
        latest = {r["zone"]: r for r in lake.run("capacity_now", since=START, until=END).records()}
        older = lake_snapshots(lake, END - timedelta(hours=2), CapacitySettings())
    # read back exactly as published (nested structs from their columns; no quota: None)
    assert (shown.source, shown.snapshots) == (FROM_SNAPSHOTS, [fx.CAPACITY_SNAPSHOTS[2]])
    assert "newest at 2026-01-01 03:55:00 UTC" in shown.words()
    # the canned query: each key's latest in the period, z-c's too (its only one)
    now = latest["z-a"]
    assert (now["healthy_free"], now["out_of_service"], latest["z-c"]["healthy_free"]) == (3, 1, 6)
    assert now["quota_headroom"] is None and now["price_basis"] == "on-demand"
    # two hours before the end, the newest snapshot is 1 h old (over 2 intervals): the fold
    assert older.source == FROM_FOLD and "folded from" in older.words()
    assert {s.zone for s in older.snapshots} == {"z-a", "z-b"}


def test_capacity_timeline_reads_snapshots_when_there_are_any(snap_lake: Stored) -> None:
    with Lake(*snap_lake) as lake:
        rows = lake.run("capacity_timeline", since=START, until=END).records()
        pool = lake.run("capacity_timeline", since=START, until=END, pool="train").records()
    assert {r["source"] for r in rows} == {"snapshots"}
    by_bucket = {(r["bucket"].hour, r["zone"]): (r["devices"], r["out_of_service"], r["free"])
                 for r in rows}  # fmt: skip
    # each key's last snapshot in its bucket: z-c at 01:00, z-a at 03:55
    assert by_bucket == {(1, "z-c"): (8, 1, 6), (3, "z-a"): (8, 1, 3)}
    assert rows[0]["accelerator"] == "nvidia-h100-80gb"
    # snapshots have no pool: a pool's timeline is utilization's
    assert {r["source"] for r in pool} == {"utilization"}
    assert {r["zone"] for r in pool} == {"z-a"}
