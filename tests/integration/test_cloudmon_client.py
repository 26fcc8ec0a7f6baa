"""The real google-cloud-monitoring MetricServiceClient against the gRPC stand-in.

Proves the stand-in speaks ListTimeSeries as the client expects (filter, half-open interval,
newest-first points, paging through next_page_token, HEADERS view, errors as gRPC statuses)
and that the cloudmon source turns what the client yields back into the TpuSamples served.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
from google.api_core import exceptions
from google.cloud import monitoring_v3
from google.cloud.monitoring_v3.services.metric_service.transports import (
    MetricServiceGrpcTransport,
)

from pipeline.config import SimSettings, SourcesSettings
from pipeline.model import CapacityEvent, TpuChipReading, TpuSample
from pipeline.sim.endpoints.cloud_monitoring import CloudMonitoringStandIn
from pipeline.sim.engine import Simulation
from pipeline.sources.cloudmon import CloudMonitoringSource
from pipeline.sources.tpu_hosts import host_chips

PROJECT = "fleetpulse-test"
T0 = 1_764_424_800_000
DUTY = "tpu.googleapis.com/accelerator/duty_cycle"
HBM_USED = "tpu.googleapis.com/accelerator/memory_used"


def _samples(steps: int, rng: random.Random) -> list[TpuSample]:
    samples = []
    for step in range(steps):
        for worker in (0, 1):
            chips = [
                TpuChipReading(
                    chip_id=chip_id,
                    coords=coords,
                    metrics={
                        "duty_cycle_pct": round(rng.uniform(0, 100), 3),
                        "tensorcore_util": round(rng.uniform(0, 100), 3),
                        "hbm_used_bytes": float(rng.randint(0, 95 * 2**30)),
                        "hbm_total_bytes": float(95 * 2**30),
                    },
                )
                for chip_id, coords in host_chips("v5p-16", "2x2x2", worker)
            ]
            samples.append(
                TpuSample(
                    ts=T0 + 10_000 * step + worker,
                    cluster="gke-tpu",
                    node=f"gke-tpu-v5p-pool-w{worker}",
                    pool="v5p-pool",
                    zone="us-east5-a",
                    slice="v5p-16-slice-a",
                    accelerator_type="v5p-16",
                    topology="2x2x2",
                    worker_id=worker,
                    chips=chips,
                )
            )
    return samples


@pytest.fixture(scope="module")
def served() -> list[TpuSample]:
    return _samples(5, random.Random(11))


@pytest.fixture(scope="module")
def stand_in(served: list[TpuSample]) -> Iterator[CloudMonitoringStandIn]:
    with CloudMonitoringStandIn(project=PROJECT) as server:
        for sample in served:
            server.record(sample)
        yield server


@pytest.fixture(scope="module")
def client(stand_in: CloudMonitoringStandIn) -> Iterator[monitoring_v3.MetricServiceClient]:
    channel = grpc.insecure_channel(stand_in.address)
    yield monitoring_v3.MetricServiceClient(transport=MetricServiceGrpcTransport(channel=channel))
    channel.close()


def _list(client: monitoring_v3.MetricServiceClient, **request: Any) -> list[Any]:
    request.setdefault("name", f"projects/{PROJECT}")
    request.setdefault("interval", {"start_time": {"seconds": 0}, "end_time": {"seconds": 2**33}})
    pager = client.list_time_series(request=request, timeout=5.0, retry=None)
    return list(pager)


def _ms(point: Any) -> int:
    return round(point.interval.end_time.timestamp() * 1000)


def test_source_reads_back_what_was_served(
    stand_in: CloudMonitoringStandIn, served: list[TpuSample], tmp_path: Path
) -> None:
    settings = SourcesSettings(
        cloudmon_endpoint=stand_in.address,
        cloudmon_project=PROJECT,
        cloudmon_lag_s=0.0,
        cloudmon_max_lookback_s=3600.0,
        cloudmon_page_size=7,  # forces several pages per metric type
        state_dir=str(tmp_path),
    )
    inventory = {(w.zone, w.instance_id): w for w in stand_in.workers()}
    end = max(s.ts for s in served)
    source = CloudMonitoringSource(settings, inventory=inventory, clock=lambda: end / 1000 + 1)
    batch = source.poll()
    source.close()
    assert batch.bad == []
    assert sorted(batch.events, key=lambda e: (e.ts, e.node)) == served  # type: ignore[attr-defined]
    paged = [r for r in stand_in.requests if r.page_token]
    assert paged, "the pager followed next_page_token"


def test_points_are_newest_first_and_pages_lose_nothing(
    client: monitoring_v3.MetricServiceClient, served: list[TpuSample]
) -> None:
    whole = _list(client, filter=f'metric.type = "{DUTY}"', page_size=100_000)
    paged = _list(client, filter=f'metric.type = "{DUTY}"', page_size=3)
    for series in whole:
        stamps = [_ms(p) for p in series.points]
        assert stamps == sorted(stamps, reverse=True)

    def points(listing: list[Any]) -> list[tuple[str, int, float]]:
        return sorted(
            (s.metric.labels["accelerator_id"], _ms(p), p.value.double_value)
            for s in listing
            for p in s.points
        )

    assert points(paged) == points(whole)
    assert len(points(whole)) == len(served) * 4  # 4 chips per host sample
    assert len(paged) > len(whole), "series cut by a page boundary continue on the next page"


def test_filter_on_resource_labels_and_interval_is_half_open(
    client: monitoring_v3.MetricServiceClient, stand_in: CloudMonitoringStandIn
) -> None:
    worker = stand_in.workers()[1]
    one = _list(
        client,
        filter=f'metric.type = "{HBM_USED}" AND resource.labels.worker_id = "{worker.instance_id}"',
    )
    assert {s.resource.labels["worker_id"] for s in one} == {worker.instance_id}
    assert {s.resource.type for s in one} == {"tpu_worker"}
    assert {s.value_type for s in one} == {2}  # INT64, as the real memory_used is
    others = _list(
        client,
        filter=f'metric.type = "{HBM_USED}" AND resource.label.worker_id != "{worker.instance_id}"',
    )
    assert worker.instance_id not in {s.resource.labels["worker_id"] for s in others}
    assert len(one) + len(others) == 8

    # (start, end]: a point exactly at start is out, a point exactly at end is in
    start, end = T0 + 10_000, T0 + 30_000
    window = _list(
        client,
        filter=f'metric.type = "{DUTY}" AND resource.labels.worker_id = "{stand_in.workers()[0].instance_id}"',
        interval={"start_time": {"seconds": start // 1000}, "end_time": {"seconds": end // 1000}},
    )
    assert {_ms(p) for s in window for p in s.points} == {T0 + 20_000, T0 + 30_000}


def test_headers_view_has_no_points(client: monitoring_v3.MetricServiceClient) -> None:
    headers = _list(
        client,
        filter=f'metric.type = "{DUTY}"',
        view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.HEADERS,
        page_size=3,
    )
    assert len(headers) == 8
    assert all(len(s.points) == 0 for s in headers)


@pytest.mark.parametrize(
    ("request_fields", "error"),
    [
        ({"filter": 'resource.type = "tpu_worker"'}, exceptions.InvalidArgument),
        ({"filter": f'metric.type = starts_with("{DUTY}")'}, exceptions.InvalidArgument),
        ({"filter": f'metric.type = "{DUTY}"', "name": "projects/other"}, exceptions.NotFound),
        (
            {"filter": f'metric.type = "{DUTY}"', "page_token": "bm90IGEgdG9rZW4="},
            exceptions.InvalidArgument,
        ),
    ],
)
def test_bad_requests_are_grpc_errors(
    client: monitoring_v3.MetricServiceClient,
    request_fields: dict[str, Any],
    error: type[Exception],
) -> None:
    with pytest.raises(error):
        _list(client, **request_fields)


def _without_jobs(sample: TpuSample) -> TpuSample:
    # Cloud Monitoring's tpu_worker metrics do not say which job runs on a chip
    chips = [msgspec.structs.replace(chip, job=None) for chip in sample.chips]
    return msgspec.structs.replace(sample, chips=chips)


def test_simulated_slice_reads_back_through_the_client(tmp_path: Path) -> None:
    settings = SimSettings(
        seed=5,
        duration_s=40,
        gpu_nodes=0,
        tpu_slices=2,
        clusters=1,
        tpu_slice_types=("v5p-16:2x2x2", "v5litepod-16:4x4"),
        random_faults=False,
    )
    sim = Simulation(settings)
    samples = [e for e in sim.events() if isinstance(e, TpuSample)]
    assert {len(s.chips) for s in samples} == {4, 8}  # v5p: 4 chips per host, v5e: 8
    with CloudMonitoringStandIn(project=PROJECT) as server:
        for sample in samples:
            server.record(sample)
        config = SourcesSettings(
            cloudmon_endpoint=server.address,
            cloudmon_project=PROJECT,
            cloudmon_lag_s=0.0,
            cloudmon_page_size=50,
            state_dir=str(tmp_path),
        )
        inventory = {(w.zone, w.instance_id): w for w in server.workers()}
        end_s = max(s.ts for s in samples) / 1000
        source = CloudMonitoringSource(config, inventory=inventory, clock=lambda: end_s + 1)
        batch = source.poll()
        source.close()
    assert batch.bad == []
    assert sorted(batch.events, key=_order) == sorted(map(_without_jobs, samples), key=_order)


def _order(event: Any) -> tuple[int, str]:
    return event.ts, event.node


# --- GKE: the same slices as k8s_node / k8s_container, and interruption counts ---------------


def _read(server: CloudMonitoringStandIn, mode: str, end_s: float, state: Path) -> Any:
    config = SourcesSettings(
        cloudmon_endpoint=server.address,
        cloudmon_project=PROJECT,
        cloudmon_lag_s=0.0,
        cloudmon_page_size=50,
        cloudmon_mode=mode,  # type: ignore[arg-type]
        state_dir=str(state),
    )
    inventory = {(w.zone, w.instance_id): w for w in server.workers()}
    source = CloudMonitoringSource(config, inventory=inventory, clock=lambda: end_s + 1)
    try:
        return source.poll()
    finally:
        source.close()


def _duty_rounded(sample: TpuSample) -> TpuSample:
    # GKE's duty_cycle is an integer percent (kubelet); every other reading is the same value
    chips = [
        msgspec.structs.replace(
            chip,
            metrics={
                **chip.metrics,
                "duty_cycle_pct": float(round(chip.metrics["duty_cycle_pct"])),
            },
        )
        for chip in sample.chips
    ]
    return msgspec.structs.replace(sample, chips=chips)


def test_gke_nodes_read_back_as_the_tpu_worker_samples(tmp_path: Path) -> None:
    settings = SimSettings(
        seed=7,
        duration_s=40,
        gpu_nodes=0,
        tpu_slices=2,
        clusters=1,
        tpu_slice_types=("v5p-16:2x2x2", "v5litepod-16:4x4"),
        random_faults=False,
    )
    samples = [e for e in Simulation(settings).events() if isinstance(e, TpuSample)]
    with CloudMonitoringStandIn(project=PROJECT, gke=True) as server:
        for sample in samples:
            server.record(sample)
        end_s = max(s.ts for s in samples) / 1000
        vm = _read(server, "tpu-vm", end_s, tmp_path / "vm")
        gke = _read(server, "gke", end_s, tmp_path / "gke")
        types = {r.filter.split('"')[1] for r in server.requests}
    assert vm.bad == [] and gke.bad == []
    assert vm.events and len(gke.events) == len(vm.events)
    assert sorted(gke.events, key=_order) == sorted(map(_duty_rounded, vm.events), key=_order)
    assert sorted(vm.events, key=_order) == sorted(map(_without_jobs, samples), key=_order)
    assert {
        "kubernetes.io/node/accelerator/duty_cycle",
        "kubernetes.io/container/accelerator/tensorcore_utilization",
        "kubernetes.io/node_pool/interruption_count",
    } <= types


def test_gke_series_carry_the_published_labels(tmp_path: Path) -> None:
    with CloudMonitoringStandIn(project=PROJECT, gke=True) as server:
        sample = _samples(1, random.Random(3))[0]
        chips = [msgspec.structs.replace(c, job="train-a") for c in sample.chips]
        server.record(msgspec.structs.replace(sample, chips=chips))
        channel = grpc.insecure_channel(server.address)
        client = monitoring_v3.MetricServiceClient(
            transport=MetricServiceGrpcTransport(channel=channel)
        )
        node = _list(client, filter='metric.type = "kubernetes.io/node/accelerator/memory_used"')
        container = _list(
            client,
            filter='metric.type = "kubernetes.io/container/accelerator/duty_cycle" '
            'AND resource.type = "k8s_container"',
        )
        channel.close()
    assert {s.resource.type for s in node} == {"k8s_node"}
    assert set(node[0].resource.labels) == {"project_id", "location", "cluster_name", "node_name"}
    assert set(node[0].metric.labels) == {"accelerator_id", "make", "model", "tpu_topology"}
    assert (node[0].metric.labels["make"], node[0].metric.labels["model"]) == (
        "cloud-tpu",
        "tpu-v5p-slice",
    )
    assert {s.resource.labels["node_name"] for s in node} == {sample.node}
    assert len(container) == 4 and {s.value_type for s in container} == {2}  # INT64
    assert set(container[0].resource.labels) == {
        "project_id",
        "location",
        "cluster_name",
        "node_name",
        "namespace_name",
        "pod_name",
        "container_name",
    }


@pytest.mark.parametrize(("mode", "source"), [("gke", "gke.node_pool"), ("tpu-vm", "gcp.tpu.node")])
def test_slice_interruptions_become_capacity_events(mode: str, source: str, tmp_path: Path) -> None:
    served = _samples(1, random.Random(5))
    first = served[0]
    preempted = CapacityEvent(
        event_id="sim-1",
        ts=T0 + 5_000,
        provider="gcp",
        source="gcp.tpu.node",
        kind="PREEMPTION",
        severity="warning",
        region="us-east5",
        zone=first.zone,
        cluster=first.cluster,
        pool=first.pool,
        target_kind="slice",
        target=first.slice,
        accelerator_type=first.accelerator_type,
    )
    with CloudMonitoringStandIn(project=PROJECT, gke=True) as server:
        for sample in served:
            server.record(sample)
        server.record_capacity(preempted)
        batch = _read(server, mode, (T0 + 10_000) / 1000, tmp_path)
    assert batch.bad == []
    [event] = [e for e in batch.events if isinstance(e, CapacityEvent)]
    assert (event.ts, event.kind, event.source) == (preempted.ts, "PREEMPTION", source)
    assert (event.target_kind, event.target, event.cluster, event.pool, event.zone) == (
        "slice",
        first.slice,
        first.cluster,
        first.pool,
        first.zone,
    )
