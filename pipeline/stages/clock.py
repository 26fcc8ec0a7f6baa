"""Event time of a stream of keys that no single key can move: the robust partition clock.

A node that stops reporting produces no records, so staleness is judged by the event time of
the *other* keys in the same stream (a Kafka partition's family, or the embedded runtime's
whole fleet). Taking the newest event time as "now" let one host whose clock ran a day ahead
make every other node look dead. This clock is the newest event time that a quorum of keys
has reached: the k-th newest of the keys' latest times, k = max(2, quorum_pct of the keys)
(k = 1 for a stream of two keys, which cannot out-vote each other; there the door's bound
is all that limits a wrong clock). So k - 1 keys with clocks ahead cannot move it, and dead
keys cannot stop it while k keys report: a monitoring outage of most of a stream stops it,
which is right, since nothing is known then.

It is also the reference the door checks event time against (`check`): a record further
ahead of it than `max_ahead_s`, or further behind than `max_behind_s`, is dead-lettered. The
reference is trusted once `min_keys` keys report; before that only the wall clock (where the
driver has one) bounds how far ahead a record may be.

A record refused as ahead still leaves its key's claim (`claim`): when a quorum of keys claims
a time that far ahead, the stream itself has moved on (a monitoring outage of the whole
stream has ended, a backlog resumes), and records that time are admitted again, so the clock
follows. Without this, a stream silent for longer than `max_ahead_s` would refuse every
record after it, forever. Until the quorum is reached, the first records are dead letters
(visible, counted), never silently dropped. The clock then jumps to the quorum's time in one
tick and remembers it as `resumed`: nothing was known about any key during the gap, so the
staleness checks measure a key's silence from there (telemetry_state.on_time), not from before it.

Cost: O(1) per record. The k-th newest time is computed (O(n log k)) only when k keys have
passed the next tick boundary, so about once per tick.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Literal

from pipeline.config import ClockSettings

# A partition has a clock per source family (GPU nodes by GPU samples, TPU slices by TPU chip
# samples: sources lag differently), and fabric samples a door clock of their own, which ticks
# nothing (stages/telemetry_state.py DOOR_CLOCK).
Family = Literal["gpu", "tpu"]
FAMILIES: tuple[Family, ...] = ("gpu", "tpu")
ClockName = Family | Literal["fabric"]
CLOCKS: tuple[ClockName, ...] = (*FAMILIES, "fabric")
# Staleness is checked each time event time crosses a TICK_MS boundary; both runtimes use
# the boundary itself as "now", so replays and the two runtimes agree on finding ids.
TICK_MS = 10_000
# A clock that jumps further than this (ten minutes) ticks only the last of the boundaries.
MAX_TICKS = 60


def tick_boundary(ts: int) -> int:
    return ts - ts % TICK_MS


@dataclass(frozen=True)
class Verdict:
    """Why the door refuses a record (`reason` for metrics, `message` for the dead letter)."""

    reason: str  # "ahead" or "behind"
    message: str
    skew_ms: int


class RobustClock:
    """Newest event time per key, and the tick boundaries the quorum time has crossed."""

    def __init__(self, settings: ClockSettings) -> None:
        self.settings = settings
        self.latest: dict[str, int] = {}
        self.claims: dict[str, int] = {}  # newest refused-as-ahead time per key (see claim)
        self.ticked: int | None = None  # the last boundary ticked at ("now" of the stream)
        self.resumed: int | None = None  # where the stream last resumed after a gap (see above)
        self._ahead = 0  # keys whose newest time is at or past the next boundary

    def quorum(self) -> int:
        n = len(self.latest)
        if n <= 2:
            return 1
        return min(n, max(2, math.ceil(n * self.settings.quorum_pct / 100)))

    def reference(self) -> int | None:
        """The stream's "now" for door checks, once enough keys report to trust it."""
        if self.ticked is None or len(self.latest) < self.settings.min_keys:
            return None
        return self.ticked + TICK_MS - 1  # the clock is somewhere in the ticked interval

    def check(self, ts: int, wall_ms: int | None = None, key: str | None = None) -> Verdict | None:
        """None when `ts` is plausible; else why not. Pure: the clock does not change."""
        ahead_ms = self.settings.max_ahead_s * 1000
        if wall_ms is not None and ts > wall_ms + ahead_ms:
            return _verdict("ahead", ts - wall_ms, "the receiving process's clock", ahead_ms)
        reference = self.reference()
        if reference is None:
            return None
        if ts > reference + ahead_ms and not self._agreed(key, ts - ahead_ms):
            return _verdict("ahead", ts - reference, "the partition's clock", ahead_ms)
        behind_ms = self.settings.max_behind_s * 1000
        if ts < reference - behind_ms:
            return _verdict("behind", ts - reference, "the partition's clock", behind_ms)
        return None

    def claim(self, key: str, ts: int) -> None:
        """`key` sent a record at `ts` that was refused as ahead of this clock."""
        if ts > self.claims.get(key, ts - 1):
            self.claims[key] = ts

    def _agreed(self, key: str | None, since: int) -> bool:
        """Do a quorum of keys (this one included) claim or have reached `since`? O(keys),
        only on the rare path of a record far ahead of the clock."""
        if key is None:
            return False
        others = sum(
            1
            for k in self.latest.keys() | self.claims.keys()
            if k != key and max(self.latest.get(k, 0), self.claims.get(k, 0)) >= since
        )
        return others + 1 >= self.quorum()

    def skew(self, ts: int) -> int | None:
        """How far `ts` is off the trusted reference (ms), for the clock_skew finding."""
        reference = self.reference()
        return None if reference is None else ts - reference

    def observe(self, key: str, ts: int) -> list[int]:
        """An accepted record of `key` at `ts`: the boundaries to tick at now, oldest first."""
        before = self.latest.get(key)
        if before is not None and ts <= before:
            return []
        self.latest[key] = ts
        if self.claims.get(key, ts + 1) <= ts:
            del self.claims[key]  # caught up with what it claimed
        if self.ticked is None:
            self.ticked = tick_boundary(ts)  # the first record only starts the clock
            self._recount()
            return []
        upcoming = self.ticked + TICK_MS
        if ts >= upcoming and (before is None or before < upcoming):
            self._ahead += 1
        if self._ahead < self.quorum():
            return []
        return self._advance()

    def follow(self, now_ms: int) -> list[int]:
        """Move to `now_ms` without a record (a quiet partition following the others)."""
        if self.ticked is None:
            return []
        boundary = tick_boundary(now_ms)
        last = self.ticked
        if boundary <= last:
            return []
        self.ticked = boundary
        self._recount()
        first = max(last + TICK_MS, boundary - (MAX_TICKS - 1) * TICK_MS)
        return list(range(first, boundary + 1, TICK_MS))

    def forget(self, key: str) -> None:
        """The key left this stream (its partition was revoked)."""
        self.latest.pop(key, None)
        self.claims.pop(key, None)
        self._recount()

    def _advance(self) -> list[int]:
        assert self.ticked is not None
        newest = heapq.nlargest(self.quorum(), self.latest.values())
        boundary = tick_boundary(newest[-1])
        last = self.ticked
        if boundary > last:
            self.ticked = boundary
        self._recount()
        if boundary <= last:
            return []
        if boundary - last > self.settings.max_ahead_s * 1000:  # admitted only by agreement
            self.resumed = boundary
            return [boundary]
        first = max(last + TICK_MS, boundary - (MAX_TICKS - 1) * TICK_MS)
        return list(range(first, boundary + 1, TICK_MS))

    def _recount(self) -> None:
        if self.ticked is None:
            self._ahead = 0
            return
        upcoming = self.ticked + TICK_MS
        self._ahead = sum(1 for ts in self.latest.values() if ts >= upcoming)


def check_control(
    ts: int, wall_ms: int | None, references: list[int], settings: ClockSettings
) -> Verdict | None:
    """A control record's time (inventory, node event, capacity event, release: dated by
    whoever wrote it, never by telemetry) against the receiving process's clock and the
    telemetry clocks the stage sees (`references`): None when it is not further ahead of them
    than max_ahead_s (control_max_ahead_s for the telemetry's clock, which a monitoring
    outage stops). Not checked for being old: a compacted topic's records are legitimately as
    old as the fleet."""
    ahead_ms = settings.max_ahead_s * 1000
    if wall_ms is not None and ts > wall_ms + ahead_ms:
        return _verdict("ahead", ts - wall_ms, "the receiving process's clock", ahead_ms)
    control_ms = settings.control_max_ahead_s * 1000
    if references and ts > max(references) + control_ms:
        return _verdict("ahead", ts - max(references), "the telemetry's clock", control_ms)
    return None


def _verdict(reason: str, skew_ms: int, against: str, bound_ms: int) -> Verdict:
    direction = "ahead of" if skew_ms > 0 else "behind"
    message = (
        f"$.ts: expected an event time within {bound_ms // 1000} s of {against}, "
        f"got one {abs(skew_ms) / 1000:.0f} s {direction} it"
    )
    return Verdict(reason=reason, message=message, skew_ms=skew_ms)
