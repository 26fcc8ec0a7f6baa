"""Event time per partition for the telemetry stage's staleness checks and door.

A node that stops reporting produces no records, so the only clock that can notice it is the
event time of the *other* records in its partition. Each partition has one robust clock
(pipeline/stages/clock.py) per source family, moved by its own accepted records, and runs
the telemetry stage's `tick` for its keys at every boundary it crosses, with the boundary as
"now" (the ids the embedded runtime makes, whose whole fleet is one stream with the same clocks).

There is one clock per source family, because sources lag differently (Prometheus ~30 s, Cloud
Monitoring ~3 min): GPU nodes are judged by the event time of GPU samples, TPU slices by that
of TPU chip samples. XIDs and ICI samples come from other, faster sources: they are checked
against their family's clock at the door but move none. Fabric samples (node_exporter, scraped
apart from DCGM) have a door clock of their own that they move and that ticks nothing.

A partition can go quiet while the fleet reports (its only node died). A family clock of a
partition that has received nothing for `IDLE_S` of wall time, with nothing left to read,
follows the newest *robust* time of that family on this worker less `CATCH_UP_GRACE_MS`, so the
silent node is still found stale, that much later. The grace also absorbs skew between
partitions, which must never make a reporting node look silent.
"""

from __future__ import annotations

import copy

from pipeline.config import ClockSettings
from pipeline.stages.clock import CLOCKS, FAMILIES, MAX_TICKS, ClockName, Family, RobustClock

__all__ = ["FAMILIES", "MAX_TICKS", "Family", "PartitionClocks"]
IDLE_S = 30.0
CATCH_UP_GRACE_MS = 120_000


class PartitionClocks:
    """A robust clock per family and partition, when each last moved (wall clock), and the
    telemetry keys each partition holds, with their family once known."""

    def __init__(self, settings: ClockSettings | None = None) -> None:
        self.settings = settings or ClockSettings()
        self.clocks: dict[tuple[ClockName, int], RobustClock] = {}
        self.last_seen: dict[tuple[ClockName, int], float] = {}  # wall clock of the last record
        self.keys: dict[int, dict[bytes, Family | None]] = {}

    def clock(self, family: ClockName, partition: int) -> RobustClock:
        found = self.clocks.get((family, partition))
        if found is None:
            found = self.clocks[(family, partition)] = RobustClock(self.settings)
        return found

    def add_key(self, partition: int, key: bytes, family: Family | None) -> None:
        known = self.keys.setdefault(partition, {})
        if family is not None or key not in known:
            known[key] = family

    def keys_of(self, partition: int) -> list[tuple[bytes, Family | None]]:
        # sorted: the order findings are produced in does not depend on arrival order
        return sorted(self.keys.get(partition, {}).items())

    def observe(
        self, family: ClockName, partition: int, key: str, ts: int, wall: float
    ) -> list[int]:
        """Record an accepted event time; return the boundaries to tick at, if any."""
        self.last_seen[(family, partition)] = wall
        return self.clock(family, partition).observe(key, ts)

    def catch_up(self, family: Family, partition: int, wall: float) -> list[int]:
        """Boundaries for a quiet partition (call only when it has nothing left to read)."""
        at = (family, partition)
        mine = self.clocks.get(at)
        if mine is None or mine.ticked is None:
            return []
        if wall - self.last_seen.setdefault(at, wall) < IDLE_S:
            return []
        newest = [
            c.ticked for (f, _), c in self.clocks.items() if f == family and c.ticked is not None
        ]
        return mine.follow(max(newest) - CATCH_UP_GRACE_MS)

    def checkpoint(self, partition: int) -> dict[ClockName, RobustClock]:
        """The partition's clocks as they are (copies), to go back to if a batch fails: the
        records of a failed batch are processed again one by one, and must find the clocks
        (and the tick boundaries they cross) as the batch found them."""
        return {
            name: _copy(clock)
            for (name, p), clock in self.clocks.items()
            if p == partition
        }

    def restore(self, partition: int, checkpoint: dict[ClockName, RobustClock]) -> None:
        for name in CLOCKS:
            self.clocks.pop((name, partition), None)
        for name, clock in checkpoint.items():
            self.clocks[(name, partition)] = clock

    def forget(self, partitions: set[int]) -> None:
        """Partitions revoked: another worker owns their keys and their clocks now."""
        for partition in partitions:
            self.keys.pop(partition, None)
            for name in CLOCKS:
                self.clocks.pop((name, partition), None)
                self.last_seen.pop((name, partition), None)



def _copy(clock: RobustClock) -> RobustClock:
    copied = copy.copy(clock)
    copied.latest, copied.claims = dict(clock.latest), dict(clock.claims)
    return copied
