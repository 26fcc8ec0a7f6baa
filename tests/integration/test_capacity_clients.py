"""`ingest capacity` through the real client libraries against the stand-ins.

google-cloud-monitoring (gRPC) reads the quota metrics, google-cloud-tpu (v2alpha1, gRPC) lists
nodes and queued resources, google-cloud-compute (REST) lists instances, and the metadata
feed long-polls the metadata-server stand-in. The stand-ins' state is set with the simulator's
own CapacityEvents, so what goes in is what the simulator writes to fleet.events.capacity.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.config import CapacitySettings, SimSettings, SourcesSettings
from pipeline.errors import SourceError
from pipeline.model import CapacityEvent, Inventory, MaintenanceWindow, QuotaInfo, Target
from pipeline.sim.endpoints.cloud_monitoring import CloudMonitoringStandIn
from pipeline.sim.endpoints.compute_api import ComputeStandIn
from pipeline.sim.endpoints.metadata_server import MetadataServerStandIn
from pipeline.sim.endpoints.tpu_api import TpuApiStandIn
from pipeline.sim.fleet import Fleet, build_fleet
from pipeline.sources.capacity import CapacitySource

PROJECT = "fleetpulse-test"
T0 = 1_764_424_800_000
MIN = 60_000


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return build_fleet(
        SimSettings(seed=4, gpu_nodes=3, tpu_slices=2, clusters=1, random_faults=False)
    )


def _event(kind: str, zone: str, ts: int, **fields: object) -> CapacityEvent:
    return CapacityEvent(
        event_id=f"cap-{kind}-{ts}",
        ts=ts,
        provider="gcp",
        source=str(fields.pop("source", "gcp.compute.maintenance")),
        kind=kind,  # type: ignore[arg-type]
        severity="warning",
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        **fields,  # type: ignore[arg-type]
    )


def _source(tmp_path: Path, clock: list[float], **config: object) -> CapacitySource:
    settings = CapacitySettings(project=PROJECT, quota_lag_s=0, page_size=1, **config)  # type: ignore[arg-type]
    return CapacitySource(
        settings,
        SourcesSettings(state_dir=str(tmp_path)),
        once=not config.get("metadata_wait_s"),
        clock=lambda: clock[0],
    )


def _poll(source: CapacitySource) -> tuple[list[CapacityEvent], list[Inventory]]:
    batch = source.poll()
    assert not batch.bad, batch.bad
    source.commit(batch.position)
    capacity = [e for e in batch.events if isinstance(e, CapacityEvent)]
    return capacity, [e for e in batch.events if isinstance(e, Inventory)]


# --- quota: Cloud Monitoring ----------------------------------------------------------------


def _quota(kind: str, zone: str, ts: int, metric: str, usage: float, limit: float) -> CapacityEvent:
    return _event(
        kind, zone, ts, source="gcp.monitoring.quota",
        quota=QuotaInfo(metric=metric, usage=usage, limit=limit),
    )


def test_quota_usage_limit_changes_and_exceeded_round_trip(tmp_path: Path) -> None:
    gpus, chips = "compute.googleapis.com/nvidia_h100_80gb_gpus", "tpu.googleapis.com/v5p_chips"
    served = [
        _quota("QUOTA_USAGE", "us-east5-a", T0, gpus, 48, 64),
        _quota("QUOTA_USAGE", "us-east5-a", T0, chips, 16, 32),
        _quota("QUOTA_USAGE", "us-east5-a", T0 + MIN, gpus, 64, 64),
        _quota("QUOTA_EXCEEDED", "us-east5-a", T0 + MIN, gpus, 64, 64),
        _quota("QUOTA_CHANGED", "us-east5-a", T0 + 2 * MIN, gpus, 64, 80),
        _quota("QUOTA_USAGE", "us-east5-a", T0 + 3 * MIN, gpus, 70, 80),
    ]
    clock = [(T0 + 90_000) / 1000]
    with CloudMonitoringStandIn(project=PROJECT) as server:
        for event in served:
            server.record_capacity(event)
        source = _source(
            tmp_path, clock, feeds=("quota",), monitoring_endpoint=server.address,
            quota_lookback_s=600,
        )
        first, _ = _poll(source)
        clock[0] = (T0 + 10 * MIN) / 1000
        second, _ = _poll(source)
        source.close()
    seen = [(e.kind, e.ts, e.quota.metric, e.quota.usage, e.quota.limit) for e in first + second if e.quota]
    assert seen == [
        ("QUOTA_USAGE", T0, gpus, 48, 64),
        ("QUOTA_USAGE", T0, chips, 16, 32),
        ("QUOTA_EXCEEDED", T0 + MIN, gpus, 64, 64),
        ("QUOTA_USAGE", T0 + MIN, gpus, 64, 64),
        ("QUOTA_CHANGED", T0 + 2 * MIN, gpus, 0, 80),
        ("QUOTA_USAGE", T0 + 3 * MIN, gpus, 70, 80),
    ]
    assert {e.zone for e in first + second} == {"us-east5-a"}
    assert all(e.source == "gcp.monitoring.quota" for e in first + second)


def test_a_regional_quota_is_said_for_each_configured_zone_of_the_region(tmp_path: Path) -> None:
    gpus = "compute.googleapis.com/nvidia_h200_141gb_gpus"
    with CloudMonitoringStandIn(project=PROJECT) as server:
        server.record_capacity(_quota("QUOTA_USAGE", "us-east5-a", T0, gpus, 8, 16))
        # the stand-in keys series by the event's zone; a region is what a regional quota says
        server.record_capacity(
            _quota("QUOTA_EXCEEDED", "us-east5", T0, gpus, 16, 16)  # type: ignore[arg-type]
        )
        source = _source(
            tmp_path, [(T0 + MIN) / 1000], feeds=("quota",), monitoring_endpoint=server.address,
            zones=("us-east5-a", "us-east5-b", "europe-west4-a"), quota_lookback_s=600,
        )
        events, _ = _poll(source)
        source.close()
    exceeded = sorted(e.zone for e in events if e.kind == "QUOTA_EXCEEDED")
    assert exceeded == ["us-east5-a", "us-east5-b"]


def test_project_wide_and_tpu_quotas_are_read_and_cpu_disk_quotas_skipped(
    tmp_path: Path,
) -> None:
    # the services' own quota metrics, served as Cloud Monitoring serves them; the stand-in
    # keys a series by the event's zone, here a location: `global`, a region or a zone
    read = [
        ("compute.googleapis.com/gpus_all_regions", "global", 24, 32),
        ("compute.googleapis.com/preemptible_nvidia_h100_gpus", "us-east5", 8, 16),
        ("compute.googleapis.com/tpu_v5p_slice", "us-east5-a", 16, 32),
        ("tpu.googleapis.com/v6e_chips", "us-east5-b", 4, 8),
    ]
    skipped = [
        ("compute.googleapis.com/cpus", "us-east5", 96, 200),
        ("compute.googleapis.com/disks_total_storage", "us-east5", 500, 4096),
        ("compute.googleapis.com/in_use_addresses", "us-east5", 3, 8),
    ]
    with CloudMonitoringStandIn(project=PROJECT) as server:
        for metric, location, usage, limit in read + skipped:
            server.record_capacity(_quota("QUOTA_USAGE", location, T0, metric, usage, limit))
        clock = [(T0 + MIN) / 1000]
        source = _source(
            tmp_path, clock, feeds=("quota",), monitoring_endpoint=server.address,
            zones=("us-east5-a", "us-east5-b"), quota_lookback_s=600,
        )
        events, _ = _poll(source)  # asserts that nothing went to the dead letters
        for metric, location, usage, limit in skipped:  # the next poll sees them again
            server.record_capacity(
                _quota("QUOTA_USAGE", location, T0 + 2 * MIN, metric, usage, limit)
            )
        clock[0] = (T0 + 3 * MIN) / 1000
        events_again, _ = _poll(source)
        source.close()
    seen = sorted((e.quota.metric, e.zone, e.quota.usage, e.quota.limit) for e in events if e.quota)
    assert seen == [
        ("compute.googleapis.com/gpus_all_regions", "us-east5-a", 24, 32),
        ("compute.googleapis.com/gpus_all_regions", "us-east5-b", 24, 32),
        ("compute.googleapis.com/preemptible_nvidia_h100_gpus", "us-east5-a", 8, 16),
        ("compute.googleapis.com/preemptible_nvidia_h100_gpus", "us-east5-b", 8, 16),
        ("compute.googleapis.com/tpu_v5p_slice", "us-east5-a", 16, 32),
        ("tpu.googleapis.com/v6e_chips", "us-east5-b", 4, 8),
    ]
    assert events_again == []
    # each skipped quota's usage and limit series, in each of the two polls
    assert source.stats.quota_skipped == {metric: 4 for metric, *_ in skipped}


# --- Compute Engine ------------------------------------------------------------------------


def test_compute_instances_maintenance_lifecycle_and_inventory(tmp_path: Path, fleet: Fleet) -> None:
    node = fleet.gpu_nodes[1]
    window = MaintenanceWindow(start=T0 + 30 * MIN, end=T0 + 90 * MIN, notice_s=1800)
    target = node.target()
    fields = {
        "cluster": target.cluster, "pool": target.pool, "target_kind": "node",
        "target": target.name, "window": window,
    }
    clock = [T0 / 1000]
    with ComputeStandIn(fleet, project=PROJECT) as server:
        source = _source(tmp_path, clock, feeds=("compute",), compute_endpoint=server.address)
        quiet, members = _poll(source)
        server.record_capacity(_event("MAINTENANCE_SCHEDULED", node.zone, T0, **fields))
        scheduled, again = _poll(source)
        server.record_capacity(_event("MAINTENANCE_STARTED", node.zone, T0 + 30 * MIN, **fields))
        started, _ = _poll(source)
        unchanged, _ = _poll(source)
        server.record_capacity(_event("MAINTENANCE_DONE", node.zone, T0 + 90 * MIN, **fields))
        done, _ = _poll(source)
        source.close()
        pages = sum(1 for path in server.requests if path.endswith("/aggregated/instances"))
    assert quiet == [] and again == [] and unchanged == []
    assert pages == 5 * 3, "page_size 1: one page per instance, followed by the pager"
    [one] = scheduled
    assert (one.kind, one.target, one.pool, one.window and one.window.start) == (
        "MAINTENANCE_SCHEDULED", node.name, node.pool, window.start
    )
    assert one.window is not None and one.window.end == window.end
    assert one.window.notice_s == 1800
    assert [e.kind for e in started] == ["MAINTENANCE_STARTED"]
    assert [e.kind for e in done] == ["MAINTENANCE_DONE"]
    assert sorted((m.name, m.pool, m.zone, m.accelerator, m.capacity) for m in members) == sorted(
        (n.name, n.pool, n.zone, n.model.gke_accelerator, 8) for n in fleet.gpu_nodes
    )
    assert {m.source for m in members} == {"gcp.compute"}


def test_compute_state_survives_a_restart_through_the_checkpoint(
    tmp_path: Path, fleet: Fleet
) -> None:
    node = fleet.gpu_nodes[0]
    window = MaintenanceWindow(start=T0 + 30 * MIN, end=T0 + 90 * MIN)
    with ComputeStandIn(fleet, project=PROJECT) as server:
        server.record_capacity(
            _event(
                "MAINTENANCE_SCHEDULED", node.zone, T0, cluster=node.cluster, pool=node.pool,
                target_kind="node", target=node.name, window=window,
            )
        )
        first = _source(tmp_path, [T0 / 1000], feeds=("compute",), compute_endpoint=server.address)
        events, members = _poll(first)
        first.close()
        restarted = _source(
            tmp_path, [T0 / 1000 + 60], feeds=("compute",), compute_endpoint=server.address
        )
        replay, again = _poll(restarted)
        restarted.close()
    assert [e.kind for e in events] == ["MAINTENANCE_SCHEDULED"] and members
    assert replay == [] and again == []


def test_a_spot_instance_preempted_twice_is_two_preemptions(tmp_path: Path, fleet: Fleet) -> None:
    [spot] = [n for n in fleet.gpu_nodes if n.pool_kind == "serve"]
    preempt = _event(
        "PREEMPTION", spot.zone, T0, source="gcp.compute.preemption", cluster=spot.cluster,
        pool=spot.pool, target_kind="node", target=spot.name,
    )
    with ComputeStandIn(fleet, project=PROJECT) as server:
        source = _source(tmp_path, [T0 / 1000], feeds=("compute",), compute_endpoint=server.address)
        _poll(source)
        server.record_capacity(preempt)
        first, _ = _poll(source)
        still, _ = _poll(source)
        server.recreated(spot.name)
        back, _ = _poll(source)
        server.record_capacity(preempt)
        second, _ = _poll(source)
        source.close()
    assert [(e.kind, e.target, e.source) for e in first] == [
        ("PREEMPTION", spot.name, "gcp.compute.preemption")
    ]
    assert still == [] and back == []
    assert [e.kind for e in second] == ["PREEMPTION"]
    assert second[0].event_id != first[0].event_id


# --- Cloud TPU -----------------------------------------------------------------------------


def test_tpu_nodes_maintenance_queued_resources_and_stockout(tmp_path: Path, fleet: Fleet) -> None:
    tpu = fleet.slices[0]
    target = tpu.target()
    window = MaintenanceWindow(start=T0 + 20 * MIN, end=T0 + 60 * MIN)
    slice_fields = {
        "source": "gcp.tpu.node", "cluster": target.cluster, "pool": target.pool,
        "target_kind": "slice", "target": target.name, "window": window,
    }
    queued = Target(cluster="queued-resources", kind="slice", name="qr-1", pool="queued", zone=tpu.zone)

    def queue(state: str, ts: int) -> CapacityEvent:
        return _event(
            "QUEUED_RESOURCE_STATE", tpu.zone, ts, source="gcp.tpu.queued_resource",
            cluster=queued.cluster, pool=queued.pool, target_kind="slice", target=queued.name,
            accelerator_type=tpu.accelerator_type, state=state,
        )

    with TpuApiStandIn(fleet, project=PROJECT) as server:
        source = _source(tmp_path, [T0 / 1000], feeds=("tpu",), tpu_endpoint=server.address)
        server.record_capacity(queue("CREATING", T0))
        server.record_capacity(_event("MAINTENANCE_SCHEDULED", tpu.zone, T0, **slice_fields))
        first, members = _poll(source)
        server.record_capacity(queue("WAITING_FOR_RESOURCES", T0 + MIN))
        server.record_capacity(_event("MAINTENANCE_STARTED", tpu.zone, T0 + MIN, **slice_fields))
        second, again = _poll(source)
        server.record_capacity(queue("FAILED", T0 + 2 * MIN))
        server.record_capacity(_event("MAINTENANCE_DONE", tpu.zone, T0 + 2 * MIN, **slice_fields))
        third, _ = _poll(source)
        source.close()
    assert [(e.kind, e.state) for e in first] == [
        ("MAINTENANCE_SCHEDULED", "PENDING"), ("QUEUED_RESOURCE_STATE", "CREATING")
    ]
    assert first[0].target == tpu.name and first[0].window is not None
    assert first[0].window.start == window.start
    assert [(e.kind, e.state, e.previous_state) for e in second] == [
        ("MAINTENANCE_STARTED", "ONGOING", None),
        ("QUEUED_RESOURCE_STATE", "WAITING_FOR_RESOURCES", "CREATING"),
    ]
    assert [(e.kind, e.error_code) for e in third] == [
        ("MAINTENANCE_DONE", None),
        ("QUEUED_RESOURCE_STATE", "RESOURCE_EXHAUSTED"),
        ("STOCKOUT", "RESOURCE_EXHAUSTED"),
    ]
    assert third[2].zone == tpu.zone and third[2].accelerator_type == tpu.accelerator_type
    assert sorted((m.name, m.pool, m.accelerator, m.capacity) for m in members) == sorted(
        (s.name, s.pool, s.accelerator_type, len(s.coords)) for s in fleet.slices
    )
    assert again == []


def test_tpu_api_errors_are_source_errors(tmp_path: Path, fleet: Fleet) -> None:
    with TpuApiStandIn(fleet, project="another-project") as server:
        source = _source(tmp_path, [T0 / 1000], feeds=("tpu",), tpu_endpoint=server.address)
        with pytest.raises(SourceError, match=r"list_nodes.*not found"):
            source.poll()
        source.close()


# --- metadata server -----------------------------------------------------------------------


@pytest.fixture
def metadata(fleet: Fleet) -> Iterator[MetadataServerStandIn]:
    node = fleet.gpu_nodes[2]
    with MetadataServerStandIn(
        name=node.name, zone=node.zone, cluster=node.cluster, pool=node.pool
    ) as server:
        yield server


def test_metadata_requires_the_flavor_header(metadata: MetadataServerStandIn) -> None:
    url = f"{metadata.address}/computeMetadata/v1/instance/maintenance-event"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 403
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.read() == b"NONE"
        assert answer.headers["Metadata-Flavor"] == "Google" and answer.headers["ETag"]


def test_metadata_notices_follow_the_simulated_window(
    tmp_path: Path, fleet: Fleet, metadata: MetadataServerStandIn
) -> None:
    node = fleet.gpu_nodes[2]
    source = _source(tmp_path, [T0 / 1000], feeds=("metadata",), metadata_url=metadata.address)
    quiet, _ = _poll(source)
    window = MaintenanceWindow(start=T0 + 10 * MIN, end=T0 + 40 * MIN)
    metadata.record_capacity(
        _event("MAINTENANCE_SCHEDULED", node.zone, T0, target_kind="node", target=node.name,
               window=window)
    )
    metadata.advance(T0 + 8 * MIN)  # more than 60 s before the window: no notice yet
    early, _ = _poll(source)
    metadata.advance(T0 + 9 * MIN + 1)
    notice, _ = _poll(source)
    metadata.record_capacity(
        _event("MAINTENANCE_DONE", node.zone, T0 + 40 * MIN, target_kind="node", target=node.name)
    )
    metadata.record_capacity(_event("PREEMPTION", node.zone, T0 + 50 * MIN))
    after, _ = _poll(source)
    source.close()
    assert quiet == [] and early == []
    [started] = notice
    assert (started.kind, started.target, started.cluster, started.pool, started.zone) == (
        "MAINTENANCE_STARTED", node.name, node.cluster, node.pool, node.zone
    )
    assert started.state == "TERMINATE_ON_HOST_MAINTENANCE"
    assert [e.kind for e in after] == ["MAINTENANCE_DONE", "PREEMPTION"]


def test_metadata_long_poll_returns_when_the_value_changes(
    tmp_path: Path, metadata: MetadataServerStandIn
) -> None:
    source = _source(
        tmp_path, [T0 / 1000], feeds=("metadata",), metadata_url=metadata.address,
        metadata_wait_s=120,
    )
    _poll(source)  # learns the ETag of NONE (returns at once: no ETag known yet)
    found: list[list[CapacityEvent]] = []
    waiting = threading.Thread(target=lambda: found.append(_poll(source)[0]))
    waiting.start()
    time.sleep(0.2)  # not needed for correctness: a change before the request returns at once
    metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    waiting.join(timeout=60)
    source.close()
    assert not waiting.is_alive(), "the long poll did not return on the change"
    assert [e.kind for e in found[0]] == ["MAINTENANCE_STARTED"]


def test_a_bad_metadata_value_is_a_dead_letter(
    tmp_path: Path, metadata: MetadataServerStandIn
) -> None:
    metadata.set("instance/maintenance-event", "SOMETIMES")
    source = _source(tmp_path, [T0 / 1000], feeds=("metadata",), metadata_url=metadata.address)
    batch = source.poll()
    source.close()
    [bad] = batch.bad
    assert "instance/maintenance-event" in str(bad.error) and "SOMETIMES" in str(bad.error)
