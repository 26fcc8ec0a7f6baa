"""The capacity state → capacity_snapshot/1 records, per region/zone/type/provisioning model.

Each device is counted once. A member (node or slice) out of service counts all its devices
under its first reason, in this order: cordoned (by FleetPulse or a person), draining,
repairing (the health machine's states), maintenance (a window begun), silent (no utilization
for `silent_after_s`). A member in service is healthy (healthy, probation) or suspect
(suspect, degraded); its devices held by a job in their latest window are allocated, and
allocated but idle under `idle_util_pct`. Healthy free = healthy devices no job holds.

`due` says which snapshots to send: every key whose snapshot changed since it was last sent
(its content, not its time), and every key not sent for `snapshot_interval_s`.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

import msgspec

from pipeline.capacity.forecast import ForecastRules, QuotaPoint, forecast
from pipeline.capacity.prices import PriceBook
from pipeline.capacity.state import HOUR_MS, CapacityState, Member, Place, region_of
from pipeline.config import CapacitySettings
from pipeline.model import CapacitySnapshot, OutOfService, QuotaOutlook, Reservations

OUT_OF_SERVICE = ("cordoned", "draining", "repairing")
SUSPECT = ("suspect", "degraded")


@dataclass
class _Counts:
    devices: int = 0
    healthy: int = 0
    free: int = 0
    allocated: int = 0
    idle: int = 0
    suspect: int = 0
    announced: int = 0


def all_keys(state: CapacityState) -> set[str]:
    """The members' keys, and an on-demand key for each zone and type that has cloud figures
    (quota, reservations, stock-outs) but no member (keys_of_place, without a scan per place)."""
    keys = {m.key for m in state.members.values()}
    places = {key.rsplit("/", 1)[0] for key in keys}  # region/zone/type
    for place_key in state.places:
        zone, _, accelerator = place_key.partition("/")
        prefix = f"{region_of(zone)}/{zone}/{accelerator}"
        if prefix not in places:
            keys.add(f"{prefix}/on-demand")
    return keys


def snapshots(
    state: CapacityState, settings: CapacitySettings, prices: PriceBook
) -> list[CapacitySnapshot]:
    """Every key's snapshot at the state's clock, in key order."""
    _prune(state)
    by_key: dict[str, list[Member]] = defaultdict(list)
    for member in state.members.values():
        by_key[member.key].append(member)
    keys = sorted(all_keys(state))
    return [build(state, key, by_key.get(key, []), settings, prices) for key in keys]


def due(
    state: CapacityState, settings: CapacitySettings, prices: PriceBook
) -> list[CapacitySnapshot]:
    """The snapshots to send now (changed, or not sent for the interval); marks them sent."""
    out = []
    interval_ms = settings.snapshot_interval_s * 1000
    for snapshot in snapshots(state, settings, prices):
        key = snapshot_id(snapshot)
        digest = _digest(snapshot)
        sent = state.emitted.get(key)
        if sent is None or sent[1] != digest or snapshot.ts - sent[0] >= interval_ms:
            state.emitted[key] = (snapshot.ts, digest)
            out.append(snapshot)
    return out


def snapshot_id(snapshot: CapacitySnapshot) -> str:
    parts = (snapshot.region, snapshot.zone, snapshot.accelerator_type)
    return "/".join((*parts, snapshot.provisioning_model))


def build(
    state: CapacityState,
    key: str,
    members: list[Member],
    settings: CapacitySettings,
    prices: PriceBook,
) -> CapacitySnapshot:
    region, zone, accelerator, model = key.split("/")
    now = state.clock_ms
    counts, out = _count(members, now, settings)
    place = state.places.get(f"{zone}/{accelerator}", Place())
    useful_pct = _useful_pct(state.usage.get(key, {}))
    price = prices.price(accelerator, zone, model)
    per_useful = None
    if price is not None and useful_pct:
        per_useful = round(price.usd_per_hour * 100 / useful_pct, 4)
    return CapacitySnapshot(
        ts=max(now, 1_000_000_000_000),
        region=region,
        zone=zone,
        accelerator_type=accelerator,
        provisioning_model=model,  # type: ignore[arg-type]
        devices=counts.devices,
        healthy=counts.healthy,
        healthy_free=counts.free,
        allocated=counts.allocated,
        allocated_idle=counts.idle,
        suspect=counts.suspect,
        out_of_service=out,
        maintenance_announced=counts.announced,
        quota=quota_outlook(place, now, settings),
        reservations=reservations(place),
        stockouts_1h=_last_hour(place.stockouts, now),
        queued_waits_1h=_last_hour(place.queued, now),
        preemptions_1h=_last_hour(place.preemptions, now),
        useful_pct=useful_pct,
        usd_per_useful_hour=per_useful,
        price=price,
    )


def _count(
    members: list[Member], now: int, settings: CapacitySettings
) -> tuple[_Counts, OutOfService]:
    counts = _Counts()
    out: dict[str, int] = defaultdict(int)
    silent_ms = settings.silent_after_s * 1000
    for member in members:
        counts.devices += member.devices
        if member.maintenance == "announced":
            counts.announced += member.devices
        reason = out_of_service_reason(member, now, silent_ms)
        if reason is not None:
            out[reason] += member.devices
            continue
        held, idle = _held(member, now, silent_ms, settings.idle_util_pct)
        counts.allocated += held
        counts.idle += idle
        if member.health in SUSPECT:
            counts.suspect += member.devices
        else:
            counts.healthy += member.devices
            counts.free += member.devices - held
    return counts, OutOfService(**out)


def out_of_service_reason(member: Member, now: int, silent_ms: int) -> str | None:
    if member.health in OUT_OF_SERVICE:
        return member.health
    if member.maintenance == "ongoing":
        return "maintenance"
    if now - member.heard_ms > silent_ms:
        return "silent"
    return None


def _held(member: Member, now: int, silent_ms: int, idle_pct: float) -> tuple[int, int]:
    """Devices a job holds in their latest window (not older than the silence), and of those
    the idle ones; at most the member's devices."""
    held = idle = 0
    for start, allocated, util in member.used.values():
        if allocated and now - start <= silent_ms:
            held += 1
            idle += util < idle_pct
    held = min(held, member.devices)
    return held, min(idle, held)


def quota_outlook(place: Place, now: int, settings: CapacitySettings) -> QuotaOutlook | None:
    if not place.quota:
        return None
    since = now - settings.quota_window_s * 1000
    window = [QuotaPoint(ts, usage, limit) for ts, usage, limit in place.quota if ts >= since]
    rules = ForecastRules(min_points=settings.forecast_min_points)
    result = forecast(window, rules) if window else None
    _, usage, limit = place.quota[-1]
    return QuotaOutlook(
        metric=place.quota_metric or "unknown",
        limit=limit,
        usage=usage,
        headroom=limit - usage,
        trend_per_h=result.trend_per_h if result else 0.0,
        exhausts_at=result.exhausts_at if result else None,
        confidence=result.confidence if result else 0.0,
        points=result.points if result else 0,
    )


def reservations(place: Place) -> Reservations:
    reserved = sum(r for r, _ in place.reservations.values())
    in_use = sum(min(u, r) for r, u in place.reservations.values())
    return Reservations(
        count=len(place.reservations), reserved=reserved, in_use=in_use, unused=reserved - in_use
    )


def _useful_pct(windows: dict[int, tuple[float, float]]) -> float | None:
    device_s = sum(d for d, _ in windows.values())
    if device_s <= 0:
        return None
    return round(100 * sum(u for _, u in windows.values()) / device_s, 3)


def _last_hour(times: list[int], now: int) -> int:
    return sum(1 for t in times if now - HOUR_MS < t <= now)


def _prune(state: CapacityState) -> None:
    """Usage windows older than an hour leave the state (they no longer count)."""
    oldest = state.clock_ms - HOUR_MS
    for key, windows in list(state.usage.items()):
        kept = {start: v for start, v in windows.items() if start >= oldest}
        if kept:
            state.usage[key] = kept
        else:
            del state.usage[key]


def _digest(snapshot: CapacitySnapshot) -> str:
    body = msgspec.json.encode(msgspec.structs.replace(snapshot, ts=1_000_000_000_000))
    return hashlib.sha256(body).hexdigest()[:16]
