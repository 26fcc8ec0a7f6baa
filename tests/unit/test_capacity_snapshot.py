"""The capacity fold: inventory, node states, capacity events, utilization → snapshots."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.capacity import snapshot, view
from pipeline.capacity.prices import CatalogPrice, PriceBook
from pipeline.capacity.state import CapacityState, fold, forget, provisioning_model, region_of
from pipeline.config import CapacitySettings
from pipeline.model import (
    CapacityEvent,
    CapacitySnapshot,
    Inventory,
    MaintenanceWindow,
    NodeState,
    QuotaInfo,
    Target,
    Utilization,
)

T0 = 1_767_225_600_000
MIN = 60_000
SETTINGS = CapacitySettings()
PRICES = PriceBook(
    prices={
        ("nvidia-h100-80gb", "us-central1", "on-demand"): CatalogPrice(11.0, "test catalog"),
        ("nvidia-h100-80gb", "*", "spot"): CatalogPrice(3.0, "test catalog"),
    }
)


def node(name: str, zone: str = "us-central1-a", pool: str = "a3", **labels: str) -> Inventory:
    return Inventory(
        ts=T0, cluster="c1", kind="node", name=name, pool=pool, zone=zone,
        accelerator="nvidia-h100-80gb", capacity=8, labels=labels,
    )  # fmt: skip


def state_of(name: str, state: str, ts: int, zone: str = "us-central1-a") -> NodeState:
    target = Target(cluster="c1", kind="node", name=name, pool="a3", zone=zone)
    return NodeState(ts=ts, target=target, state=state, since=ts)  # type: ignore[arg-type]


def util(name: str, device: int, ts: int, *, allocated: bool, pct: float) -> Utilization:
    return Utilization(
        window_start=ts, window_s=60, cluster="c1", pool="a3", zone="us-central1-a",
        node=name, device=str(device), accelerator="NVIDIA H100 80GB HBM3",
        allocated=allocated, util_mean=pct, util_max=pct, mem_used_frac=0.5, samples=4,
    )  # fmt: skip


def capacity(kind: str, ts: int, **fields: Any) -> CapacityEvent:
    return CapacityEvent(
        event_id=f"cap-{kind.lower()}-{ts}", ts=ts, provider="gcp", source="test",
        kind=kind, severity="info", region="us-central1",  # type: ignore[arg-type]
        zone="us-central1-a", **fields,
    )  # fmt: skip


def only(state: CapacityState) -> CapacitySnapshot:
    (one,) = snapshot.snapshots(state, SETTINGS, PRICES)
    return one


def fleet_of_four() -> CapacityState:
    state = CapacityState()
    for name in ("n1", "n2", "n3", "n4"):
        fold(state, node(name))
    ts = T0 + 5 * MIN
    for device in range(8):
        fold(state, util("n1", device, ts, allocated=True, pct=90.0))  # busy
        fold(state, util("n2", device, ts, allocated=device < 4, pct=1.0))  # 4 held, idle
        fold(state, util("n3", device, ts, allocated=False, pct=0.0))
        fold(state, util("n4", device, ts, allocated=False, pct=0.0))
    return state


def test_each_device_is_counted_once_healthy_free_allocated_idle() -> None:
    got = only(fleet_of_four())
    assert (got.region, got.zone, got.accelerator_type, got.provisioning_model) == (
        "us-central1", "us-central1-a", "nvidia-h100-80gb", "on-demand"
    )  # fmt: skip
    assert got.devices == 32
    assert got.healthy == 32
    assert got.allocated == 12
    assert got.allocated_idle == 4
    assert got.healthy_free == 20


def test_out_of_service_by_reason_and_suspect_apart() -> None:
    state = fleet_of_four()
    fold(state, state_of("n1", "cordoned", T0 + 6 * MIN))
    fold(state, state_of("n2", "suspect", T0 + 6 * MIN))
    fold(state, capacity("MAINTENANCE_STARTED", T0 + 6 * MIN, cluster="c1", target="n3",
                         target_kind="node"))  # fmt: skip
    got = only(state)
    assert got.out_of_service.cordoned == 8
    assert got.out_of_service.maintenance == 8
    assert got.suspect == 8
    assert got.healthy == 8
    assert got.healthy_free == 8  # n4 only: n2 is suspect, its free devices do not count
    assert got.allocated == 4  # n2's, still held; n1's are out of service


def test_a_member_unheard_past_the_silence_is_out_of_service_silent() -> None:
    state = fleet_of_four()
    for device in range(8):  # n1..n3 heard again 20 minutes later; n4 not
        for name in ("n1", "n2", "n3"):
            fold(state, util(name, device, T0 + 25 * MIN, allocated=False, pct=0.0))
    got = only(state)
    assert got.out_of_service.silent == 8
    assert got.devices == 32 and got.healthy == 24


def test_maintenance_announced_counts_until_it_begins() -> None:
    state = fleet_of_four()
    window = MaintenanceWindow(start=T0 + 60 * MIN, end=T0 + 120 * MIN)
    fold(state, capacity("MAINTENANCE_SCHEDULED", T0 + 6 * MIN, cluster="c1", target="n4",
                         target_kind="node", window=window))  # fmt: skip
    assert only(state).maintenance_announced == 8
    assert only(state).out_of_service.maintenance == 0
    fold(state, capacity("MAINTENANCE_STARTED", T0 + 7 * MIN, cluster="c1", target="n4",
                         target_kind="node", window=window))  # fmt: skip
    assert only(state).maintenance_announced == 0
    assert only(state).out_of_service.maintenance == 8


def test_quota_reservations_and_last_hour_events_reach_the_zone_and_type() -> None:
    state = fleet_of_four()
    metric = "compute.googleapis.com/nvidia_h100_80gb_gpus"
    for i in range(12):
        quota = QuotaInfo(metric=metric, limit=64.0, usage=20.0 + i)
        fold(state, capacity("QUOTA_USAGE", T0 + i * 5 * MIN, quota=quota))
    reservation = QuotaInfo(metric="res-a", limit=16, usage=12, unit="devices")
    fold(state, capacity("RESERVATION_CHANGED", T0 + MIN, quota=reservation, state="READY",
                         accelerator_type="nvidia-h100-80gb"))  # fmt: skip
    fold(state, capacity("STOCKOUT", T0 + 2 * MIN, accelerator_type="nvidia-h100-80gb"))
    fold(state, capacity("STOCKOUT", T0 + 50 * MIN, accelerator_type="nvidia-h100-80gb"))
    got = only(state)
    assert got.quota is not None
    assert (got.quota.limit, got.quota.usage, got.quota.headroom) == (64.0, 31.0, 33.0)
    assert got.quota.trend_per_h == 12.0  # one more every 5 minutes
    assert got.quota.exhausts_at == T0 + 55 * MIN + 33 * 5 * MIN
    assert (got.reservations.count, got.reservations.in_use, got.reservations.unused) == (1, 12, 4)
    assert got.stockouts_1h == 2
    fold(state, capacity("STOCKOUT", T0 + 64 * MIN, accelerator_type="H100 80GB"))
    assert only(state).stockouts_1h == 2  # the first is over an hour old now


def test_cost_per_useful_hour_says_which_price() -> None:
    got = only(fleet_of_four())
    # mean utilization over the 32 devices heard: (8*90 + 8*1) / 32 = 22.75 %
    assert got.useful_pct == 22.75
    assert got.price is not None
    assert (got.price.basis, got.price.location, got.price.usd_per_hour) == (
        "on-demand", "us-central1", 11.0
    )  # fmt: skip
    assert got.usd_per_useful_hour == round(11.0 * 100 / 22.75, 4)
    negotiated = PriceBook(negotiated={"nvidia-h100-80gb": 6.5})
    (cheap,) = snapshot.snapshots(fleet_of_four(), SETTINGS, negotiated)
    assert cheap.price is not None and cheap.price.basis == "negotiated"


def test_spot_members_are_their_own_key_and_take_the_spot_price() -> None:
    state = fleet_of_four()
    fold(state, node("s1", **{"cloud.google.com/gke-spot": "true"}))
    spot = [s for s in snapshot.snapshots(state, SETTINGS, PRICES) if s.provisioning_model == "spot"]
    assert len(spot) == 1 and spot[0].devices == 8
    assert spot[0].price is not None and spot[0].price.usd_per_hour == 3.0


def test_a_tombstone_removes_the_member_and_strangers_change_nothing() -> None:
    state = fleet_of_four()
    assert forget(state, "c1/n4") == {"us-central1/us-central1-a/nvidia-h100-80gb/on-demand"}
    assert only(state).devices == 24
    assert fold(state, state_of("stranger", "cordoned", T0 + 9 * MIN)) == set()
    assert only(state).out_of_service.cordoned == 0


def test_due_sends_changes_and_the_periodic_repeat_only() -> None:
    state = fleet_of_four()
    assert len(snapshot.due(state, SETTINGS, PRICES)) == 1
    assert snapshot.due(state, SETTINGS, PRICES) == []  # nothing changed
    fold(state, state_of("n4", "cordoned", T0 + 6 * MIN))
    (changed,) = snapshot.due(state, SETTINGS, PRICES)
    assert changed.out_of_service.cordoned == 8
    state, out = view.on_time(state, T0 + 6 * MIN + 1, SETTINGS, PRICES)
    assert out.snapshots == []
    state, out = view.on_time(state, T0 + 12 * MIN, SETTINGS, PRICES)  # interval (5 min) past
    assert len(out.snapshots) == 1


def test_names_and_models() -> None:
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("onprem-dc1") == "onprem-dc1"
    assert provisioning_model({"provisioning_model": "SPOT"}) == "spot"
    assert provisioning_model({"cloud.google.com/reservation-name": "r1"}) == "reserved"
    assert provisioning_model({}) == "on-demand"


def test_publish_gives_snapshots_crunch_advice_and_overdue_targets() -> None:
    state = fleet_of_four()
    for name in ("e1", "e2"):  # us-east4-b: 16 free
        fold(state, node(name, zone="us-east4-b"))
        for device in range(8):
            fold(state, util(name, device, T0 + 5 * MIN, allocated=False, pct=0.0))
    for name in ("n1", "n2", "n3"):  # us-central1-a: 8 free left (n4), under 9
        fold(state, state_of(name, "cordoned", T0 + 6 * MIN))
    settings = CapacitySettings(crunch_free_below=9, out_of_service_alert_s=600, silent_after_s=3600)
    state, out = view.publish(state, settings, PRICES)
    assert len(out.snapshots) == 2
    (started,) = out.crunch_started
    assert started.scope == "us-central1/nvidia-h100-80gb"
    assert [s.zone for s in started.spare] == ["us-east4-b"]
    (advice,) = out.advice
    assert (advice.accelerator_type, advice.count) == ("nvidia-h100-80gb", 8)
    assert advice.options[0].zone == "us-central1-a"  # both fit 8; the priced zone first
    assert out.overdue == []
    state, again = view.publish(state, settings, PRICES)
    assert again.advice == [] and again.snapshots == []  # nothing changed: nothing sent
    state, out = view.on_time(state, T0 + 17 * MIN, settings, PRICES)
    assert sorted(o.target for o in out.overdue) == ["c1/n1", "c1/n2", "c1/n3"]
    assert out.crunch_started == [] and len(out.crunch_holding) == 1
    state, out = view.on_time(state, T0 + 18 * MIN, settings, PRICES)
    assert out.overdue == []  # said once
    view.on_tombstone(state, "c1/n1")  # the member leaves: its outage with it
    assert "c1/n1" not in state.repairs.open and "c1/n1" not in state.overdue


def test_a_limit_change_keeps_the_usage_it_does_not_say() -> None:
    state = fleet_of_four()
    metric = "compute.googleapis.com/nvidia_h100_80gb_gpus"
    fold(state, capacity("QUOTA_USAGE", T0, quota=QuotaInfo(metric=metric, limit=64, usage=40)))
    # the Cloud Monitoring adapter says a new limit with usage 0, at the time of a reading
    raised = QuotaInfo(metric=metric, limit=80, usage=0)
    fold(state, capacity("QUOTA_CHANGED", T0 + 5 * MIN, quota=raised))
    fold(state, capacity("QUOTA_USAGE", T0 + 5 * MIN, quota=QuotaInfo(metric=metric, limit=80,
                                                                      usage=41)))  # fmt: skip
    fold(state, capacity("QUOTA_CHANGED", T0 + 7 * MIN, quota=raised))
    assert state.places["us-central1-a/nvidia-h100-80gb"].quota == [
        (T0, 40.0, 64.0), (T0 + 5 * MIN, 41.0, 80.0), (T0 + 7 * MIN, 41.0, 80.0)
    ]  # fmt: skip


STATES = ["healthy", "suspect", "degraded", "cordoned", "draining", "repairing", "probation"]


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(min_value=1, max_value=5),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["state", "use", "maintenance"]),
            st.integers(min_value=0, max_value=4),  # node
            st.integers(min_value=0, max_value=7),  # device / state index
            st.integers(min_value=0, max_value=40),  # minute
            st.booleans(),
        ),
        max_size=60,
    ),
)
def test_every_device_is_counted_once_whatever_arrives(
    nodes: int, steps: list[tuple[str, int, int, int, bool]]
) -> None:
    state = CapacityState()
    for i in range(nodes):
        fold(state, node(f"n{i}", **({"provisioning_model": "spot"} if i == 4 else {})))
    for kind, index, value, minute, flag in steps:
        name, ts = f"n{index % nodes}", T0 + minute * MIN
        if kind == "state":
            fold(state, state_of(name, STATES[value % len(STATES)], ts))
        elif kind == "use":
            fold(state, util(name, value, ts, allocated=flag, pct=float(value * 12)))
        else:
            fold(state, capacity("MAINTENANCE_STARTED" if flag else "MAINTENANCE_DONE", ts,
                                 cluster="c1", target=name, target_kind="node"))  # fmt: skip
        for got in snapshot.snapshots(state, SETTINGS, PRICES):
            out = got.out_of_service
            out_total = out.cordoned + out.draining + out.repairing + out.maintenance + out.silent
            assert got.devices == got.healthy + got.suspect + out_total
            assert 0 <= got.healthy_free <= got.healthy
            assert got.allocated_idle <= got.allocated <= got.healthy + got.suspect


def test_a_view_with_members_but_no_time_yet_publishes_nothing() -> None:
    # inventory does not move the clock (a replay's inventory is listed today): until an input
    # with an event time comes, a snapshot would have no date to carry
    state = CapacityState()
    fold(state, node("n1"))
    assert state.members and state.clock_ms == 0
    state, out = view.publish(state, SETTINGS, PRICES)
    assert out.snapshots == [] and out.advice == []
    fold(state, state_of("n1", "healthy", T0))
    state, out = view.publish(state, SETTINGS, PRICES)
    assert [s.ts for s in out.snapshots] == [T0]
