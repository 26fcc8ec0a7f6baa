"""Event time per partition for the telemetry stage's staleness checks.

A node that stops reporting produces no records, so the only clock that can notice it is the
event time of the *other* records in its partition. The embedded runtime sees the whole fleet
in one ordered stream and checks every key at each `route.TICK_MS` boundary; here each
partition (its number, shared by the co-partitioned GPU/XID/TPU/ICI topics) has its own clock,
which moves with the records of that partition, and runs `route.on_time` for its keys when it
crosses a boundary, with the boundary as "now" (the same ids the embedded runtime produces).

A partition may go quiet while the rest of the fleet reports (one node in it, and that node
died). When a partition has no backlog, `catch_up` lets it follow the newest event time seen on
the worker; with a backlog it must not, or its nodes would look stale while their records wait.
"""

from __future__ import annotations

from pipeline.runtime.route import TICK_MS, tick_boundary

# A partition whose clock jumps further than this (ten minutes) ticks only the last of them.
MAX_TICKS = 60


class PartitionClocks:
    """Watermarks (newest event ts), the last tick run, and the keys held, per partition."""

    def __init__(self) -> None:
        self.watermark: dict[int, int] = {}
        self.ticked: dict[int, int] = {}
        self.keys: dict[int, set[bytes]] = {}

    def add_key(self, partition: int, key: bytes) -> None:
        self.keys.setdefault(partition, set()).add(key)

    def keys_of(self, partition: int) -> list[bytes]:
        # sorted: the order findings are produced in does not depend on arrival order
        return sorted(self.keys.get(partition, ()))

    def observe(self, partition: int, ts: int) -> list[int]:
        """Record event time `ts` in `partition`; return the boundaries to tick at, if any."""
        if ts > self.watermark.get(partition, ts - 1):
            self.watermark[partition] = ts
        return self._due(partition, self.watermark[partition])

    def catch_up(self, partition: int) -> list[int]:
        """A partition with no backlog follows the newest event time on this worker."""
        if not self.watermark:
            return []
        return self._due(partition, max(self.watermark.values()))

    def forget(self, partitions: set[int]) -> None:
        """Partitions revoked: another worker owns their keys and their clocks now."""
        for partition in partitions:
            self.watermark.pop(partition, None)
            self.ticked.pop(partition, None)
            self.keys.pop(partition, None)

    def _due(self, partition: int, now: int) -> list[int]:
        boundary = tick_boundary(now)
        last = self.ticked.get(partition)
        if last is None:
            # the first record a worker sees in a partition only starts its clock: the keys it
            # recovered may be stale, but that is for the next boundary to say, with evidence
            self.ticked[partition] = boundary
            return []
        if boundary <= last:
            return []
        self.ticked[partition] = boundary
        # every boundary crossed, as in a fleet-wide stream where some node reports each tick
        first = max(last + TICK_MS, boundary - (MAX_TICKS - 1) * TICK_MS)
        return list(range(first, boundary + 1, TICK_MS))
