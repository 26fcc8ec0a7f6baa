"""The cloudmon parser: ListTimeSeries TimeSeries → TpuSamples; what it refuses and why."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import monitoring_v3

from pipeline.model import TpuSample
from pipeline.sources.cloudmon import parse_time_series
from pipeline.sources.tpu_hosts import TpuWorker

WORKER = TpuWorker(
    cluster="gke-tpu",
    node="tpu-w1",
    pool="v5p-pool",
    zone="us-east5-a",
    slice="v5p-16-a",
    accelerator_type="v5p-16",
    topology="2x2x2",
    worker_id=1,
    instance_id="1234567890123456789",
)
INVENTORY = {(WORKER.zone, WORKER.instance_id): WORKER}
DUTY = "tpu.googleapis.com/accelerator/duty_cycle"
USED = "tpu.googleapis.com/accelerator/memory_used"


def _series(metric_type: str, points: list[tuple[int, Any]], **changes: Any) -> Any:
    resource = {"resource_container": "p", "location": WORKER.zone, "worker_id": WORKER.instance_id}
    series: dict[str, Any] = {
        "metric": {"type": metric_type, "labels": {"accelerator_id": f"{WORKER.instance_id}-2"}},
        "resource": {"type": "tpu_worker", "labels": resource},
        "points": [
            {
                "interval": {"end_time": {"seconds": ms // 1000, "nanos": ms % 1000 * 10**6}},
                "value": value,
            }
            for ms, value in points
        ],
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        series[section][field] = value
    return monitoring_v3.TimeSeries(series)


def test_points_of_one_worker_and_time_make_one_sample() -> None:
    t0 = 1_764_424_800_000
    parsed = parse_time_series(
        [
            _series(DUTY, [(t0 + 10_000, {"double_value": 97.5}), (t0, {"double_value": 12.0})]),
            _series(USED, [(t0, {"int64_value": 2**34})]),
        ],
        INVENTORY,
    )
    assert parsed.bad == []
    first, second = parsed.events
    assert isinstance(first, TpuSample) and isinstance(second, TpuSample)
    assert (first.ts, second.ts) == (t0, t0 + 10_000)  # oldest first, newest-first input
    [chip] = first.chips
    # device ordinal 2 of worker 1 in a 2x2x2 slice: the host's third chip by chip id
    assert (chip.chip_id, chip.coords) == (5, [1, 0, 1])
    assert chip.metrics == {"duty_cycle_pct": 12.0, "hbm_used_bytes": float(2**34)}
    assert (first.node, first.slice, first.worker_id) == ("tpu-w1", "v5p-16-a", 1)


@pytest.mark.parametrize(
    ("series", "field"),
    [
        (
            _series("tpu.googleapis.com/other", [(1_764_424_800_000, {"double_value": 1})]),
            "metric.type",
        ),
        (
            _series(
                DUTY, [(1_764_424_800_000, {"double_value": 1})], resource__type="gce_instance"
            ),
            "resource.type",
        ),
        (
            _series(
                DUTY,
                [(1_764_424_800_000, {"double_value": 1})],
                resource__labels={"location": "x", "worker_id": "1"},
            ),
            "resource.labels",
        ),
        (
            _series(
                DUTY,
                [(1_764_424_800_000, {"double_value": 1})],
                metric__labels={"accelerator_id": "other-0"},
            ),
            "accelerator_id",
        ),
        (_series(DUTY, [(1_764_424_800_000, {"string_value": "busy"})]), "value"),
    ],
)
def test_refused_series_are_bad_records(series: Any, field: str) -> None:
    parsed = parse_time_series([series], INVENTORY)
    assert parsed.events == []
    [bad] = parsed.bad
    assert field in bad.error.field
    assert "expected" in str(bad.error) and bad.raw


def test_a_device_the_host_does_not_have_is_refused() -> None:
    series = _series(
        DUTY,
        [(1_764_424_800_000, {"double_value": 1})],
        metric__labels={"accelerator_id": f"{WORKER.instance_id}-9"},
    )
    parsed = parse_time_series([series], INVENTORY)
    [bad] = parsed.bad
    assert "ordinal 9" in bad.error.got
