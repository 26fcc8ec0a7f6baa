"""capacity_advice/1: where to place `count` devices of a type, for a scheduler.

Options are the zone/provisioning-model snapshots of the type and of its family (the catalog's
equivalents), ranked by, in order:

    1. fits: healthy free devices cover the count
    2. quota: the quota headroom covers the count (unknown quota counts as covering it) and
       no forecast sees it spent within crunch_quota_within_s
    3. the type asked for before an equivalent one
    4. price per device-hour, cheapest first (unknown price last)
    5. most healthy free devices, then zone name (a stable order)

A MultiKueue dispatcher or a SkyPilot-style optimizer takes the first option that fits; when
none fits, the advice is to wait or to widen (the options still say where the most is).
The id is derived from the type, count and the ranked places (not the time), so an unchanged
ranking repeats its id and a consumer can skip it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pipeline.config import CapacitySettings
from pipeline.ids import stable_id
from pipeline.model import AdviceOption, CapacityAdvice, CapacitySnapshot

MAX_OPTIONS = 20


def advise(
    snapshots: Sequence[CapacitySnapshot],
    accelerator_type: str,
    count: int,
    settings: CapacitySettings,
    equivalents: Iterable[str] = (),
) -> CapacityAdvice | None:
    """The ranked advice, or None when no snapshot has the type or its family."""
    types = [accelerator_type, *equivalents]
    chosen = [s for s in snapshots if s.accelerator_type in types]
    if not chosen:
        return None
    ranked = sorted(chosen, key=lambda s: _rank_key(s, count, accelerator_type, settings))
    options = [_option(rank, s, count) for rank, s in enumerate(ranked[:MAX_OPTIONS], 1)]
    places = [(o.zone, o.accelerator_type, o.provisioning_model, o.healthy_free) for o in options]
    return CapacityAdvice(
        ts=max(s.ts for s in chosen),
        advice_id=stable_id("adv", accelerator_type, count, *places),
        accelerator_type=accelerator_type,
        count=count,
        options=options,
    )


def _rank_key(
    snapshot: CapacitySnapshot, count: int, asked: str, settings: CapacitySettings
) -> tuple[bool, bool, bool, float, int, str, str]:
    price = snapshot.price.usd_per_hour if snapshot.price is not None else float("inf")
    return (
        snapshot.healthy_free < count,
        not _quota_covers(snapshot, count, settings),
        snapshot.accelerator_type != asked,
        price,
        -snapshot.healthy_free,
        snapshot.zone,
        snapshot.provisioning_model,
    )


def _quota_covers(snapshot: CapacitySnapshot, count: int, settings: CapacitySettings) -> bool:
    quota = snapshot.quota
    if quota is None:
        return True
    if quota.headroom < count:
        return False
    if quota.exhausts_at is None or quota.confidence < settings.crunch_confidence:
        return True
    return quota.exhausts_at - snapshot.ts > settings.crunch_quota_within_s * 1000


def _option(rank: int, snapshot: CapacitySnapshot, count: int) -> AdviceOption:
    quota = snapshot.quota
    return AdviceOption(
        rank=rank,
        region=snapshot.region,
        zone=snapshot.zone,
        accelerator_type=snapshot.accelerator_type,
        provisioning_model=snapshot.provisioning_model,
        healthy_free=snapshot.healthy_free,
        fits=snapshot.healthy_free >= count,
        quota_headroom=None if quota is None else quota.headroom,
        quota_exhausts_at=None if quota is None else quota.exhausts_at,
        stockouts_1h=snapshot.stockouts_1h,
        price=snapshot.price,
    )
