"""Reservations through the real client libraries (google-cloud-compute REST, google-cloud-tpu
v2alpha1 gRPC) against the stand-ins, set with the simulator's own RESERVATION_CHANGED events;
and the simulator's reservations, consumed and released, folded into the capacity view."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.cloud import compute_v1

from pipeline.capacity import snapshot
from pipeline.capacity.prices import PriceBook
from pipeline.capacity.state import CapacityState, fold
from pipeline.config import CapacitySettings, SimSettings, SourcesSettings
from pipeline.model import CapacityEvent, QuotaInfo
from pipeline.sim.endpoints.compute_api import ComputeStandIn
from pipeline.sim.endpoints.tpu_api import TpuApiStandIn
from pipeline.sim.engine import Simulation
from pipeline.sim.fleet import Fleet, build_fleet
from pipeline.sources import reservations
from pipeline.sources.capacity import CapacitySource

PROJECT = "fleetpulse-test"
T0 = 1_764_424_800_000
MIN = 60_000


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return build_fleet(
        SimSettings(seed=4, gpu_nodes=3, tpu_slices=2, clusters=1, random_faults=False)
    )


def reservation(zone: str, ts: int, name: str, kind: str, limit: int, usage: int,
                state: str = "READY") -> CapacityEvent:  # fmt: skip
    scope = "zones" if kind.startswith("nvidia") else "locations"
    return CapacityEvent(
        event_id=f"cap-res-{name}-{ts}", ts=ts, provider="gcp", source="sim",
        kind="RESERVATION_CHANGED", severity="info", region=zone.rsplit("-", 1)[0], zone=zone,
        accelerator_type=kind, state=state,
        quota=QuotaInfo(metric=f"projects/p/{scope}/{zone}/reservations/{name}", limit=limit,
                        usage=usage, unit="devices"),
    )  # fmt: skip


def source_for(tmp_path: Path, clock: list[float], compute: str, tpu: str) -> CapacitySource:
    settings = CapacitySettings(
        project=PROJECT, feeds=("reservations",), compute_endpoint=compute, tpu_endpoint=tpu,
        page_size=1,
    )  # fmt: skip
    return CapacitySource(
        settings, SourcesSettings(state_dir=str(tmp_path)), once=True, clock=lambda: clock[0]
    )


def poll(source: CapacitySource) -> list[CapacityEvent]:
    batch = source.poll()
    assert not batch.bad, batch.bad
    source.commit(batch.position)
    return [e for e in batch.events if isinstance(e, CapacityEvent)]


def figures(events: list[CapacityEvent]) -> list[tuple[str, str, str | None, int, int, str]]:
    return [
        (e.zone, e.quota.metric.rsplit("/", 1)[-1], e.accelerator_type, int(e.quota.limit),
         int(e.quota.usage), e.state or "")
        for e in events if e.quota is not None
    ]  # fmt: skip


def test_compute_and_tpu_reservations_round_trip_consumed_released_deleted(
    tmp_path: Path, fleet: Fleet
) -> None:
    clock = [T0 / 1000]
    with ComputeStandIn(fleet, project=PROJECT) as compute, TpuApiStandIn(
        fleet, project=PROJECT
    ) as tpu:
        for server in (compute, tpu):
            server.record_capacity(reservation("us-east5-a", T0, "res-h100", "nvidia-h100-80gb", 32, 32))
            server.record_capacity(reservation("us-east5-b", T0, "res-v5p", "v5p", 64, 48))
        source = source_for(tmp_path, clock, compute.address, tpu.address)
        first = poll(source)
        assert poll(source) == []  # nothing changed: nothing said
        for server in (compute, tpu):  # a job ends: one VM of the reservation released
            server.record_capacity(reservation("us-east5-a", T0 + MIN, "res-h100", "nvidia-h100-80gb", 32, 24))
            server.record_capacity(reservation("us-east5-b", T0 + MIN, "res-v5p", "v5p", 64, 0, "DELETED"))
        clock[0] += 60
        second = poll(source)
        source.close()
        paths = [p for p in compute.requests if p.endswith("/aggregated/reservations")]
    assert figures(first) == [
        ("us-east5-a", "res-h100", "nvidia-h100-80gb", 32, 32, "READY"),
        ("us-east5-b", "res-v5p", "v5p", 64, 48, "ACTIVE"),
    ]
    assert figures(second) == [
        ("us-east5-a", "res-h100", "nvidia-h100-80gb", 32, 24, "READY"),
        ("us-east5-b", "res-v5p", "v5p", 0, 0, "DELETED"),
    ]
    assert {e.source for e in first} == {"gcp.compute.reservation", "gcp.tpu.reservation"}
    assert len(paths) == 3, "page_size 1: the pager followed the one reservation page"


def test_an_aggregate_reservation_counts_accelerators_reserved_and_in_use() -> None:
    accelerator = "zones/us-east5-a/acceleratorTypes/ct5p"
    item = compute_v1.Reservation(
        name="agg-1",
        zone="projects/p/zones/us-east5-a",
        status="READY",
        aggregate_reservation=compute_v1.AllocationAggregateReservation(
            reserved_resources=[
                {"accelerator": {"accelerator_count": 64, "accelerator_type": accelerator}}
            ],
            in_use_resources=[
                {"accelerator": {"accelerator_count": 16, "accelerator_type": accelerator}}
            ],
        ),
    )
    held = reservations.compute_reservation(item)
    assert held is not None
    assert (held.zone, held.accelerator_type, held.reserved, held.in_use) == (
        "us-east5-a", "ct5p", 64, 16
    )  # fmt: skip
    cpu_only = compute_v1.Reservation(
        name="cpu", zone="projects/p/zones/us-east5-a",
        specific_reservation=compute_v1.AllocationSpecificSKUReservation(count=4),
    )  # fmt: skip
    assert reservations.compute_reservation(cpu_only) is None


def test_the_simulator_consumes_and_releases_reservations_and_the_view_counts_them() -> None:
    settings = SimSettings(seed=7, gpu_nodes=16, tpu_slices=2, clusters=1, duration_s=12 * 3600,
                           random_faults=False)  # fmt: skip
    sim = Simulation(settings)
    # the timeline alone (what the run would publish among its samples): seconds, not minutes
    events = [e for _, _, e in sorted(sim._ctx.timeline.events, key=lambda x: (x[0], x[1]))
              if isinstance(e, CapacityEvent) and e.kind == "RESERVATION_CHANGED"]  # fmt: skip
    assert events, "the simulator reserves part of the fleet"
    names = {e.quota.metric for e in events if e.quota}
    uses = {(e.quota.metric, int(e.quota.usage)) for e in events if e.quota}
    assert len(uses) > len(names), "reservations are consumed and released over the run"
    assert all(e.quota and 0 <= e.quota.usage <= e.quota.limit for e in events)
    state = CapacityState()
    for event in events:
        fold(state, event)
    shown = snapshot.snapshots(state, CapacitySettings(), PriceBook())
    assert sum(s.reservations.count for s in shown) == len(names)
    assert all(s.reservations.unused == s.reservations.reserved - s.reservations.in_use
               for s in shown)  # fmt: skip
