"""Open / clear / heartbeat findings with deterministic ids, and the episode book-keeping.

A check on one device is an episode: one unhealthy finding when it opens (and again each time
it gets markedly worse, see episodes.deepened), one healthy finding when it clears. Ids come
from (target, device, check, episode start), so a replay or a burst inside the same episode
produces the same id and consumers drop the duplicate.
"""

from __future__ import annotations

import msgspec

from pipeline.detect.catalog import HEARTBEAT, spec_of
from pipeline.ids import stable_id
from pipeline.model import (
    Entity,
    EntityKind,
    Evidence,
    Finding,
    GpuSample,
    IciSample,
    RecommendedAction,
    Severity,
    Target,
    TargetKind,
    TpuSample,
    XidEvent,
)

FOREVER = 2**62


class Announcement(msgspec.Struct, kw_only=True, gc=False):
    """Someone said the target would be away (deleted, drained, in maintenance) in this span."""

    reason: str
    start_ts: int
    end_ts: int = FOREVER


class OpenCheck(msgspec.Struct, kw_only=True, gc=False):
    """An open episode: enough to emit its clearing finding later."""

    check: str
    device: str | None
    kind: EntityKind
    start_ts: int
    fatal: bool = False


class Book(msgspec.Struct, kw_only=True):
    """The identity of a node or slice and its open episodes (embedded in each state)."""

    cluster: str
    kind: str  # "node" or "slice"
    name: str
    pool: str
    zone: str
    open: dict[str, OpenCheck] = {}
    last_heartbeat: int = 0
    announced: list[Announcement] = []  # see pipeline.detect.announce

    @classmethod
    def of(cls, record: GpuSample | XidEvent | TpuSample | IciSample) -> Book:
        """The book of the node (GPU, XID) or slice (TPU, ICI) a record belongs to."""
        if isinstance(record, TpuSample | IciSample):
            kind, name = "slice", record.slice
        else:
            kind, name = "node", record.node
        return cls(cluster=record.cluster, kind=kind, name=name, pool=record.pool, zone=record.zone)


def episode_key(check: str, device: str | None) -> str:
    return f"{check}|{device or ''}"


def target_of(book: Book) -> Target:
    kind: TargetKind = "slice" if book.kind == "slice" else "node"
    return Target(cluster=book.cluster, kind=kind, name=book.name, pool=book.pool, zone=book.zone)


def finding_id(book: Book, device: str | None, check: str, start_ts: int, healthy: bool) -> str:
    # The clear of an episode needs its own id, else consumers would drop it as a duplicate.
    parts: tuple[object, ...] = (book.cluster, book.kind, book.name, device or "", check, start_ts)
    return stable_id("fnd", *parts, "clear") if healthy else stable_id("fnd", *parts)


def is_open(book: Book, check: str, device: str | None) -> bool:
    return episode_key(check, device) in book.open


def open_check(
    book: Book,
    ts: int,
    *,
    check: str,
    device: str | None,
    kind: EntityKind,
    severity: Severity,
    action: RecommendedAction,
    evidence: Evidence | None,
    message: str,
    fatal: bool = False,
    key: str | None = None,
    start_ts: int | None = None,
) -> Finding | None:
    """Open an episode and return its finding, or None when it is open already.

    `start_ts` is when the condition began in event time (default `ts`); it names the
    episode, so a condition found by a periodic check gets the same id however often the
    runtime happens to call that check.
    """
    key = key or episode_key(check, device)
    if key in book.open:
        return None
    start = ts if start_ts is None else start_ts
    book.open[key] = OpenCheck(check=check, device=device, kind=kind, start_ts=start, fatal=fatal)
    return Finding(
        finding_id=finding_id(book, device, check, start, healthy=False),
        ts=ts,
        entity=Entity(kind=kind, target=target_of(book), device=device),
        check=check,
        severity=severity,
        healthy=False,
        fatal=fatal,
        recommended_action=action,
        evidence=evidence,
        message=message,
    )


def deepen_check(
    book: Book,
    ts: int,
    *,
    check: str,
    device: str | None,
    severity: Severity,
    action: RecommendedAction,
    evidence: Evidence | None,
    message: str,
    key: str | None = None,
) -> Finding | None:
    """An open episode announced again because it got worse: an unhealthy finding whose id
    comes from the episode and the event time it deepened (a replay gives the same one)."""
    episode = book.open.get(key or episode_key(check, device))
    if episode is None:
        return None
    parts = (book.cluster, book.kind, book.name, episode.device or "", check, episode.start_ts)
    return Finding(
        finding_id=stable_id("fnd", *parts, "deeper", ts),
        ts=ts,
        entity=Entity(kind=episode.kind, target=target_of(book), device=episode.device),
        check=check,
        severity=severity,
        healthy=False,
        fatal=episode.fatal,
        recommended_action=action,
        evidence=evidence,
        message=message,
    )


def clear_check(
    book: Book,
    ts: int,
    check: str,
    device: str | None,
    message: str,
    evidence: Evidence | None = None,
    key: str | None = None,
) -> Finding | None:
    """Close an open episode and return its healthy finding, or None when none is open."""
    episode = book.open.pop(key or episode_key(check, device), None)
    if episode is None:
        return None
    return Finding(
        finding_id=finding_id(book, episode.device, check, episode.start_ts, healthy=True),
        ts=ts,
        entity=Entity(kind=episode.kind, target=target_of(book), device=episode.device),
        check=check,
        severity="info",
        healthy=True,
        recommended_action="none",
        evidence=evidence,
        message=message,
    )


def heartbeat(book: Book, ts: int, every_s: int) -> Finding | None:
    """The health machine's event-time clock (the catalog's `heartbeat`): at most one per
    target per `every_s`."""
    if book.last_heartbeat and ts - book.last_heartbeat < every_s * 1000:
        return None
    book.last_heartbeat = ts
    spec = spec_of(HEARTBEAT)
    return Finding(
        finding_id=finding_id(book, None, HEARTBEAT, ts, healthy=True),
        ts=ts,
        entity=Entity(kind="slice" if book.kind == "slice" else "node", target=target_of(book)),
        check=HEARTBEAT,
        severity=spec.severity,
        healthy=True,
        recommended_action=spec.action,
        message=f"{book.kind} {book.name} reporting; {len(book.open)} open checks",
    )


def evidence(
    metric: str, value: float | None, baseline: float | None, score: float | None, window_s: float
) -> Evidence:
    return Evidence(
        metric=metric,
        value=_clean(value),
        baseline=_clean(baseline),
        score=None if score is None else round(score, 3) if score == score else None,
        window_s=max(0, int(window_s)),
    )


def _clean(value: float | None) -> float | None:
    # Evidence is JSON: NaN/inf are not numbers there.
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return round(value, 6)


def refresh(book: Book, cluster: str, pool: str, zone: str) -> None:
    """Keep the identity current: a node can be moved to another pool."""
    if book.pool != pool or book.zone != zone or book.cluster != cluster:
        book.cluster, book.pool, book.zone = cluster, pool, zone
