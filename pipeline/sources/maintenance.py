"""Upcoming maintenance (Compute Engine instances, TPU nodes) → MAINTENANCE_* CapacityEvents.

Both APIs describe it the same way (reference/data-shapes.md §6.3, §6.4): `type` SCHEDULED /
UNSCHEDULED, `window_start_time` / `window_end_time` (RFC 3339), `maintenance_status` PENDING /
ONGOING. The APIs give state, not changes; the last state seen per target is kept in the
checkpoint and a change becomes an event:

- a new or moved window (PENDING)            → MAINTENANCE_SCHEDULED with the window
- ONGOING where it was not                    → MAINTENANCE_STARTED (late notice: move out now)
- no upcoming maintenance where there was one → MAINTENANCE_DONE

The policy cordons and drains maintenance_lead_s before the window and releases after DONE.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

from pipeline.errors import DecodeError
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent, MaintenanceWindow
from pipeline.sources.base import BadRecord, Parsed, add_validated


@dataclass(frozen=True)
class Member:
    """A node or slice as a cloud API lists it: what an event or inventory record needs."""

    cluster: str
    pool: str
    zone: str
    kind: str  # "node" | "slice"
    name: str
    accelerator: str
    capacity: int
    labels: dict[str, str]

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.name}"


@dataclass(frozen=True)
class Upcoming:
    status: str  # PENDING | ONGOING | UNKNOWN
    kind: str  # SCHEDULED | UNSCHEDULED
    start: str  # RFC 3339, as the API says it
    end: str

    @property
    def signature(self) -> str:
        return f"{self.status}|{self.start}|{self.end}"


def rfc3339_ms(text: str, field: str) -> int:
    try:
        return round(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        raise DecodeError(field=field, expected="an RFC 3339 time", got=repr(text)) from None


def maintenance_events(
    seen: dict[str, str],
    current: list[tuple[Member, Upcoming | None]],
    now_ms: int,
    source: str,
) -> Parsed:
    """Events for what changed since `seen` (target key → signature), which is updated."""
    parsed = Parsed()
    for member, upcoming in current:
        before = seen.get(member.key)
        if upcoming is None:
            if before is not None:
                del seen[member.key]
                done = functools.partial(
                    _event, member, "MAINTENANCE_DONE", now_ms, source, before, None
                )
                add_validated(parsed, done, f"{member.key} MAINTENANCE_DONE")
            continue
        if before == upcoming.signature:
            continue
        try:
            window = MaintenanceWindow(
                start=rfc3339_ms(upcoming.start, f"{member.name}.window_start_time"),
                end=rfc3339_ms(upcoming.end or upcoming.start, f"{member.name}.window_end_time"),
            )
        except DecodeError as exc:
            parsed.bad.append(BadRecord(f"{member.key} {upcoming}".encode(), exc))
            continue
        window = MaintenanceWindow(
            start=window.start,
            end=max(window.end, window.start),
            notice_s=max(0, (window.start - now_ms) // 1000),
        )
        ongoing = upcoming.status == "ONGOING"
        was_ongoing = before is not None and before.startswith("ONGOING|")
        if ongoing and was_ongoing:  # the window moved while it runs: nothing to do
            seen[member.key] = upcoming.signature
            continue
        kind = "MAINTENANCE_STARTED" if ongoing else "MAINTENANCE_SCHEDULED"
        make = functools.partial(
            _event, member, kind, now_ms, source, upcoming.signature, window, upcoming.kind
        )
        if add_validated(parsed, make, f"{member.key} {kind} {upcoming.signature}"):
            seen[member.key] = upcoming.signature
    return parsed


def _event(
    member: Member,
    kind: str,
    now_ms: int,
    source: str,
    signature: str,
    window: MaintenanceWindow | None,
    maintenance_type: str = "",
) -> CapacityEvent:
    what = {
        "MAINTENANCE_SCHEDULED": "scheduled",
        "MAINTENANCE_STARTED": "started",
        "MAINTENANCE_DONE": "done",
    }[kind]
    when = f" ({maintenance_type} {signature.split('|', 1)[1].replace('|', ' to ')})"
    return CapacityEvent(
        event_id=stable_id("cap", source, member.key, kind, signature),
        ts=now_ms,
        provider="gcp",
        source=source,
        kind=kind,  # type: ignore[arg-type]
        severity="info" if kind == "MAINTENANCE_DONE" else "warning",
        region=member.zone.rsplit("-", 1)[0],
        zone=member.zone,
        cluster=member.cluster,
        pool=member.pool,
        target_kind=member.kind,  # type: ignore[arg-type]
        target=member.name,
        accelerator_type=member.accelerator or None,
        window=window,
        state=signature.split("|", 1)[0],
        message=f"Host maintenance of {member.kind} {member.name} {what}"
        + (when if window is not None else ""),
    )
