"""Event time per partition for the telemetry stage's staleness checks.

A node that stops reporting produces no records, so the only clock that can notice it is the
event time of the *other* records in its partition. The embedded runtime sees the whole fleet
in one ordered stream and checks every key at each `route.TICK_MS` boundary; here each
partition has its own clocks, moved by its own records, and runs `route.on_time` for its keys
at every boundary they cross, with the boundary as "now" (the ids the embedded runtime makes).

There is one clock per source family, because sources lag differently (Prometheus ~30 s, Cloud
Monitoring ~3 min): GPU nodes are judged by the event time of GPU samples, TPU slices by that
of TPU chip samples. XIDs and ICI samples come from other, faster sources and move no clock.

A partition can go quiet while the fleet reports (its only node died). A family clock of a
partition that has received nothing for `IDLE_S` of wall time, with nothing left to read,
follows the newest event time of that family on this worker less `CATCH_UP_GRACE_MS`, so the
silent node is still found stale, that much later. The grace also absorbs skew between
partitions, which must never make a reporting node look silent.
"""

from __future__ import annotations

from typing import Literal

from pipeline.runtime.route import TICK_MS, tick_boundary

Family = Literal["gpu", "tpu"]
FAMILIES: tuple[Family, ...] = ("gpu", "tpu")
# A clock that jumps further than this (ten minutes) ticks only the last of the boundaries.
MAX_TICKS = 60
IDLE_S = 30.0
CATCH_UP_GRACE_MS = 120_000


class PartitionClocks:
    """Watermarks (newest event ts) and the last tick, per family and partition; and the
    telemetry keys each partition holds, with their family once known."""

    def __init__(self) -> None:
        self.watermark: dict[tuple[Family, int], int] = {}
        self.ticked: dict[tuple[Family, int], int] = {}
        self.last_seen: dict[tuple[Family, int], float] = {}  # wall clock of the last record
        self.keys: dict[int, dict[bytes, Family | None]] = {}

    def add_key(self, partition: int, key: bytes, family: Family | None) -> None:
        known = self.keys.setdefault(partition, {})
        if family is not None or key not in known:
            known[key] = family

    def keys_of(self, partition: int) -> list[tuple[bytes, Family | None]]:
        # sorted: the order findings are produced in does not depend on arrival order
        return sorted(self.keys.get(partition, {}).items())

    def observe(self, family: Family, partition: int, ts: int, wall: float) -> list[int]:
        """Record event time `ts` in `partition`; return the boundaries to tick at, if any."""
        clock = (family, partition)
        self.last_seen[clock] = wall
        if ts > self.watermark.get(clock, ts - 1):
            self.watermark[clock] = ts
        return self._due(clock, self.watermark[clock])

    def catch_up(self, family: Family, partition: int, wall: float) -> list[int]:
        """Boundaries for a quiet partition (call only when it has nothing left to read)."""
        clock = (family, partition)
        if wall - self.last_seen.setdefault(clock, wall) < IDLE_S or clock not in self.ticked:
            return []
        newest = [ts for (f, _), ts in self.watermark.items() if f == family]
        if not newest:
            return []
        return self._due(clock, max(newest) - CATCH_UP_GRACE_MS)

    def forget(self, partitions: set[int]) -> None:
        """Partitions revoked: another worker owns their keys and their clocks now."""
        for partition in partitions:
            self.keys.pop(partition, None)
            for family in FAMILIES:
                for table in (self.watermark, self.ticked, self.last_seen):
                    table.pop((family, partition), None)

    def _due(self, clock: tuple[Family, int], now: int) -> list[int]:
        boundary = tick_boundary(now)
        last = self.ticked.get(clock)
        if last is None:
            # the first record a worker sees in a partition only starts its clock: the keys it
            # recovered may be stale, but that is for the next boundary to say, with evidence
            self.ticked[clock] = boundary
            return []
        if boundary <= last:
            return []
        self.ticked[clock] = boundary
        # every boundary crossed, as in a fleet-wide stream where some node reports each tick
        first = max(last + TICK_MS, boundary - (MAX_TICKS - 1) * TICK_MS)
        return list(range(first, boundary + 1, TICK_MS))
