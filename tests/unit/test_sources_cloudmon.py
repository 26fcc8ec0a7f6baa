"""The cloudmon parser: ListTimeSeries TimeSeries → TpuSamples; what it refuses and why."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from google.cloud import monitoring_v3

from pipeline.model import CapacityEvent, TpuSample
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


# --- GKE: k8s_node / k8s_container / k8s_node_pool ------------------------------------------

T0 = 1_764_424_800_000
NODE = {
    "project_id": "p",
    "location": "us-east5",  # a regional cluster: location is not the node's zone
    "cluster_name": WORKER.cluster,
    "node_name": WORKER.node,
}
CONTAINER = {**NODE, "namespace_name": "ml", "pod_name": "train-0", "container_name": "jax"}
GKE_LABELS = {
    "accelerator_id": f"{WORKER.instance_id}-2",
    "make": "cloud-tpu",
    "model": "tpu-v5p-slice",
    "tpu_topology": "2x2x2",
}


def _gke(metric_type: str, resource_type: str, labels: dict[str, str], value: Any) -> Any:
    return _series(
        metric_type,
        [(T0, value)],
        resource__type=resource_type,
        resource__labels=labels,
        metric__labels=GKE_LABELS,
    )


def test_gke_node_series_make_the_same_sample_as_tpu_worker() -> None:
    via_worker = parse_time_series(
        [
            _series(DUTY, [(T0, {"double_value": 97.0})]),
            _series(USED, [(T0, {"int64_value": 2**34})]),
            _series(
                "tpu.googleapis.com/accelerator/tensorcore_utilization",
                [(T0, {"double_value": 25.5})],
            ),
        ],
        INVENTORY,
    )
    via_node = parse_time_series(
        [
            _gke(
                "kubernetes.io/node/accelerator/duty_cycle", "k8s_node", NODE, {"int64_value": 97}
            ),
            _gke(
                "kubernetes.io/node/accelerator/memory_used",
                "k8s_node",
                NODE,
                {"int64_value": 2**34},
            ),
            _gke(
                "kubernetes.io/node/accelerator/tensorcore_utilization",
                "k8s_node",
                NODE,
                {"double_value": 25.5},
            ),
        ],
        INVENTORY,
    )
    assert via_node.bad == [] and via_worker.bad == []
    assert via_node.events == via_worker.events
    [sample] = via_node.events
    assert isinstance(sample, TpuSample)
    assert (sample.node, sample.slice, sample.zone, sample.chips[0].chip_id) == (
        WORKER.node,
        WORKER.slice,
        WORKER.zone,  # the host's zone from the inventory, not the cluster's location
        5,
    )


def test_container_series_fill_in_but_never_override_the_node() -> None:
    node_duty = _gke(
        "kubernetes.io/node/accelerator/duty_cycle", "k8s_node", NODE, {"int64_value": 40}
    )
    # at pod handover two containers report the same chip; the node's value stands
    container_duty = _gke(
        "kubernetes.io/container/accelerator/duty_cycle",
        "k8s_container",
        CONTAINER,
        {"int64_value": 80},
    )
    container_bw = _gke(
        "kubernetes.io/container/accelerator/memory_bandwidth_utilization",
        "k8s_container",
        CONTAINER,
        {"double_value": 61.25},
    )
    for order in (
        [container_duty, node_duty, container_bw],
        [node_duty, container_bw, container_duty],
    ):
        parsed = parse_time_series(order, INVENTORY)
        [sample] = parsed.events
        assert isinstance(sample, TpuSample)
        assert sample.chips[0].metrics == {"duty_cycle_pct": 40.0, "memory_bandwidth_util": 61.25}
        assert sample.chips[0].job is None


def test_gke_series_of_a_node_not_in_the_inventory_or_on_the_wrong_resource_are_refused() -> None:
    unknown = _gke(
        "kubernetes.io/node/accelerator/duty_cycle",
        "k8s_node",
        {**NODE, "node_name": "gke-cpu-pool-1"},
        {"int64_value": 1},
    )
    wrong = _gke(
        "kubernetes.io/container/accelerator/duty_cycle", "k8s_node", NODE, {"int64_value": 1}
    )
    parsed = parse_time_series([unknown, wrong], INVENTORY)
    assert parsed.events == []
    assert sorted(bad.error.field for bad in parsed.bad) == ["resource.labels", "resource.type"]
    assert "gke-cpu-pool-1" in parsed.bad[0].error.got + parsed.bad[1].error.got


def test_tensorcore_idle_duration_is_a_chip_reading() -> None:
    parsed = parse_time_series(
        [_series("tpu.googleapis.com/tpu/tensorcore/idle_duration", [(T0, {"int64_value": 42})])],
        INVENTORY,
    )
    [sample] = parsed.events
    assert isinstance(sample, TpuSample)
    assert sample.chips[0].metrics == {"tensorcore_idle_s": 42.0}


SECOND_HOST = msgspec.structs.replace(
    WORKER, node="tpu-w0", worker_id=0, instance_id="1234567890123456788"
)
POOL_INVENTORY = {**INVENTORY, (SECOND_HOST.zone, SECOND_HOST.instance_id): SECOND_HOST}
POOL = {
    "project_id": "p",
    "location": "us-east5",
    "cluster_name": WORKER.cluster,
    "node_pool_name": WORKER.pool,
}


def _interruptions(
    metric_type: str, resource_type: str, resource: dict[str, str], kind: str, counts: list[int]
) -> Any:
    return _series(
        metric_type,
        [(T0 + 60_000 * i, {"int64_value": n}) for i, n in enumerate(counts)],
        resource__type=resource_type,
        resource__labels=resource,
        metric__labels={"interruption_type": kind, "interruption_reason": "HostError"},
    )


@pytest.mark.parametrize(
    ("kind", "expected", "severity"),
    [
        ("PreemptionEvent", "PREEMPTION", "warning"),
        ("MaintenanceEvent", "MAINTENANCE_STARTED", "warning"),
        ("TerminationEvent", "HOST_ERROR", "critical"),
    ],
)
def test_node_pool_interruptions_become_one_slice_event_per_point(
    kind: str, expected: str, severity: str
) -> None:
    series = _interruptions(
        "kubernetes.io/node_pool/interruption_count", "k8s_node_pool", POOL, kind, [0, 1, 0, 2]
    )
    parsed = parse_time_series([series], POOL_INVENTORY)
    assert parsed.bad == []
    # quiet periods (0) say nothing; the pool's two hosts are one slice: one event per point
    assert [e.ts for e in parsed.events] == [T0 + 60_000, T0 + 180_000]
    for event in parsed.events:
        assert isinstance(event, CapacityEvent)
        assert (event.kind, event.severity, event.source) == (expected, severity, "gke.node_pool")
        assert (event.target_kind, event.target, event.cluster, event.pool) == (
            "slice",
            WORKER.slice,
            WORKER.cluster,
            WORKER.pool,
        )
        assert (event.zone, event.region, event.error_code) == (
            "us-east5-a",
            "us-east5",
            "HostError",
        )
    assert len({e.event_id for e in parsed.events}) == 2


def test_node_and_tpu_worker_interruptions_name_the_slice_once() -> None:
    worker = {"resource_container": "p", "location": WORKER.zone, "worker_id": WORKER.instance_id}
    parsed = parse_time_series(
        [
            _interruptions(
                "kubernetes.io/node/interruption_count", "k8s_node", NODE, "PreemptionEvent", [1]
            ),
            _interruptions(
                "kubernetes.io/node/interruption_count",
                "k8s_node",
                {**NODE, "node_name": SECOND_HOST.node},
                "PreemptionEvent",
                [1],
            ),
            _interruptions(
                "tpu.googleapis.com/instance/interruption_count",
                "tpu_worker",
                worker,
                "PreemptionEvent",
                [1],
            ),
        ],
        POOL_INVENTORY,
    )
    assert parsed.bad == []
    assert sorted((e.source, e.target) for e in parsed.events) == [  # type: ignore[attr-defined]
        ("gcp.tpu.node", WORKER.slice),
        ("gke.node", WORKER.slice),
    ]


def test_unknown_interruption_types_and_pools_are_bad_records() -> None:
    parsed = parse_time_series(
        [
            _interruptions(
                "kubernetes.io/node_pool/interruption_count",
                "k8s_node_pool",
                POOL,
                "Unplanned",
                [1],
            ),
            _interruptions(
                "kubernetes.io/node_pool/interruption_count",
                "k8s_node_pool",
                {**POOL, "node_pool_name": "cpu-pool"},
                "PreemptionEvent",
                [1],
            ),
        ],
        POOL_INVENTORY,
    )
    assert parsed.events == []
    assert sorted(bad.error.field for bad in parsed.bad) == [
        "metric.labels.interruption_type",
        "resource.labels",
    ]
