"""State tables fenced by the consumer group's generation: a changelog record carries the
generation its writer owned the partition in, and recovery keeps each key's newest.

Why. A worker cut off from the broker past its session timeout has lost its partitions but
cannot know it until it reconnects (`Context.forget_unsettled` runs only then). Meanwhile its
producer holds the changelog records of states it computed before the cut, and sends them as
soon as the connection is back: they land after the new owner's newer states, and a replay in
log order (faust's) would end on the stale one — the key's state forks, and whoever recovers
the partition next carries on from it (tests/faults/test_infra_network.py, the worker
partitioned past the session timeout).

The rule. Kafka gives every assignment of the group a generation, one higher at each
rebalance, and within one generation a partition has one owner. The new owner's generation is
higher than the fenced worker's, whatever the order its records land in; so a replay keeps,
per key, the value of the highest generation, and within a generation the later one (log
order is then the owner's write order). A write never carries a generation lower than the
value it replaces: a group whose metadata expired (empty for longer than the broker's offsets
retention) starts again from generation 1, and its states must still win over those they
were computed from — they do by log order, as before this rule, and the fence holds again once
the generation passes the old one.

Value format: MARK, the generation (4 bytes, big-endian), the zlib-compressed msgpack state
(context.py). A value of an older release has no mark (zlib data starts with 0x78): it is
generation -1, older than any written here.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import faust

log = logging.getLogger("fleetpulse.worker")
MARK = b"\x01"
_GENERATION = struct.Struct(">I")
HEADER = len(MARK) + _GENERATION.size
UNVERSIONED = -1  # a value written before generations were


def pack(generation: int, compressed: bytes) -> bytes:
    return MARK + _GENERATION.pack(generation) + compressed


def generation_of(raw: bytes) -> int:
    if raw[:1] != MARK:
        return UNVERSIONED
    generation: int = _GENERATION.unpack_from(raw, len(MARK))[0]
    return generation


def compressed_of(raw: bytes) -> bytes:
    """The compressed state, without the generation (or the whole of an unversioned value)."""
    return raw[HEADER:] if raw[:1] == MARK else raw


def newest(
    records: Iterable[tuple[bytes, bytes | None]], held: dict[bytes, int]
) -> Iterator[int]:
    """The indexes of `records` (changelog key and value, in log order) that a replay applies:
    a value whose generation is lower than the key's held one (`held`: the generation of what
    the table holds, updated as records apply) is a fenced worker's late write. A tombstone
    always applies (FleetPulse writes none; a person clearing a key means it)."""
    for index, (key, value) in enumerate(records):
        if value is None:
            held.pop(key, None)
            yield index
            continue
        generation = generation_of(value)
        if generation >= held.get(key, UNVERSIONED):
            held[key] = generation
            yield index


class FencedTable(faust.Table[bytes, bytes]):
    """A faust Table of bytes whose changelog values carry their writer's generation."""

    def __init__(self, app: faust.App, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        # per key of the partitions this worker holds: the generation of the value the table
        # holds (replayed or written here), and the key's partition
        self.generations: dict[bytes, int] = {}
        self.key_partitions: dict[bytes, int] = {}

    def write(self, partition: int, key: bytes, compressed: bytes, generation: int) -> Any:
        """Hold `compressed` as the key's state and send it to the changelog, with `generation`
        (the assignment's) or the held value's if that is higher (see the module's doc)."""
        generation = self.generation_for(key, generation)
        raw = pack(generation, compressed)
        self.data[key] = raw
        self.generations[key], self.key_partitions[key] = generation, partition
        return self.send_changelog(partition, key, raw)

    def generation_for(self, key: bytes, generation: int) -> int:
        return max(generation, self.generations.get(key, UNVERSIONED))

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        events = list(batch)
        records = [(event.message.key, event.message.value) for event in events]
        kept = [events[i] for i in newest(records, self.generations)]
        if len(kept) < len(events):
            # a worker was fenced off: said once per batch, not per record
            log.warning("%s: %d changelog records of an older generation than the key's "
                        "not replayed (a fenced worker's late writes)",
                        self.changelog_topic.get_topic_name(), len(events) - len(kept))
        for event in kept:
            self.key_partitions[event.message.key] = event.message.partition
        super().apply_changelog_batch(kept)

    async def on_rebalance(
        self, assigned: set[Any], revoked: set[Any], newly_assigned: set[Any],
        generation_id: int = 0,
    ) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        # what this worker held of a partition it gave up, or that comes back after another
        # owner, is no baseline: the replay of the partition decides from its records alone
        changelog = self.changelog_topic.get_topic_name()
        moved = {tp.partition for tp in revoked | newly_assigned if tp.topic == changelog}
        for key in [k for k, p in self.key_partitions.items() if p in moved]:
            self.generations.pop(key, None)
            del self.key_partitions[key]
