"""The worker's own parts, without a broker: the zone fan-out, the aligner, the staleness clocks,
dead letters and the settler that acks only what the broker acknowledged."""

from __future__ import annotations

import asyncio
import base64
import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from pipeline.errors import DecodeError
from pipeline.model import CapacityEvent, NodeState, Target
from streams import zones
from streams.acks import EXIT_UNSENDABLE, Settler
from streams.align import Aligner
from streams.clock import CATCH_UP_GRACE_MS, IDLE_S, PartitionClocks
from streams.metrics import WorkerMetrics
from streams.records import check_key, dead_letter, decode_value

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
    value: bytes | None = b'{"schema": "gpu_sample/2"}'


def test_a_dead_letter_carries_the_coordinates_the_bytes_and_the_reason() -> None:
    record = _Record()
    with pytest.raises(DecodeError) as raised:
        decode_value(record, NodeState)
    letter = dead_letter(record, str(raised.value), raised.value.reason)
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
    assert dead_letter(_Record(key=None, value=None), "x", "tombstone").raw_b64 == ""


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
