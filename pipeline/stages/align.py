"""Event-time order across co-partitioned topics, within a grace, as stream processors do.

An agent reading several topics gets their records in whatever order the fetcher and the
producers' batching deliver them: after a restart with a backlog it may see minutes of a node's
GPU samples before the XID that happened in the middle of them, and decide differently than
it would have live. The Aligner holds records per partition number and topic, and releases,
per partition, the held record with the smallest event time once either

- every topic of that partition has a record held (nothing older can be missing, as long as
  each topic partition is in time order, which its single producer makes it), or
- it has been held the partition's grace of wall time (an older record arriving later than
  that is processed late, out of order, as it would have been without the Aligner),

and at once for any partition when more than `max_held` records are held. Equal timestamps
are released in the order the topics are listed. The price is up to the grace of latency for
records of a partition where some topic is sparse (XIDs), so the worker asks for a grace only
while a partition catches up on a backlog, where order matters most; live, the grace is 0 and
records go through as they come (WorkerSettings.align_always changes that, for tests).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Held(Generic[T]):
    ts: int
    rank: int
    seq: int
    arrived: float = field(compare=False)
    topic: str = field(compare=False)
    item: T = field(compare=False)


class Aligner(Generic[T]):
    def __init__(self, topics: list[str], grace_s: Callable[[int], float], max_held: int):
        self.rank = {topic: i for i, topic in enumerate(topics)}
        self.grace_s = grace_s  # partition -> seconds
        self.max_held = max_held
        self._queues: dict[int, dict[str, deque[_Held[T]]]] = {}
        self._seq = itertools.count()
        self.held = 0

    def hold(self, topic: str, partition: int, ts: int, item: T, now: float) -> None:
        queues = self._queues.setdefault(partition, {t: deque() for t in self.rank})
        queues[topic].append(_Held(ts, self.rank[topic], next(self._seq), now, topic, item))
        self.held += 1

    def release(self, now: float) -> list[T]:
        """The records that may be processed now, in the order to process them."""
        out: list[T] = []
        for partition in sorted(self._queues):
            grace_s = self.grace_s(partition)
            out += self._release_partition(self._queues[partition], now, grace_s)
        return out

    def release_all(self) -> list[T]:
        """Everything held, oldest first per partition."""
        out: list[T] = []
        for queues in self._queues.values():
            out += [h.item for h in sorted(h for queue in queues.values() for h in queue)]
        self._queues.clear()
        self.held = 0
        return out

    def forget(self) -> int:
        """Drop everything held (its partitions were revoked: the records are processed again
        by whoever owns them now); returns how many."""
        dropped = self.held
        self._queues.clear()
        self.held = 0
        return dropped

    def _release_partition(
        self, queues: dict[str, deque[_Held[T]]], now: float, grace_s: float
    ) -> list[T]:
        out: list[T] = []
        while True:
            heads = [queue[0] for queue in queues.values() if queue]
            if not heads:
                return out
            first = min(heads)
            complete = len(heads) == len(queues)
            if not complete and now - first.arrived < grace_s and self.held <= self.max_held:
                return out
            queues[first.topic].popleft()
            self.held -= 1
            out.append(first.item)
