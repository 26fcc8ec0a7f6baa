"""Event-time order across co-partitioned topics, as Kafka Streams does it for a task's inputs.

An agent reading several topics gets their records in whatever order the fetcher returns them:
after a restart with a backlog it may see ten minutes of a node's GPU samples before the XID
that happened in the middle of them, and decide differently than it would have live. The
Aligner holds records per partition number and topic, and releases, per partition, the held
record with the smallest event time — but only while every other topic of that partition
either has a record held or has nothing more to read (fetched up to its high watermark). A
topic that might still deliver an older record holds the partition back, for at most
`max_wait_s` (then order is given up for progress, like `max.task.idle.ms`), and never beyond
`max_held` records. Equal timestamps are released in the order the topics are listed.

Live, every topic is caught up almost always and a record is released as soon as it arrives;
the order matters after downtime, when the backlog is replayed.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
CaughtUp = Callable[[str, int], bool]  # (topic, partition) -> nothing more to read there now


@dataclass(order=True)
class _Held(Generic[T]):
    ts: int
    rank: int
    seq: int
    topic: str = field(compare=False)
    item: T = field(compare=False)


class Aligner(Generic[T]):
    def __init__(self, topics: list[str], max_wait_s: float, max_held: int) -> None:
        self.rank = {topic: i for i, topic in enumerate(topics)}
        self.max_wait_s = max_wait_s
        self.max_held = max_held
        self._queues: dict[int, dict[str, deque[_Held[T]]]] = {}
        self._blocked_since: dict[int, float] = {}
        self._seq = itertools.count()
        self.held = 0

    def hold(self, topic: str, partition: int, ts: int, item: T) -> None:
        queues = self._queues.setdefault(partition, {t: deque() for t in self.rank})
        queues[topic].append(_Held(ts, self.rank[topic], next(self._seq), topic, item))
        self.held += 1

    def release(self, now: float, caught_up: CaughtUp) -> list[T]:
        """The records that may be processed now, in the order to process them."""
        out: list[T] = []
        for partition in sorted(self._queues):
            out += self._release_partition(partition, now, caught_up)
        return out

    def release_all(self) -> list[T]:
        """Everything held, oldest first per partition (shutdown, rebalance)."""
        out: list[T] = []
        for queues in self._queues.values():
            held = sorted(h for queue in queues.values() for h in queue)
            out += [h.item for h in held]
        self._queues.clear()
        self._blocked_since.clear()
        self.held = 0
        return out

    def _release_partition(self, partition: int, now: float, caught_up: CaughtUp) -> list[T]:
        queues = self._queues[partition]
        out: list[T] = []
        while True:
            heads = [queue[0] for queue in queues.values() if queue]
            if not heads:
                self._blocked_since.pop(partition, None)
                return out
            waiting = any(not q and not caught_up(t, partition) for t, q in queues.items())
            if not waiting:
                self._blocked_since.pop(partition, None)
            elif self.held < self.max_held:
                # once a partition has waited max_wait_s it stops waiting until the topic it
                # waited for catches up: a stuck topic must not slow every record down
                since = self._blocked_since.setdefault(partition, now)
                if now - since < self.max_wait_s:
                    return out
            first = min(heads)
            queues[first.topic].popleft()
            self.held -= 1
            out.append(first.item)
