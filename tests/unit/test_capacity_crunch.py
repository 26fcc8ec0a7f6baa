"""FleetPulseCapacityCrunch and capacity_advice/1 over snapshots."""

from __future__ import annotations

import msgspec

from pipeline.capacity import crunch
from pipeline.capacity.advice import advise
from pipeline.catalog.accelerators import equivalents
from pipeline.config import CapacitySettings
from pipeline.decide import alerts
from pipeline.model import CapacitySnapshot, OutOfService, PriceUsed, QuotaOutlook, Reservations

T0 = 1_767_225_600_000
HOUR = 3_600_000
SETTINGS = CapacitySettings(crunch_free_below=8)  # the free rule on (off by default)


def snap(
    zone: str,
    free: int,
    *,
    accelerator: str = "nvidia-h100-80gb",
    price: float | None = 11.0,
    quota: QuotaOutlook | None = None,
    stockouts: int = 0,
) -> CapacitySnapshot:
    return CapacitySnapshot(
        ts=T0, region=zone.rsplit("-", 1)[0], zone=zone, accelerator_type=accelerator,
        provisioning_model="on-demand", devices=64, healthy=64, healthy_free=free,
        allocated=64 - free, allocated_idle=0, out_of_service=OutOfService(), quota=quota,
        reservations=Reservations(), stockouts_1h=stockouts,
        price=None if price is None else PriceUsed(usd_per_hour=price, basis="on-demand",
                                                   source="test", location=zone),
    )  # fmt: skip


def quota_out_in(hours: float, confidence: float = 0.9, headroom: float = 24.0) -> QuotaOutlook:
    return QuotaOutlook(
        metric="compute.googleapis.com/nvidia_h100_80gb_gpus", limit=64.0, usage=64 - headroom,
        headroom=headroom, trend_per_h=headroom / hours, exhausts_at=T0 + int(hours * HOUR),
        confidence=confidence, points=24,
    )  # fmt: skip


def test_no_crunch_with_room() -> None:
    assert crunch.crunches([snap("us-central1-a", 40)], SETTINGS) == []


def test_a_full_healthy_fleet_is_no_crunch_by_default() -> None:
    # every device allocated in every region, no quota pressure, no stock-outs: a fleet kept
    # full is the goal, not an alert (the free rule is off unless crunch_free_below is set)
    full = [snap(zone, 0) for zone in ("us-central1-a", "us-east4-b", "europe-west4-a")]
    assert crunch.crunches(full, CapacitySettings()) == []
    assert [c.region for c in crunch.crunches(full, SETTINGS)] == [
        "europe-west4", "us-central1", "us-east4"
    ]  # fmt: skip


def test_few_healthy_free_is_a_crunch_naming_the_spare_zone_and_its_price() -> None:
    snaps = [snap("us-central1-a", 2), snap("us-central1-b", 3),
             snap("us-east4-b", 40, price=10.5), snap("europe-west4-a", 16, price=12.0)]  # fmt: skip
    (found,) = crunch.crunches(snaps, SETTINGS)
    assert (found.region, found.accelerator_type, found.reasons) == (
        "us-central1", "nvidia-h100-80gb", ("free",)
    )  # fmt: skip
    assert found.healthy_free == 5
    assert [s.zone for s in found.spare] == ["us-east4-b", "europe-west4-a"]
    notes = crunch.alert_annotations(found)
    assert "spare in us-east4-b" in notes["summary"]
    assert "us-east4-b nvidia-h100-80gb on-demand: 40 healthy free ($10.50/device-hour on-demand)" in (
        notes["description"]
    )


def test_quota_running_out_within_the_setting_is_a_crunch_only_when_confident() -> None:
    soon = [snap("us-central1-a", 40, quota=quota_out_in(2.0))]
    assert crunch.crunches(soon, SETTINGS)[0].reasons == ("quota",)
    unsure = [snap("us-central1-a", 40, quota=quota_out_in(2.0, confidence=0.2))]
    assert crunch.crunches(unsure, SETTINGS) == []
    later = [snap("us-central1-a", 40, quota=quota_out_in(12.0))]
    assert crunch.crunches(later, SETTINGS) == []
    spent = [snap("us-central1-a", 40, quota=quota_out_in(12.0, headroom=0.0))]
    assert crunch.crunches(spent, SETTINGS)[0].reasons == ("quota",)


def test_repeated_stockouts_are_a_crunch() -> None:
    assert crunch.crunches([snap("us-central1-a", 40, stockouts=2)], SETTINGS) == []
    (found,) = crunch.crunches([snap("us-central1-a", 40, stockouts=3)], SETTINGS)
    assert found.reasons == ("stockouts",)


def test_an_equivalent_type_is_spare_capacity_too() -> None:
    snaps = [snap("us-central1-a", 0), snap("us-east5-a", 24, accelerator="nvidia-h200-141gb")]
    (found,) = crunch.crunches(snaps, SETTINGS, equivalents)
    assert [(s.zone, s.accelerator_type) for s in found.spare] == [
        ("us-east5-a", "nvidia-h200-141gb")
    ]
    (alone,) = crunch.crunches(snaps, SETTINGS)  # without the family: nothing spare
    assert alone.spare == ()


def test_transitions_fire_once_and_resolve_and_build_an_alert() -> None:
    firing: dict[str, int] = {}
    found = crunch.crunches([snap("us-central1-a", 0)], SETTINGS)
    started, holding, ended = crunch.transitions(firing, found)
    assert [c.scope for c in started] == ["us-central1/nvidia-h100-80gb"] and holding == []
    started, holding, ended = crunch.transitions(firing, found)
    assert started == [] and len(holding) == 1
    started, holding, ended = crunch.transitions(firing, [])
    assert ended == ["us-central1/nvidia-h100-80gb"] and firing == {}
    alert = alerts.firing(crunch.alert_labels(found[0].scope), crunch.alert_annotations(found[0]), T0)
    assert alert.labels["alertname"] == "FleetPulseCapacityCrunch"
    assert alert.annotations["runbook_url"].endswith("/capacity.crunch")


def test_advice_ranks_fitting_then_quota_then_price() -> None:
    snaps = [
        snap("us-central1-a", 4, price=9.0),  # cheapest, does not fit 8
        snap("us-east4-b", 40, price=12.0),
        snap("us-east4-c", 16, price=11.0, quota=quota_out_in(1.0)),  # quota spent soon
        snap("us-west1-a", 10, price=11.5),
        snap("us-east5-a", 30, accelerator="nvidia-h200-141gb", price=10.0),
    ]
    advice = advise(snaps, "nvidia-h100-80gb", 8, SETTINGS, equivalents("nvidia-h100-80gb"))
    assert advice is not None
    assert [o.zone for o in advice.options] == [
        "us-west1-a", "us-east4-b", "us-east5-a", "us-east4-c", "us-central1-a"
    ]  # fmt: skip
    assert [o.fits for o in advice.options] == [True, True, True, True, False]
    again = advise(snaps, "nvidia-h100-80gb", 8, SETTINGS, equivalents("nvidia-h100-80gb"))
    assert again is not None and again.advice_id == advice.advice_id
    moved = [msgspec.structs.replace(snaps[0], healthy_free=20), *snaps[1:]]
    changed = advise(moved, "nvidia-h100-80gb", 8, SETTINGS)
    assert changed is not None and changed.options[0].zone == "us-central1-a"
    assert changed.advice_id != advice.advice_id
    assert advise(snaps, "tpu-v5p", 8, SETTINGS) is None
