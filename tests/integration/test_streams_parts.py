"""The worker's own parts, without a broker: the zone fan-out, the aligner, the staleness clocks,
dead letters and the settler that acks only what the broker acknowledged."""

from __future__ import annotations

import asyncio
import base64
import itertools
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.config import load_settings
from pipeline.errors import DecodeError
from pipeline.model import CapacityEvent, DeadLetter, NodeState, Target
from pipeline.stages import base
from pipeline.stages import zone as zones
from pipeline.stages.align import Aligner
from pipeline.wire.group_topics import TABLES, group_topics
from streams import tables
from streams.acks import EXIT_UNSENDABLE, Settler
from streams.app import app_id, create_app
from streams.clock import CATCH_UP_GRACE_MS, IDLE_S, PartitionClocks
from streams.metrics import WorkerMetrics
from streams.records import check_key, decode_value

T0 = 1_767_225_600_000


def _node_state(pool: str, ts: int, zone: str = "z1") -> NodeState:
    target = Target(cluster="c", kind="node", name=f"n-{pool}-{ts}", pool=pool, zone=zone)
    return NodeState(ts=ts, target=target, state="healthy", since=ts)


def _capacity(event_id: str, ts: int, pool: str | None = None) -> CapacityEvent:
    return CapacityEvent(
        event_id=event_id, ts=ts, provider="gcp", source="test", kind="STOCKOUT",
        severity="warning", region="r1", zone="z1", pool=pool, cluster="c" if pool else None,
    )  # fmt: skip


def _deliveries(signals: list[NodeState | CapacityEvent]) -> set[tuple[str, str]]:
    state, sent = None, set()
    for signal in signals:
        if isinstance(signal, NodeState):
            state, owed = zones.on_node_state(state, signal)
            sent |= {(f"c/{signal.target.pool}", event.event_id) for event in owed}
        else:
            state, pools = zones.on_capacity(state, signal, memory=16)
            sent |= {(pool, signal.event_id) for pool in pools}
    return sent


def test_capacity_fan_out_follows_event_time_whatever_the_arrival_order() -> None:
    signals: list[NodeState | CapacityEvent] = [
        _node_state("a", T0 + 10),
        _node_state("b", T0 + 30),
        _node_state("a", T0 + 5),  # a later-arriving, earlier sighting of pool a
        _capacity("cap-00000001", T0 + 7),  # zone-wide: a only (b first seen at +30)
        _capacity("cap-00000002", T0 + 40),  # zone-wide: a and b
        _capacity("cap-00000003", T0 + 1, pool="b"),  # names cluster and pool: b only, whenever
    ]
    expected = {  # policy keys are cluster/pool
        ("c/a", "cap-00000001"),
        ("c/a", "cap-00000002"),
        ("c/b", "cap-00000002"),
        ("c/b", "cap-00000003"),
    }
    for order in itertools.permutations(signals):
        assert _deliveries(list(order)) == expected, order


def test_capacity_memory_is_bounded_and_keeps_the_newest() -> None:
    state = None
    for i in range(10):
        state, _ = zones.on_capacity(state, _capacity(f"cap-{i:08d}", T0 + i), memory=3)
    assert state is not None
    assert [e.event_id for e in state.recent] == ["cap-00000007", "cap-00000008", "cap-00000009"]


def test_aligner_releases_in_event_time_once_every_topic_has_spoken() -> None:
    aligner: Aligner[str] = Aligner(["gpu", "xid"], grace_s=lambda p: 2.0, max_held=100)
    aligner.hold("gpu", 0, T0 + 300, "gpu@300", now=0.0)
    aligner.hold("gpu", 0, T0 + 310, "gpu@310", now=0.0)
    assert aligner.release(now=0.5) == []  # the xid topic could still have something older
    aligner.hold("xid", 0, T0 + 200, "xid@200", now=0.6)
    assert aligner.release(now=0.6) == ["xid@200"]  # then its queue is empty again: wait
    assert aligner.release(now=2.1) == ["gpu@300", "gpu@310"]  # grace over: order given up
    assert aligner.held == 0


def test_aligner_ties_follow_topic_order_and_the_cap_forces_release() -> None:
    aligner: Aligner[str] = Aligner(["gpu", "xid"], grace_s=lambda p: 60.0, max_held=2)
    aligner.hold("xid", 1, T0, "xid", now=0.0)
    aligner.hold("gpu", 1, T0, "gpu", now=0.0)
    assert aligner.release(now=0.0) == ["gpu"]  # a tie: the first listed topic first
    aligner.hold("gpu", 1, T0 + 1, "gpu+1", now=0.0)
    assert aligner.release(now=0.0) == ["xid"]  # and gpu+1 waits for the next xid
    aligner = Aligner(["gpu", "xid"], grace_s=lambda p: 60.0, max_held=2)
    for i in range(3):
        aligner.hold("gpu", 2, T0 + i, f"g{i}", now=0.0)
    assert aligner.release(now=0.0) == ["g0"]  # over the cap: only as much as needed


def test_aligner_forgets_what_it_held_when_its_partitions_are_revoked() -> None:
    aligner: Aligner[str] = Aligner(["gpu", "xid"], grace_s=lambda p: 60.0, max_held=100)
    aligner.hold("gpu", 0, T0, "gpu@0", now=0.0)
    aligner.hold("xid", 1, T0, "xid@0", now=0.0)
    assert aligner.forget() == 2 and aligner.held == 0
    assert aligner.release(now=120.0) == [] and aligner.release_all() == []


def test_partition_clock_ticks_every_boundary_crossed_from_the_second_record_on() -> None:
    clocks = PartitionClocks()
    assert clocks.observe("gpu", 0, "n1", T0 + 5_000, wall=0.0) == []  # first record: starts it
    assert clocks.observe("gpu", 0, "n1", T0 + 9_000, wall=0.0) == []
    assert clocks.observe("gpu", 0, "n1", T0 + 31_000, wall=0.0) == [
        T0 + 10_000,
        T0 + 20_000,
        T0 + 30_000,
    ]
    assert clocks.observe("gpu", 0, "n1", T0 + 25_000, wall=0.0) == []  # late: no going back
    assert clocks.observe("tpu", 0, "s1", T0 + 99_000, wall=0.0) == []  # families are separate
    # an hour with nothing from the whole stream: one tick where it resumed, none for the gap
    far = clocks.observe("gpu", 0, "n1", T0 + 31_000 + 3600_000, wall=0.0)
    assert far == [T0 + 3630_000] and clocks.clock("gpu", 0).resumed == T0 + 3630_000


def test_one_key_ahead_does_not_move_a_partition_clock_of_three() -> None:
    clocks = PartitionClocks()
    for key in ("n1", "n2", "n3"):
        clocks.observe("gpu", 0, key, T0, wall=0.0)
    assert clocks.observe("gpu", 0, "n3", T0 + 3600_000, wall=0.0) == []  # one host, an hour on
    # with a second key the quorum (two) has reached T0 + 10 s, not the hour
    assert clocks.observe("gpu", 0, "n1", T0 + 10_000, wall=0.0) == [T0 + 10_000]
    assert clocks.observe("gpu", 0, "n2", T0 + 20_000, wall=0.0) == [T0 + 20_000]


def test_a_quiet_partition_catches_up_only_when_idle_and_less_a_grace() -> None:
    clocks = PartitionClocks()
    clocks.observe("gpu", 0, "n1", T0, wall=0.0)
    clocks.observe("gpu", 1, "n2", T0, wall=0.0)
    clocks.observe("gpu", 1, "n2", T0 + 600_000, wall=IDLE_S)  # the rest of the fleet moves on
    assert clocks.catch_up("gpu", 0, wall=IDLE_S - 1) == []  # not idle long enough
    due = clocks.catch_up("gpu", 0, wall=IDLE_S + 1)
    assert due and due[-1] == T0 + 600_000 - CATCH_UP_GRACE_MS
    assert clocks.catch_up("tpu", 0, wall=IDLE_S + 1) == []  # no TPU time on this worker


@dataclass
class _Record:
    topic: str = "p.telemetry.gpu"
    partition: int = 2
    offset: int = 41
    timestamp: float = 1_767_225_600.5
    key: bytes | None = b"node-1"
    value: bytes | None = b'{"schema": "gpu_sample/3"}'


def test_a_dead_letter_carries_the_coordinates_the_bytes_and_the_reason() -> None:
    record = _Record()
    with pytest.raises(DecodeError) as raised:
        decode_value(record, NodeState)
    letter = DeadLetter.from_record(
        record, reason=raised.value.reason, error=str(raised.value), ts_ms=int(record.timestamp * 1000)
    )
    assert (letter.topic, letter.partition, letter.offset, letter.key) == (
        "p.telemetry.gpu", 2, 41, "node-1"
    )  # fmt: skip
    assert base64.b64decode(letter.raw_b64) == record.value
    assert letter.ts == 1_767_225_600_500 and "$.ts" in letter.error
    assert letter.reason == "invalid"
    with pytest.raises(DecodeError, match="tombstone") as raised:
        decode_value(_Record(value=None), NodeState)
    assert raised.value.reason == "tombstone"
    with pytest.raises(DecodeError, match="keys decide partitions"):
        check_key(_Record(key=b"node-2"), "node-1", "node")
    assert DeadLetter.from_record(_Record(key=None, value=None), reason="tombstone", error="x"
                                  ).raw_b64 == ""


def test_the_settler_acks_only_what_the_broker_acknowledged() -> None:
    acked: list[int] = []
    exits: list[int] = []

    async def scenario() -> None:
        settler = Settler(WorkerMetrics(), batch=2, exit_=exits.append)
        loop = asyncio.get_running_loop()
        sent: asyncio.Future[Any] = loop.create_future()

        async def ack(n: int) -> None:
            acked.append(n)

        settler.add(lambda: ack(1), [sent])
        settler.add(lambda: ack(2), [])
        assert settler.full()
        await settler.settle()
        await asyncio.sleep(0.01)
        assert acked == []  # the broker has not answered
        sent.set_result(None)
        await settler.drain()
        assert acked == [1, 2]

        failed: asyncio.Future[Any] = loop.create_future()
        failed.set_exception(TimeoutError("broker gone"))
        settler.add(lambda: ack(3), [failed])
        await settler.settle()
        await settler.drain()

    asyncio.run(scenario())
    assert acked == [1, 2] and exits == [EXIT_UNSENDABLE]


def test_the_changelogs_made_ahead_of_faust_are_the_ones_its_tables_use(tmp_path: Path) -> None:
    # workers and `topics create` make the changelogs before faust starts (faust declaring
    # them itself raced the group's first assignment): a name or a partition count of our
    # own that differed from the table's would leave faust racing to make its own again
    settings = load_settings(environ={"FLEETPULSE_WORKER__DATADIR": str(tmp_path)})
    ctx = create_app(settings)
    made = {t.name: t for t in group_topics(settings.kafka, app_id(settings))}
    for table in ctx.tables.values():
        topic = table.changelog_topic
        ours = made[topic.get_topic_name()]
        assert (ours.partitions, ours.configs) == (
            table.partitions, {"cleanup.policy": "compact"}
        )
        assert topic.compacting and not topic.deleting and topic.retention is None
    assert len(ctx.tables) == len(TABLES)


# --- changelog values fenced by the group's generation (streams/tables.py) ----------------

K = b"c/node-1"


def test_a_replay_keeps_the_newest_generation_whatever_the_order_the_writes_landed_in() -> None:
    before = tables.pack(4, b"state before the cut")
    owner = tables.pack(6, b"the new owner's state")  # after the rebalance that fenced gen 4
    late = tables.pack(4, b"the fenced worker's late write")
    again = tables.pack(6, b"the new owner's next state")
    records = [(K, before), (K, owner), (K, late), (K, again)]
    assert list(tables.newest(records, {})) == [0, 1, 3]  # the late write is not applied
    # a value of an older release (no generation) is oldest; the same generation: the later
    legacy = b"x\x01legacy zlib"
    assert list(tables.newest([(K, legacy), (K, before), (K, legacy)], {})) == [0, 1]
    assert list(tables.newest([(K, late), (K, before)], {})) == [0, 1]
    # what the table holds already counts: a late write older than it is not applied
    assert list(tables.newest([(K, late)], {K: 6})) == []
    assert tables.compressed_of(owner) == b"the new owner's state"
    assert tables.compressed_of(legacy) == legacy and tables.generation_of(legacy) == -1


@dataclass
class _Message:
    key: bytes
    value: bytes | None
    partition: int


@dataclass
class _Event:
    message: _Message

    @property
    def key(self) -> bytes:
        return self.message.key

    @property
    def value(self) -> bytes | None:
        return self.message.value


def _fenced_table(tmp_path: Path) -> Any:
    settings = load_settings(environ={"FLEETPULSE_WORKER__DATADIR": str(tmp_path)})
    return create_app(settings).tables["health"]


def test_a_fenced_workers_late_write_does_not_overwrite_the_new_owners_state(
    tmp_path: Path,
) -> None:
    table = _fenced_table(tmp_path)
    owner, late = tables.pack(6, b"owner"), tables.pack(4, b"late")
    # replayed in two batches (faust's buffer), the late write last
    table.apply_changelog_batch([_Event(_Message(K, tables.pack(4, b"before"), 0))])
    table.apply_changelog_batch([_Event(_Message(K, owner, 0)), _Event(_Message(K, late, 0))])
    assert table.data[K] == owner
    # the owner's next write keeps its generation even if the assignment's is lower (a group
    # whose generations started again), so it wins over the state it was computed from
    table.write(0, K, b"next", generation=2)
    assert tables.generation_of(table.data[K]) == 6


def test_a_partition_that_comes_back_is_judged_by_its_replay_alone(tmp_path: Path) -> None:
    from faust.types import TP

    table = _fenced_table(tmp_path)
    changelog = table.changelog_topic.get_topic_name()
    table.apply_changelog_batch([_Event(_Message(K, tables.pack(9, b"held before"), 1))])
    # partition 1 went to another worker and came back: what was held of it proves nothing
    asyncio.run(table.on_rebalance({TP(changelog, 1)}, set(), {TP(changelog, 1)}, 10))
    replayed = tables.pack(3, b"the changelog's newest")
    table.apply_changelog_batch([_Event(_Message(K, replayed, 1))])
    assert table.data[K] == replayed


# --- a stage that raises half-way leaves no half-changed state (streams/context.py) -------


class _Tally(msgspec.Struct):
    seen: list[int] = msgspec.field(default_factory=list)


@dataclass
class _Numbered:
    n: int


@dataclass
class _Rec:
    offset: int
    topic: str = "in"
    partition: int = 0
    timestamp: float = 1_767_225_600.0
    key: bytes | None = b"k"
    value: bytes | None = b"{}"


def _tally(part: Any, event: _Numbered, key: str) -> list[Any]:
    # mutates the state it was given, then (for a record ending in 3) raises: a bug half-way
    state = part.get(key, _Tally) or _Tally()
    state.seen.append(event.n)
    part.put(key, state)
    part.put(f"{key}-twin", _Tally(seen=list(state.seen)))  # a second key, as policy writes
    if event.n % 10 == 3:
        raise RuntimeError(f"bug at {event.n}")
    return []


def _run_tally(ctx: Any, table: str, numbers: list[int]) -> int:
    from streams import agents

    stage = base.Stage(
        name="tally", inputs=(), aligned=(), table=table, key=lambda event, got: got or "",
        on_item=_tally, outputs=(), replayable=table != "telemetry",
    )
    failed = 0
    ctx.send_dead_letter = lambda record, error, reason: error
    for offset, n in enumerate(numbers):
        ctx.decoded[(_Rec.topic, 0, offset)] = _Numbered(n)
        out = agents.handle_record(ctx, stage, _Rec(offset))
        failed += sum("bug at" in str(letter) for letter in out)
    return failed


@pytest.mark.parametrize("table", ["fleet", "telemetry"])
def test_a_stage_that_raises_half_way_leaves_the_states_of_its_good_records(
    tmp_path: Path, table: str
) -> None:
    # fleet: snapshot at flush, records since replayed; telemetry: snapshot per record
    settings = load_settings(environ={"FLEETPULSE_WORKER__DATADIR": str(tmp_path)})
    ctx = create_app(settings)
    assert ("fleet" in ctx.journal) and ("telemetry" not in ctx.journal)
    written: list[tuple[bytes, bytes]] = []
    ctx.tables[table].write = lambda p, key, compressed, gen: written.append((key, compressed))

    assert _run_tally(ctx, table, [1, 2, 3, 4]) == 1
    assert ctx.load(table, b"k", _Tally) == _Tally([1, 2, 4])
    assert ctx.load(table, b"k-twin", _Tally) == _Tally([1, 2, 4])
    ctx.flush()  # what reaches the changelog is the same
    got = {key: base.decode_state(zlib.decompress(c), _Tally) for key, c in written}
    assert got == {b"k": _Tally([1, 2, 4]), b"k-twin": _Tally([1, 2, 4])}
    # after a flush, only the records since it are replayed (the flushed state is kept)
    ctx.tables[table].data[b"k"] = tables.pack(0, zlib.compress(base.encode_state(got[b"k"])))
    ctx.tables[table].data[b"k-twin"] = ctx.tables[table].data[b"k"]
    assert _run_tally(ctx, table, [5, 13, 6, 23, 7]) == 2
    assert ctx.load(table, b"k", _Tally) == _Tally([1, 2, 4, 5, 6, 7])
    assert ctx.metrics.roll_backs.labels(table)._value.get() == 3


def test_a_staleness_check_that_raises_rolls_back_only_the_key_it_checked(tmp_path: Path) -> None:
    from streams import agents

    ctx = create_app(load_settings(environ={"FLEETPULSE_WORKER__DATADIR": str(tmp_path)}))
    part = agents.KafkaPart(ctx, "telemetry", 0)
    for key in ("a", "b"):
        part.put(key, _Tally([1]))
    ctx.commit()
    for key in ("a", "b"):  # one tick: both checked, the check of b raises half-way
        state = part.get(key, _Tally)
        assert state is not None
        state.seen.append(2)
        part.put(key, state)
    part.failed("b", T0, RuntimeError("bug"))
    ctx.commit()
    assert part.get("a", _Tally) == _Tally([1, 2]) and part.get("b", _Tally) == _Tally([1])


def _tally_stage(table: str) -> base.Stage:
    return base.Stage(
        name="tally", inputs=(), aligned=(), table=table, key=lambda event, got: got or "",
        on_item=_tally, outputs=(), replayable=table != "telemetry",
    )


@pytest.mark.parametrize("table", ["fleet", "telemetry"])
def test_a_batch_that_raises_half_way_applies_each_good_value_once(
    tmp_path: Path, table: str
) -> None:
    """A batch has one roll-back point (agents.run_batch): when a value makes the stage
    raise, the batch is undone and run again one value at a time, so the one to blame is a
    dead letter and every other value is applied once, neither lost nor doubled."""
    from streams import agents

    ctx = create_app(load_settings(environ={"FLEETPULSE_WORKER__DATADIR": str(tmp_path)}))
    ctx.send_dead_letter = lambda record, error, reason: error
    stage = _tally_stage(table)

    def batch(numbers: list[int], first: int) -> list[Any]:
        entries = [agents.Entry(_Rec(first + i), _Numbered(n), "k") for i, n in enumerate(numbers)]
        return agents.run_batch(ctx, stage, entries)

    assert batch([1, 2], 0) == [[], []]
    if table == "fleet":  # one journal entry for the batch, to replay after a later failure
        assert len(ctx.journal[table]) == 1
    else:  # one snapshot of the key for the batch, taken once it went through
        assert base.decode_state(ctx.dirty[(table, b"k")][1] or b"", _Tally) == _Tally([1, 2])
    out = batch([4, 13, 5, 6], 2)
    assert [len(futures) for futures in out] == [0, 1, 0, 0]
    assert "value" not in str(out[1][0]) and "bug at 13" in str(out[1][0])
    assert ctx.load(table, b"k", _Tally) == _Tally([1, 2, 4, 5, 6])
    assert ctx.load(table, b"k-twin", _Tally) == _Tally([1, 2, 4, 5, 6])
    assert ctx.metrics.roll_backs.labels(table)._value.get() == 1  # the value to blame only


def test_a_failed_batch_finds_the_partition_clocks_as_the_batch_found_them() -> None:
    """The telemetry stage's values of a failed batch run again one by one: the partition's
    clocks go back to their checkpoint, so the tick boundaries the batch crossed are crossed
    again (their staleness checks run once, with the values that did go through)."""
    clocks = PartitionClocks()
    for n, key in enumerate(("a", "b", "c")):
        clocks.observe("gpu", 0, key, T0 + n, 0.0)
    other = clocks.observe("gpu", 1, "z", T0, 0.0)
    saved = clocks.checkpoint(0)
    crossed = [clocks.observe("gpu", 0, key, T0 + 35_000, 1.0) for key in ("a", "b", "c")]
    assert any(crossed)
    clocks.restore(0, saved)
    assert [clocks.observe("gpu", 0, key, T0 + 35_000, 2.0) for key in ("a", "b", "c")] == crossed
    assert clocks.observe("gpu", 1, "z", T0, 2.0) == other  # another partition's untouched
