"""FleetPulseCapacityCrunch: an accelerator type running short in a region, and where the
healthy spare capacity of that type (or of an equivalent one) is, with its price.

Per region and type, over its zones' snapshots, the crunch holds when any of:

    free       healthy free devices (all provisioning models) < crunch_free_below
    quota      a zone's quota is spent, or its forecast reaches the limit within
               crunch_quota_within_s at confidence >= crunch_confidence
    stockouts  stock-outs in the last hour (all zones) >= crunch_stockouts

Spare capacity is every other region's snapshot of the type or of its family (the catalog's
equivalents) with healthy free devices, most free first, then cheapest. The rule returns
what holds; a driver turns a scope that starts holding into a firing alert, and one that stops
into its resolved copy (`transitions`), with `alert_labels` / `alert_annotations`.
Pure: the snapshots carry the time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pipeline.config import CapacitySettings
from pipeline.model import CapacitySnapshot

ALERTNAME = "FleetPulseCapacityCrunch"
RUNBOOK_CHECK = "capacity.crunch"  # the runbook's name under policy.runbook_base
SPARE_NAMED = 3  # places named in the alert's description


@dataclass(frozen=True)
class Spare:
    region: str
    zone: str
    accelerator_type: str
    provisioning_model: str
    healthy_free: int
    usd_per_hour: float | None
    price_basis: str | None

    def words(self) -> str:
        price = (
            "price unknown"
            if self.usd_per_hour is None
            else f"${self.usd_per_hour:.2f}/device-hour {self.price_basis}"
        )
        return (
            f"{self.zone} {self.accelerator_type} {self.provisioning_model}: "
            f"{self.healthy_free} healthy free ({price})"
        )


@dataclass(frozen=True)
class Crunch:
    region: str
    accelerator_type: str
    ts: int
    reasons: tuple[str, ...]  # free, quota, stockouts
    healthy_free: int
    detail: str  # the numbers behind the reasons, in words
    spare: tuple[Spare, ...]

    @property
    def scope(self) -> str:
        return f"{self.region}/{self.accelerator_type}"


def crunches(
    snapshots: Sequence[CapacitySnapshot],
    settings: CapacitySettings,
    equivalents: Callable[[str], Iterable[str]] = lambda _: (),
) -> list[Crunch]:
    """Every region and type in a crunch now, in scope order."""
    groups: dict[tuple[str, str], list[CapacitySnapshot]] = defaultdict(list)
    for snapshot in snapshots:
        groups[(snapshot.region, snapshot.accelerator_type)].append(snapshot)
    found = []
    for (region, accelerator), group in sorted(groups.items()):
        reasons, detail = _reasons(group, settings)
        if reasons:
            wanted = {accelerator, *equivalents(accelerator)}
            spare = spare_capacity(snapshots, wanted, exclude_region=region)
            found.append(
                Crunch(
                    region=region,
                    accelerator_type=accelerator,
                    ts=max(s.ts for s in group),
                    reasons=tuple(reasons),
                    healthy_free=sum(s.healthy_free for s in group),
                    detail="; ".join(detail),
                    spare=tuple(spare),
                )
            )
    return found


def _reasons(
    group: Sequence[CapacitySnapshot], settings: CapacitySettings
) -> tuple[list[str], list[str]]:
    reasons, detail = [], []
    free = sum(s.healthy_free for s in group)
    if free < settings.crunch_free_below:
        reasons.append("free")
        detail.append(f"{free} healthy free devices (under {settings.crunch_free_below})")
    short = [s for s in group if _quota_short(s, settings)]
    if short:
        reasons.append("quota")
        detail.extend(_quota_words(s) for s in short)
    stockouts = sum(s.stockouts_1h for s in _one_per_zone(group))
    if stockouts >= settings.crunch_stockouts:
        reasons.append("stockouts")
        detail.append(f"{stockouts} stock-outs in the last hour")
    return reasons, list(dict.fromkeys(detail))


def _quota_short(snapshot: CapacitySnapshot, settings: CapacitySettings) -> bool:
    quota = snapshot.quota
    if quota is None:
        return False
    if quota.headroom <= 0:
        return True
    if quota.exhausts_at is None or quota.confidence < settings.crunch_confidence:
        return False
    return quota.exhausts_at - snapshot.ts <= settings.crunch_quota_within_s * 1000


def _quota_words(snapshot: CapacitySnapshot) -> str:
    quota = snapshot.quota
    assert quota is not None
    if quota.headroom <= 0:
        used = f"{quota.usage:.0f} of {quota.limit:.0f}"
        return f"{snapshot.zone} quota {quota.metric} spent ({used})"
    assert quota.exhausts_at is not None
    hours = (quota.exhausts_at - snapshot.ts) / 3_600_000
    return (
        f"{snapshot.zone} quota {quota.metric} out in {hours:.1f} h "
        f"({quota.headroom:.0f} left, +{quota.trend_per_h:.1f}/h, "
        f"confidence {quota.confidence:.2f})"
    )


def _one_per_zone(group: Sequence[CapacitySnapshot]) -> list[CapacitySnapshot]:
    # stock-outs are per zone and type, repeated on each provisioning model's snapshot
    return list({s.zone: s for s in group}.values())


def spare_capacity(
    snapshots: Iterable[CapacitySnapshot], types: set[str], exclude_region: str
) -> list[Spare]:
    """Places of these types outside the region with healthy free devices: most free first,
    then cheapest."""
    spare = [
        Spare(
            region=s.region,
            zone=s.zone,
            accelerator_type=s.accelerator_type,
            provisioning_model=s.provisioning_model,
            healthy_free=s.healthy_free,
            usd_per_hour=None if s.price is None else s.price.usd_per_hour,
            price_basis=None if s.price is None else s.price.basis,
        )
        for s in snapshots
        if s.accelerator_type in types and s.region != exclude_region and s.healthy_free > 0
    ]
    inf = float("inf")
    return sorted(
        spare,
        key=lambda p: (-p.healthy_free, inf if p.usd_per_hour is None else p.usd_per_hour, p.zone),
    )


def transitions(
    firing: dict[str, int], now: Sequence[Crunch]
) -> tuple[list[Crunch], list[Crunch], list[str]]:
    """(started, still holding, ended scopes); `firing` (scope -> since) is updated in place."""
    current = {c.scope: c for c in now}
    started = [c for scope, c in current.items() if scope not in firing]
    holding = [c for scope, c in current.items() if scope in firing]
    ended = sorted(scope for scope in firing if scope not in current)
    for crunch in started:
        firing[crunch.scope] = crunch.ts
    for scope in ended:
        del firing[scope]
    return started, holding, ended


def alert_labels(scope: str) -> dict[str, str]:
    """The alert's identity: one per region and type (never changes while it fires)."""
    region, _, accelerator = scope.partition("/")
    return {
        "alertname": ALERTNAME,
        "severity": "warning",
        "service": "fleetpulse",
        "region": region,
        "accelerator_type": accelerator,
        "check": RUNBOOK_CHECK,
    }


def alert_annotations(crunch: Crunch) -> dict[str, str]:
    where = "; ".join(s.words() for s in crunch.spare[:SPARE_NAMED])
    summary = f"{crunch.accelerator_type} capacity short in {crunch.region}"
    if crunch.spare:
        summary += f": spare in {crunch.spare[0].zone}"
    return {
        "summary": summary,
        "description": f"{crunch.detail}. Spare: {where or 'none of this type or its family'}.",
        "reasons": ",".join(crunch.reasons),
    }
