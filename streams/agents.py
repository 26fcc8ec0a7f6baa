"""The agents: thin loops that decode a record, call the pure stage in pipeline/runtime/route.py,
store the key's state and queue the outputs. Four stages, each keyed so its inputs meet:

    telemetry  gpu + xid (key node), tpu + ici (key slice)  -> findings (key target),
               table telemetry                                 utilization (key target)
    health     findings + events.node + actions (key target) -> proposals, policy-input (key
               table health                                    pool); node-state (key target);
                                                               zone-input (key zone)
    zone       events.capacity + zone-input (key zone)       -> policy-input (key pool)
               table zones
    policy     policy-input (key pool)                       -> actions (key target),
               table policy                                    alerts (key fingerprint)

A record handler is synchronous: it computes everything, writes the state, then queues the
sends, so nothing else runs between reading a key's state and writing it back. Any record it
cannot handle — undecodable, wrongly keyed, or one that makes a stage raise — becomes a dead
letter, and the stream goes on. Agents run with concurrency 1 (faust #606 loses messages with
more); throughput comes from partitions and workers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline import guard, health, policy
from pipeline.errors import DecodeError
from pipeline.model import (
    CapacityEvent,
    Event,
    Inventory,
    NodeEvent,
    NodeState,
    PolicyRelease,
    Proposal,
)
from pipeline.runtime import route
from pipeline.runtime.topics import record_key, scoped
from streams import zones
from streams.acks import Ack
from streams.align import Aligner
from streams.clock import Family
from streams.context import ANNOUNCE_INPUT, POLICY_INPUT, ZONE_INPUT, Context, Futures
from streams.records import Record, check_key, decode_value, unexpected_error

log = logging.getLogger("fleetpulse.worker")
Handler = Callable[[Context, Record, Event], Futures]

# In the order that equal timestamps are processed in (the simulator's and the embedded
# runtime's: a tick's samples, then the events stamped in it).
TELEMETRY_TOPICS = ("telemetry.gpu", "telemetry.tpu", "telemetry.ici", "events.xid")
HEALTH_TOPICS = ("findings", "events.node", "actions")
# Membership, co-partitioned with telemetry (key cluster/name): kept with the key's state for
# the door, and passed on to the policy stage's guard. Not event-time aligned: its time is
# when the inventory was loaded, not when anything happened.
INVENTORY = "inventory"
# Inputs put in event-time order (align.py): a node's telemetry; findings and other people's
# node events. Our own actions come back late whatever we do, and the zone stage's rule does
# not depend on order, so those are processed as they come.
ALIGNED = {"telemetry": TELEMETRY_TOPICS, "health": ("findings", "events.node")}
ALIGN_MAX_HELD = 20_000  # records held for ordering, at most, per agent


# --- telemetry ----------------------------------------------------------------------------


def handle_telemetry(ctx: Context, record: Record, event: Event) -> Futures:
    if isinstance(event, NodeEvent | CapacityEvent):
        return handle_announcement(ctx, record, event)
    if isinstance(event, Inventory):
        return handle_inventory(ctx, record, event)
    assert isinstance(event, route.Telemetry)  # the topic's value type guarantees it
    key = route.telemetry_key(event)
    check_key(record, key, "cluster/slice" if hasattr(event, "slice") else "cluster/node")
    family = route.FAMILY_OF[type(event)]
    raw_key = key.encode()
    state = ctx.load("telemetry", raw_key, route.TelemetryState)
    wall_ms = int(time.time() * 1000)
    clock = ctx.clocks.clock(family, record.partition)
    state, admitted, refusal, skew = route.door(state, event, clock, ctx.settings, wall_ms)
    futures = ctx.store("telemetry", record.partition, raw_key, state)
    futures += [ctx.send_finding(finding) for finding in skew]
    if refusal is not None or admitted is None:
        reason = refusal.reason if refusal is not None else "refused"
        message = refusal.message if refusal is not None else "refused at the door"
        return [*futures, ctx.send_dead_letter(record, message, reason)]
    if ctx.settings.inventory.enforce and state.inventory is None:
        ctx.metrics.unknown_targets.inc()  # processed, never removed (pipeline/guard.py)
    if isinstance(admitted, route.CLOCK_MOVERS):
        wall = time.monotonic()
        boundaries = ctx.clocks.observe(family, record.partition, key, admitted.ts, wall)
        futures += tick(ctx, family, record.partition, boundaries)
        state = ctx.load("telemetry", raw_key, route.TelemetryState)  # the tick may change it
    state, findings, rows = route.on_telemetry(state, admitted, ctx.settings)
    futures += ctx.store("telemetry", record.partition, raw_key, state)
    ctx.clocks.add_key(record.partition, raw_key, family)
    futures += [ctx.send_finding(finding) for finding in findings]
    futures += [
        ctx.send("utilization", scoped(row.cluster, row.slice or row.node), row) for row in rows
    ]
    return futures


def handle_inventory(ctx: Context, record: Record, event: Inventory | None) -> Futures:
    """What the fleet's owner says a target is (None: a tombstone, it left): kept for the door,
    and passed to the policy stage, whose guard counts members for the budgets."""
    if record.key is None:
        raise DecodeError(field="key", expected="cluster/name", got="no key")
    if event is not None:
        check_key(record, record_key(event), "cluster/name")
    raw_key = record.key
    state = route.on_inventory(ctx.load("telemetry", raw_key, route.TelemetryState), event)
    futures = ctx.store("telemetry", record.partition, raw_key, state)
    if event is not None:
        futures.append(ctx.send(POLICY_INPUT, route.GUARD_KEY, event))
    return futures


def handle_announcement(ctx: Context, record: Record, event: NodeEvent | CapacityEvent) -> Futures:
    """A node or slice goes away on purpose: tell its detectors (only if we know it)."""
    key = route.announcement_key(event)
    if key is None:
        raise DecodeError(field="$.target", expected="the node or slice announced", got="null")
    check_key(record, key, "target")
    raw_key = key.encode()
    state = ctx.load("telemetry", raw_key, route.TelemetryState)
    if state is None:
        return []
    return ctx.store("telemetry", record.partition, raw_key, route.on_announcement(state, event))


def tick(ctx: Context, family: Family, partition: int, boundaries: list[int]) -> Futures:
    """The `family` clock of `partition` crossed `boundaries`: check its keys for staleness."""
    futures: Futures = []
    for now_ms in boundaries:
        for raw_key, known in ctx.clocks.keys_of(partition):
            if known not in (None, family):
                continue
            state = ctx.load("telemetry", raw_key, route.TelemetryState)
            if state is None:
                continue
            if known is None:  # recovered from the changelog: its state says what it is
                known = _family_of(state)
                ctx.clocks.add_key(partition, raw_key, known)
                if known != family:
                    continue
            try:
                resumed = ctx.clocks.clock(family, partition).resumed
                state, findings = route.on_time(state, now_ms, ctx.settings, resumed)
            except Exception:  # no record is to blame: log it, count it, keep the old state
                log.exception("staleness check of %r at %d failed", raw_key, now_ms)
                ctx.metrics.errors.labels("telemetry-tick").inc()
                ctx.drop_cache()
                continue
            state, rows = route.close_silent_windows(state, now_ms, ctx.settings)
            futures += ctx.store("telemetry", partition, raw_key, state)
            futures += [ctx.send_finding(finding) for finding in findings]
            futures += [
                ctx.send("utilization", scoped(row.cluster, row.slice or row.node), row)
                for row in rows
            ]
    return futures


def _family_of(state: route.TelemetryState) -> Family | None:
    if state.gpu is not None or state.xid is not None:
        return "gpu"
    if state.tpu is not None or state.ici is not None:
        return "tpu"
    return None


# --- health -------------------------------------------------------------------------------


def handle_health(ctx: Context, record: Record, signal: Event) -> Futures:
    assert isinstance(signal, route.HealthSignal)
    key = route.health_key(signal)
    check_key(record, key, "target name")
    raw_key = key.encode()
    state = ctx.load("health", raw_key, health.HealthState)
    state, proposals, node_state = route.on_health(state, signal, ctx.settings)
    futures = ctx.store("health", record.partition, raw_key, state)
    if isinstance(signal, NodeEvent):
        futures.append(ctx.send(ANNOUNCE_INPUT, route.health_key(signal), signal))
    for proposal in proposals:
        pool = route.policy_key(proposal)
        futures.append(ctx.send("proposals", pool, proposal))
        # the policy reads proposals and node states from one topic, so it sees a target's
        # proposal and state changes in the order the health machine made them
        futures.append(ctx.send(POLICY_INPUT, pool, proposal))
    if node_state is not None:
        target = node_state.target
        futures.append(ctx.send("node-state", route.target_name(target), node_state))
        futures.append(ctx.send(POLICY_INPUT, route.pool_key(target), node_state))
        futures.append(ctx.send(ZONE_INPUT, target.zone, node_state))
    return futures


# --- zone: capacity fan-out ---------------------------------------------------------------


def handle_zone(ctx: Context, record: Record, event: Event) -> Futures:
    if isinstance(event, NodeState):
        node_state = event
        zone = node_state.target.zone
        check_key(record, zone, "zone")
        before = ctx.load("zones", zone.encode(), zones.ZoneState)
        state, owed = zones.on_node_state(before, node_state)
        if state is before:  # nothing learnt: no changelog write
            return []
        futures = ctx.store("zones", record.partition, zone.encode(), state)
        pool = route.pool_key(node_state.target)
        return futures + [ctx.send(POLICY_INPUT, pool, event) for event in owed]
    assert isinstance(event, CapacityEvent)
    check_key(record, event.zone, "zone")
    before = ctx.load("zones", event.zone.encode(), zones.ZoneState)
    memory = ctx.settings.worker.capacity_memory
    state, pools = zones.on_capacity(before, event, memory)
    futures = ctx.store("zones", record.partition, event.zone.encode(), state)
    announced = route.announcement_key(event)
    if announced is not None:
        futures.append(ctx.send(ANNOUNCE_INPUT, announced, event))
    return futures + [ctx.send(POLICY_INPUT, pool, event) for pool in pools]


# --- policy -------------------------------------------------------------------------------


def handle_policy(ctx: Context, record: Record, signal: Event) -> Futures:
    """One partition for the whole fleet: every removal passes the guard in one order."""
    if not isinstance(signal, Proposal | NodeState | CapacityEvent | Inventory | PolicyRelease):
        raise DecodeError(
            field="$.schema",
            expected="'proposal/2', 'node_state/1', 'capacity_event/1', 'inventory/1' or "
            "'policy_release/1'",
            got=repr(type(signal).__struct_config__.tag),
        )
    if isinstance(signal, CapacityEvent):
        # fanned out by the zone stage: the key is the pool it was sent to
        if record.key is None:
            raise DecodeError(field="key", expected="the pool", got="no key")
        pool = record.key.decode()
    elif isinstance(signal, Inventory | PolicyRelease):
        pool = route.GUARD_KEY
    else:
        pool = route.policy_key(signal)
        check_key(record, pool, "pool")
    raw_key, guard_key = pool.encode(), route.GUARD_KEY.encode()
    state = ctx.load("policy", raw_key, policy.PolicyState) if pool != route.GUARD_KEY else None
    fleet = ctx.load("policy", guard_key, guard.GuardState)
    state, fleet, actions, alerts = route.on_policy(state, fleet, signal, ctx.settings, pool)
    futures = ctx.store("policy", record.partition, guard_key, fleet)
    if state is not None:
        futures += ctx.store("policy", record.partition, raw_key, state)
    futures += [ctx.send_action(action) for action in actions]
    futures += [ctx.send_alert(alert) for alert in alerts]
    return futures


# --- the loop -----------------------------------------------------------------------------


def handle_record(ctx: Context, agent: str, handler: Handler, record: Record) -> Futures:
    """Decode and run `handler`; a record it cannot handle becomes a dead letter, never a
    crash. (For an agent with an Aligner, decoding happened before: see `Stage.receive`.)"""
    started = time.perf_counter()
    try:
        value = ctx.decoded.pop((record.topic, record.partition, record.offset), None)
        if value is None and record.value is None and record.topic == ctx.name(INVENTORY):
            raise _TombstoneError  # normal on a compacted topic: the target left the inventory
        if value is None:
            limit = ctx.settings.kafka.max_value_bytes
            value = decode_value(record, ctx.value_types[record.topic], limit)
        return handler(ctx, record, value)
    except _TombstoneError:
        ctx.metrics.tombstones.labels(record.topic).inc()
        return handle_inventory(ctx, record, None)
    except DecodeError as exc:
        ctx.drop_cache()  # only raised before any state is touched, but cheap to be sure
        return [ctx.send_dead_letter(record, str(exc), exc.reason)]
    except Exception as exc:
        log.exception("%s: record %s[%d]@%d", agent, record.topic, record.partition, record.offset)
        ctx.metrics.errors.labels(agent).inc()
        ctx.drop_cache()
        return [ctx.send_dead_letter(record, unexpected_error(agent, exc), "error")]
    finally:
        ctx.next_offset[(record.topic, record.partition)] = record.offset + 1
        ctx.metrics.latency.labels(agent).observe(time.perf_counter() - started)


class _TombstoneError(Exception):
    """An inventory tombstone: not a bad record."""


Held = tuple[Record, Ack]


@dataclass
class Stage:
    """One agent: its handler, and the Aligner that orders its co-partitioned inputs."""

    ctx: Context
    name: str
    handler: Handler
    aligner: Aligner[Held] | None

    def receive(self, record: Record, ack: Ack) -> None:
        ctx = self.ctx
        ctx.metrics.records_in.labels(record.topic).inc()
        if self.aligner is None or record.topic not in self.aligner.rank:
            self.process([(record, ack)])
            return
        try:
            limit = ctx.settings.kafka.max_value_bytes
            value = decode_value(record, ctx.value_types[record.topic], limit)
        except Exception:  # handle_record makes it a dead letter with the reason
            self.process([(record, ack)])  # order is moot: it goes to the dead letters
            return
        ctx.decoded[(record.topic, record.partition, record.offset)] = value
        ts = getattr(value, "ts", 0)
        self.aligner.hold(record.topic, record.partition, ts, (record, ack), time.monotonic())
        self.release()

    def release(self) -> None:
        if self.aligner is not None and self.aligner.held:
            self.process(self.aligner.release(time.monotonic()))

    def process(self, records: list[Held]) -> None:
        for record, ack in records:
            self.ctx.settler.add(ack, handle_record(self.ctx, self.name, self.handler, record))

    def agent(self) -> Callable[[Any], Any]:
        async def run(stream: Any) -> None:  # a faust Stream
            manual = stream.noack()
            async for event in manual.events():
                self.receive(event.message, functools.partial(manual.ack, event))
                if self.ctx.settler.full():
                    await self.ctx.settler.settle()

        run.__name__ = run.__qualname__ = self.name  # faust names agents after their function
        return run


def _grace(ctx: Context, topics: list[str]) -> Callable[[int], float]:
    """The Aligner's grace for a partition: the configured one while it catches up."""
    grace_s = ctx.settings.worker.align_grace_ms / 1000
    if ctx.settings.worker.align_always:
        return lambda partition: grace_s
    return lambda partition: grace_s if ctx.behind(topics, partition) else 0.0


def register(ctx: Context) -> None:
    t = ctx.topics
    stages: list[tuple[str, list[Any], Handler]] = [
        (
            "telemetry",
            [*(t[s] for s in TELEMETRY_TOPICS), t[ANNOUNCE_INPUT], t[INVENTORY]],
            handle_telemetry,
        ),
        ("health", [t[s] for s in HEALTH_TOPICS], handle_health),
        ("zone", [t["events.capacity"], t[ZONE_INPUT]], handle_zone),
        ("policy", [t[POLICY_INPUT], t["events.policy"]], handle_policy),
    ]
    for name, topics, handler in stages:
        names = [topic.get_topic_name() for topic in topics]
        aligner: Aligner[Held] | None = None
        if name in ALIGNED:
            aligned = [ctx.name(suffix) for suffix in ALIGNED[name]]
            aligner = Aligner(aligned, _grace(ctx, aligned), ALIGN_MAX_HELD)
        stage = Stage(ctx, name, handler, aligner)
        ctx.stages.append(stage)
        channel = ctx.app.topic(
            *names,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        ctx.app.agent(channel, name=name, concurrency=1)(stage.agent())
