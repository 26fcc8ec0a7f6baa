"""Background capacity signals: quota usage drifting towards limits, quota exceeded, stock-outs,
reservations consumed and released, and TPU queued-resource lifecycles
(reference/data-shapes.md §6).

These are not faults: nothing in the fleet breaks. Quota usage follows the fleet's own
allocation plus other teams' demand (a random walk that creeps up); the rest are Poisson
arrivals per zone, written to the timeline before the run like every other event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import SimSettings
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent, QuotaInfo, Target
from pipeline.sim.fleet import GPUS_PER_NODE, Fleet
from pipeline.sim.inject import HOUR, MINUTE, Injector

DAY = 24 * HOUR
STOCKOUTS_PER_ZONE_DAY = 1.0  # [G]
RESERVATION_CHANGES_PER_ZONE_DAY = 0.5  # [G] (before issue 37; its draws are kept, _keep_stream)
RESERVATION_USE_CHANGES_PER_DAY = 12.0  # [G] a VM or host of a reservation released or taken
QUEUED_RESOURCES_PER_ZONE_DAY = 2.0  # [G], zones with TPU slices


def background_boost(settings: SimSettings) -> float:
    """Capacity chatter follows `intensity`, but at most four times as often as usual."""
    return max(1.0, min(settings.intensity, 4.0))


@dataclass
class _Quota:
    zone: str
    metric: str
    display: str
    nodes: list[int]  # GPU nodes counted against it (empty for TPU quotas)
    chips: int  # TPU chips held by the fleet's slices in the zone
    limit: float
    external: float  # other teams' usage in the same quota
    ramp: bool = False  # the crunch scenario's quota (SimSettings.crunch_zone)


class CapacitySignals:
    """Per-tick QUOTA_USAGE / QUOTA_EXCEEDED / QUOTA_CHANGED, from the fleet's allocation."""

    def __init__(self, fleet: Fleet, settings: SimSettings) -> None:
        self.fleet = fleet
        self.seed = settings.seed
        self.rng = np.random.default_rng([settings.seed, 12])
        self.start_ms = settings.start_ms
        self.exhaust_ms = settings.crunch_exhaust_s * 1000
        self.quotas: list[_Quota] = []
        by_key: dict[tuple[str, str], list[int]] = {}
        for node in fleet.gpu_nodes:
            by_key.setdefault((node.zone, node.model.gke_accelerator), []).append(node.index)
        for (zone, accelerator), nodes in by_key.items():
            gpus = GPUS_PER_NODE * len(nodes)
            metric = accelerator.replace("-", "_") + "_gpus"
            self._add(zone, f"compute.googleapis.com/{metric}", metric.upper(), nodes, 0, gpus)
        ramped = [q for q in self.quotas if q.zone == settings.crunch_zone and q.nodes]
        for quota in ramped[:1]:
            quota.ramp = True
        for s in fleet.slices:
            gen = s.shape.generation.generation
            self._add(
                s.zone,
                f"tpu.googleapis.com/{gen}_chips",
                f"TPU{gen.upper()}ChipsPerProjectPerZone",
                [],
                s.shape.chips,
                s.shape.chips,
            )

    def _add(
        self, zone: str, metric: str, display: str, nodes: list[int], chips: int, held: int
    ) -> None:
        for quota in self.quotas:
            if (quota.zone, quota.metric) == (zone, metric):
                quota.chips += chips
                quota.limit += 8 * round(held * 1.3 / 8)
                return
        limit = float(max(8, 8 * round(held * 1.3 / 8)))
        self.quotas.append(_Quota(zone, metric, display, nodes, chips, limit, 0.05 * limit))

    def tick(self, t_ms: int, node_job: list[int], interval_s: float) -> list[CapacityEvent]:
        events = []
        for quota in self.quotas:
            # Other teams' demand creeps up ~2 % of the limit per hour and sometimes drops.
            step = self.rng.normal(0.02 * interval_s / 3600, 0.01) * quota.limit
            if self.rng.random() < 0.01:
                step -= self.rng.uniform(0.1, 0.3) * quota.limit
            quota.external = max(0.0, quota.external + step)
            own = float(
                GPUS_PER_NODE * sum(1 for n in quota.nodes if node_job[n] >= 0) + quota.chips
            )
            if quota.ramp:
                quota.external = max(0.0, self._planned(quota, t_ms) - own)
            wanted = own + quota.external
            usage = float(round(min(quota.limit, wanted)))
            events.append(self._event(t_ms, quota, "QUOTA_USAGE", "info", usage))
            if wanted > quota.limit:
                events.append(self._event(t_ms, quota, "QUOTA_EXCEEDED", "warning", usage))
                granted = self.rng.random() < 0.2
                if granted and not quota.ramp:  # someone files an increase and it is granted
                    quota.limit = float(8 * round(quota.limit * 1.25 / 8))
                    events.append(self._event(t_ms, quota, "QUOTA_CHANGED", "info", usage))
        return events

    def _planned(self, quota: _Quota, t_ms: int) -> float:
        """The crunch scenario's usage: from 40 % of the limit (or all the fleet's own devices
        under it, if more) at the start, a straight line to the limit `crunch_exhaust_s` later,
        and on past it (wanted, refused). Other teams fill what the fleet's jobs leave, so the
        line is the usage whatever the jobs do."""
        start = max(0.4 * quota.limit, float(GPUS_PER_NODE * len(quota.nodes) + quota.chips))
        done = (t_ms - self.start_ms) / self.exhaust_ms
        return start + (quota.limit - start) * done

    def _event(
        self, t_ms: int, quota: _Quota, kind: str, severity: str, usage: float
    ) -> CapacityEvent:
        region = quota.zone.rsplit("-", 1)[0]
        message = {
            "QUOTA_USAGE": f"{quota.metric}: {usage:.0f} of {quota.limit:.0f} in use",
            "QUOTA_EXCEEDED": f"Quota '{quota.display}' exceeded. "
            f"Limit: {quota.limit:.1f} in region {region}.",
            "QUOTA_CHANGED": f"Quota '{quota.display}' raised to {quota.limit:.0f}",
        }[kind]
        return CapacityEvent(
            event_id=stable_id("cap", self.seed, "quota", quota.zone, quota.metric, kind, t_ms),
            ts=t_ms,
            provider="gcp",
            source="gcp.monitoring.quota",
            kind=kind,  # type: ignore[arg-type]
            severity=severity,  # type: ignore[arg-type]
            region=region,
            zone=quota.zone,
            quota=QuotaInfo(metric=quota.metric, limit=quota.limit, usage=usage),
            error_code="QUOTA_EXCEEDED" if kind == "QUOTA_EXCEEDED" else None,
            message=message,
        )


def schedule_background(ctx: Injector) -> None:
    """Stock-outs, reservation changes and queued-resource lifecycles, per zone."""
    rng = np.random.default_rng([ctx.settings.seed, 13])
    reserving = np.random.default_rng([ctx.settings.seed, 14])
    boost = background_boost(ctx.settings)
    span_h = (ctx.end_ms - ctx.start_ms) / HOUR
    tpu_zones = {s.zone: s for s in ctx.fleet.slices}
    _crunch_scenario(ctx)
    for zone in ctx.fleet.zones:
        accelerators = [n.model.gke_accelerator for n in ctx.fleet.gpu_nodes if n.zone == zone]
        accelerators += [s.accelerator_type for s in ctx.fleet.slices if s.zone == zone]
        for ts in _arrivals(rng, STOCKOUTS_PER_ZONE_DAY * boost / 24, span_h, ctx.start_ms):
            accelerator = str(rng.choice(accelerators))
            ctx.capacity(
                ts,
                "STOCKOUT",
                zone,
                severity="warning",
                source="gcp.compute.error",
                accelerator_type=accelerator,
                error_code="ZONE_RESOURCE_POOL_EXHAUSTED",
                message=f"The zone 'projects/fleetpulse-sim/zones/{zone}' does not have enough "
                "resources available to fulfill the request. Try a different zone, or try again "
                "later.",
            )
        _keep_stream(rng, accelerators, boost, span_h, ctx.start_ms)
        for accelerator, (unit, held) in _reservable(ctx.fleet, zone).items():
            _reservation(ctx, reserving, zone, accelerator, unit, held, span_h)
        if zone in tpu_zones:
            for ts in _arrivals(
                rng, QUEUED_RESOURCES_PER_ZONE_DAY * boost / 24, span_h, ctx.start_ms
            ):
                _queued_resource(ctx, rng, ts, tpu_zones[zone].accelerator_type, zone)


def _crunch_scenario(ctx: Injector) -> None:
    """The crunch scenario (SimSettings.crunch_zone): stock-outs of the zone's GPU type, one
    every 10 minutes from an hour before its quota runs out to an hour after; and elsewhere,
    outside the zone's region, half the nodes of that type left without a job for the run:
    the spare capacity a crunch alert should name. (The quota ramp is CapacitySignals'.)"""
    zone = ctx.settings.crunch_zone
    types = sorted({n.model.gke_accelerator for n in ctx.fleet.gpu_nodes if n.zone == zone})
    if not types:
        return
    region = zone.rsplit("-", 1)[0]
    elsewhere: dict[str, list[int]] = {}
    for node in ctx.fleet.gpu_nodes:
        if node.model.gke_accelerator == types[0] and node.region != region:
            elsewhere.setdefault(node.zone, []).append(node.index)
    for nodes in elsewhere.values():
        for index in nodes[: max(1, len(nodes) // 2)]:
            ctx.workload.vacate(index, ctx.start_ms, ctx.end_ms)
    exhaust = ctx.start_ms + ctx.settings.crunch_exhaust_s * 1000
    for ts in range(exhaust - HOUR, exhaust + HOUR, 10 * MINUTE):
        ctx.capacity(
            ts,
            "STOCKOUT",
            zone,
            severity="warning",
            source="gcp.compute.error",
            accelerator_type=types[0],
            error_code="ZONE_RESOURCE_POOL_EXHAUSTED",
            message=f"The zone 'projects/fleetpulse-sim/zones/{zone}' does not have enough "
            "resources available to fulfill the request. Try a different zone, or try again "
            "later.",
        )


def _keep_stream(
    rng: np.random.Generator, accelerators: list[str], boost: float, span_h: float, start: int
) -> None:
    """Draw what the reservation events drawn here before issue 37 drew, and drop it: the
    stock-outs and queued resources after them keep the times and kinds that seeded
    recordings and tests rely on (reservations draw from a stream of their own)."""
    for _ in _arrivals(rng, RESERVATION_CHANGES_PER_ZONE_DAY * boost / 24, span_h, start):
        rng.integers(1, 8)
        rng.choice([-16, -8, 8, 16])
        rng.choice(accelerators)


def _reservable(fleet: Fleet, zone: str) -> dict[str, tuple[int, int]]:
    """Per accelerator type in the zone (GPU type, TPU generation): (devices per VM or host,
    devices the fleet holds there)."""
    held: dict[str, tuple[int, int]] = {}
    for node in fleet.gpu_nodes:
        if node.zone == zone and node.pool_kind != "serve":  # spot VMs use no reservation
            unit, count = held.get(node.model.gke_accelerator, (GPUS_PER_NODE, 0))
            held[node.model.gke_accelerator] = (unit, count + GPUS_PER_NODE)
    for tpu in fleet.slices:
        if tpu.zone == zone:
            prefix = tpu.shape.generation.type_prefix
            per_host = tpu.shape.generation.chips_per_host
            unit, count = held.get(prefix, (per_host, 0))
            held[prefix] = (unit, count + tpu.shape.chips)
    return held


def _reservation(
    ctx: Injector,
    rng: np.random.Generator,
    zone: str,
    accelerator: str,
    unit: int,
    held: int,
    span_h: float,
) -> None:
    """One reservation of half the fleet's devices of a type in a zone, fully used at the
    start; then jobs release and consume it a VM (or TPU host) at a time, and now and then it
    is resized. Each change is a RESERVATION_CHANGED carrying the figures in `quota`."""
    gpu = accelerator.startswith("nvidia-")
    name = f"res-{zone}-{accelerator}"
    path = f"projects/fleetpulse-sim/{'zones' if gpu else 'locations'}/{zone}/reservations/{name}"
    reserved = max(unit, unit * round(held / 2 / unit))
    in_use = reserved
    boost = background_boost(ctx.settings)
    times = _arrivals(rng, RESERVATION_USE_CHANGES_PER_DAY * boost / 24, span_h, ctx.start_ms)
    for index, ts in enumerate([ctx.start_ms, *times]):
        if index and rng.random() < 0.1:
            reserved = max(unit, reserved + unit * int(rng.choice([-1, 1])))
        elif index:
            in_use += unit * int(rng.choice([-1, 1]))
        in_use = max(0, min(in_use, reserved))
        ctx.capacity(
            ts,
            "RESERVATION_CHANGED",
            zone,
            source="gcp.compute.reservation" if gpu else "gcp.tpu.reservation",
            accelerator_type=accelerator,
            quota=QuotaInfo(metric=path, limit=reserved, usage=in_use, unit="devices"),
            state="READY" if gpu else "ACTIVE",
            message=f"reservation {name}: {in_use} of {reserved} {accelerator} in use",
        )


def _arrivals(rng: np.random.Generator, per_h: float, span_h: float, start_ms: int) -> list[int]:
    count = int(rng.poisson(per_h * span_h))
    return sorted(start_ms + int(x) for x in rng.uniform(0, span_h * HOUR, count))


def _queued_resource(
    ctx: Injector, rng: np.random.Generator, ts: int, accelerator: str, zone: str
) -> None:
    name = stable_id("qr", ctx.settings.seed, zone, ts)[:11]
    target = Target(cluster="queued-resources", kind="slice", name=name, pool="queued", zone=zone)
    steps = [("CREATING", 0), ("ACCEPTED", 30_000), ("WAITING_FOR_RESOURCES", MINUTE)]
    if rng.random() < 0.2:  # no capacity before valid_until
        steps.append(("FAILED", int(rng.uniform(30, 90) * MINUTE)))
    else:
        steps += [("PROVISIONING", int(rng.uniform(10, 60) * MINUTE)), ("ACTIVE", 5 * MINUTE)]
    previous: str | None = None
    for state, delay in steps:
        ts += delay
        ctx.capacity(
            ts,
            "QUEUED_RESOURCE_STATE",
            zone,
            severity="warning" if state == "FAILED" else "info",
            source="gcp.tpu.queued_resource",
            target=target,
            accelerator_type=accelerator,
            state=state,
            previous_state=previous,
            error_code="RESOURCE_EXHAUSTED" if state == "FAILED" else None,
            message=f"queued resource {name}: {previous or 'new'} -> {state}",
        )
        previous = state
