"""Announced absences: a node or slice that someone said would go away is not a failure.

A node that stops reporting is a hard-fault signal (host hardware died) — unless it was
deleted (spot preemption), drained by a person, or is inside a scheduled maintenance window.
The detectors cannot see those events on their own inputs, so the runtime may pass them in
with `note_event` (node events share the node/slice key with the telemetry; capacity events
name their target). The staleness checks then still report the silence, but as `watch`
instead of a repair: the health machine and the policy decide with the full picture.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pipeline.detect.findings import FOREVER, Announcement, Book
from pipeline.model import CapacityEvent, NodeEvent

# Node events that announce an absence, and those that end it.
_AWAY = {"deleted", "drained"}
_BACK = {"uncordoned", "created", "repaired"}
_CAPACITY_AWAY = {"PREEMPTION", "MAINTENANCE_SCHEDULED", "MAINTENANCE_STARTED"}


class HasBook(Protocol):
    """Any detector state: they all carry their target's Book."""

    book: Book


S = TypeVar("S", bound=HasBook)


def note_event(state: S, event: NodeEvent | CapacityEvent) -> S:
    """Record what a node or capacity event says about the state's target being away.

    Events about other targets are ignored; so are our own cordons (they carry action_id:
    the node is cordoned because it is unhealthy, not going away on purpose).
    """
    book = state.book
    if isinstance(event, NodeEvent):
        if event.target != book.name:
            return state
        if event.kind in _BACK:
            _close(book, event.ts)
        elif event.kind in _AWAY or (event.kind == "cordoned" and event.action_id is None):
            _announce(
                book, Announcement(reason=f"{event.kind} by {event.actor}", start_ts=event.ts)
            )
        return state
    if event.target != book.name:
        return state
    if event.kind == "MAINTENANCE_DONE":
        _close(book, event.ts)
    elif event.kind in _CAPACITY_AWAY:
        window = event.window
        start, end = (window.start, window.end) if window is not None else (event.ts, FOREVER)
        _announce(book, Announcement(reason=event.kind.lower(), start_ts=start, end_ts=end))
    return state


def announced(book: Book, ts: int) -> Announcement | None:
    """The announcement covering `ts`, if any."""
    for note in book.announced:
        if note.start_ts <= ts <= note.end_ts:
            return note
    return None


def _close(book: Book, ts: int) -> None:
    # Ended, not forgotten: a silence that began while it held stays explained.
    for note in book.announced:
        if note.start_ts <= ts < note.end_ts:
            note.end_ts = ts


def _announce(book: Book, note: Announcement) -> None:
    kept = [n for n in book.announced if n.end_ts >= note.start_ts][-3:]
    book.announced = [*kept, note]
