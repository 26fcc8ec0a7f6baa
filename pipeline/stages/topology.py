"""The pipeline's topology, declared once: a table of stages that both runtimes interpret.

Each stage names its input topics (FleetPulse topic suffixes and the internal ones), the key
its state is kept under (checked against the record's key: keys decide partitions), its state
table, and three pure functions over the state of one partition of its input:

- `on_item(part, event, key)`: one record; returns its outputs;
- `on_time(part, family, boundaries)`: the partition's clock of a family crossed tick
  boundaries (only the telemetry stage has one, and calls it itself for records that move
  the clock; the Kafka driver also calls it for a quiet partition, see streams/clock.py);
- `on_eof(part)`: end of input (the embedded runtime, backtests; a stream never ends).

`Part` is what a driver gives a stage: the key states of the partition, its robust clocks
(pipeline/stages/clock.py), the settings and, where the driver has one, the wall clock. The
embedded runtime (embedded.py) is one partition holding the whole fleet and routes outputs
to the consuming stage in process; the faust app (streams/agents.py) sends them to topics.
A test of a stage through one driver is a test of both.

State ownership, one rule: **stages mutate the state they are given** (and `put` it), and the
driver keeps the snapshot to roll back to: the Kafka driver keeps every key's last written
state as msgpack bytes (streams/context.py) and decodes it again after a failure; the embedded
runtime stops at the first error, so it keeps none. No stage copies its state.

    stage      inputs (key)                                   state      outputs
    telemetry  telemetry.gpu/tpu/ici/fabric, events.xid (node  telemetry  findings, utilization,
               or slice), inventory, announce-input (target)              policy-input,
                                                                         fleet-input, dlq
    fleet      fleet-input (cluster): fabric ticks, their     fleet      findings, actions
               port findings, placement; peer samples of                 (switch/link verdicts,
               nodes in jobs                                             job stragglers)
    health     findings, events.node, actions (target)        health     proposals, node-state,
                                                                         policy-input, zone-input,
                                                                         announce-input
    zone       events.capacity, zone-input (zone)             zones      policy-input,
                                                                         announce-input
    policy     policy-input (pool), events.policy (guard)     policy     actions, alerts,
                                                                         withheld
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from pipeline.decide import guard, health, policy
from pipeline.errors import DecodeError
from pipeline.model import (
    Action,
    CapacityEvent,
    Event,
    FabricSample,
    FabricTick,
    Finding,
    Inventory,
    NodeEvent,
    NodeState,
    PeerSample,
    PolicyRelease,
    Proposal,
    Utilization,
)
from pipeline.stages import cluster as cluster_fleet
from pipeline.stages import route
from pipeline.stages import zone as zones
from pipeline.stages.clock import RobustClock, check_control
from pipeline.stages.route import ClockName, Family, Refusal
from pipeline.wire.topics import record_key, scoped

S = TypeVar("S")

# Internal topics (the faust app names them `<group>-<name>`): the policy's input keyed by pool
# (proposals, node states, capacity events fanned out by zone, inventory for the guard), the
# zone stage's node states keyed by zone, and node events and targeted capacity events
# (drain, delete, maintenance, preemption) re-keyed by node or slice for the telemetry stage,
# so planned silence is not taken for a failure.
POLICY_INPUT = "policy-input"
ZONE_INPUT = "zone-input"
ANNOUNCE_INPUT = "announce-input"
# The fleet stage's input keyed by cluster: what it takes to see across nodes (fabric samples'
# times and port findings, their nodes' placement; peer samples of nodes running jobs).
FLEET_INPUT = "fleet-input"
INTERNAL: dict[str, type[Event]] = {
    POLICY_INPUT: Event,
    ZONE_INPUT: NodeState,
    ANNOUNCE_INPUT: Event,
    FLEET_INPUT: Event,
}
DEAD_LETTERS = "dlq"
# In the order that equal timestamps are processed in (the simulator's and the embedded
# runtime's: a tick's samples, then the events stamped in it).
TELEMETRY_TOPICS = (
    "telemetry.gpu",
    "telemetry.tpu",
    "telemetry.ici",
    "telemetry.fabric",
    "events.xid",
)
HEALTH_TOPICS = ("findings", "events.node", "actions")
# Membership, co-partitioned with telemetry (key cluster/name): kept with the key's state for
# the door, and passed on to the policy stage's guard. Not event-time aligned: its time is
# when the inventory was loaded, not when anything happened.
INVENTORY = "inventory"
# Why the policy held a proposal back or dropped it (withheld/1): data, nothing acts on it.
WITHHELD = "withheld"


class Out(NamedTuple):
    """One output: to `topic` (suffix or internal name) under `key`. A `Refusal` goes to the
    dead letters, built by the driver from the record it came from."""

    topic: str
    key: str
    event: Event | Refusal


class Part(Protocol):
    """One partition of a stage's input, as the driver holds it."""

    @property
    def settings(self) -> Any: ...  # pipeline.config.Settings

    @property
    def wall_ms(self) -> int | None: ...  # the receiving process's clock, if it has one

    def get(self, key: str, cls: type[S]) -> S | None: ...

    def put(self, key: str, state: Any) -> None: ...

    def clock(self, family: ClockName) -> RobustClock: ...

    def observe(self, family: ClockName, key: str, ts: int) -> list[int]:
        """An accepted record of `key` at `ts` moves the family's clock: the boundaries to
        tick at (RobustClock.observe; the Kafka driver also notes when the partition last
        moved, streams/clock.py)."""
        ...

    def keys(self, family: Family | None) -> list[str]:
        """The partition's telemetry keys of `family` (None: all), sorted."""
        ...

    def note_key(self, key: str, family: Family) -> None: ...

    def count(self, what: str) -> None: ...  # "unknown_target", "impossible_values", ...

    def failed(self, key: str, now_ms: int, exc: Exception) -> None:
        """A staleness check raised: no record is to blame (log, count, roll back)."""
        ...


OnItem = Callable[[Part, Any, str], list[Out]]
OnTime = Callable[[Part, Family, list[int]], list[Out]]
OnEof = Callable[[Part], list[Out]]
KeyOf = Callable[[Any, str | None], str]


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]
    aligned: tuple[str, ...]  # inputs put in event-time order while catching up (align.py)
    table: str
    key: KeyOf  # (event, record key) -> the state key, or DecodeError when the key is wrong
    on_item: OnItem
    outputs: tuple[str, ...]
    on_time: OnTime | None = None
    on_eof: OnEof | None = None
    # on_item depends only on the states it reads, the record and the settings: a driver may
    # replay it to rebuild a state (streams/context.py). The telemetry stage is not: it reads
    # the partition's clocks and the wall clock, which a replay would find moved on.
    replayable: bool = True


def expect_key(got: str | None, expected: str, what: str) -> str:
    """Keys decide partitions, and partitions decide which worker holds a target's state: a
    record keyed by anything but its own node/slice/pool would split that state in two."""
    if got != expected:
        raise DecodeError(
            field="key",
            expected=f"{expected!r} (the record's {what}; keys decide partitions)",
            got="no key" if got is None else repr(got),
        )
    return expected


# --- telemetry ----------------------------------------------------------------------------


def telemetry_key(event: Event | None, got: str | None) -> str:
    if event is None:  # an inventory tombstone: the target left
        if got is None:
            raise DecodeError(field="key", expected="cluster/name", got="no key")
        return got
    if isinstance(event, Inventory):
        return expect_key(got, record_key(event), "cluster/name")
    if isinstance(event, NodeEvent | CapacityEvent):
        announced = route.announcement_key(event)
        if announced is None:
            raise DecodeError(field="$.target", expected="the node or slice announced", got="null")
        return expect_key(got, announced, "target")
    assert isinstance(event, route.Telemetry)  # the topic's value type guarantees it
    what = "cluster/slice" if hasattr(event, "slice") else "cluster/node"
    return expect_key(got, route.telemetry_key(event), what)


def control_door(part: Part, event: Event, key: str) -> list[Out]:
    """A control record (inventory, node event, capacity event, policy release) passes the
    door too: one dated further ahead than clock.max_ahead_s of the receiving process's clock,
    or of the telemetry's clock where the stage sees it, is a dead letter (one dated 2286 would
    move the health machine's or a pool's time). [] when it may pass."""
    ts: int = getattr(event, "ts")  # noqa: B009 - every control record has one
    references = [part.clock(family).reference() for family in route.FAMILIES]
    verdict = check_control(
        ts, part.wall_ms, [r for r in references if r is not None], part.settings.clock
    )
    if verdict is None:
        return []
    part.count(f"control_{verdict.reason}")
    return [Out(DEAD_LETTERS, key, Refusal(verdict.reason, verdict.message))]


def on_telemetry(part: Part, event: Event | None, key: str) -> list[Out]:
    if isinstance(event, Inventory):
        refused = control_door(part, event, key)
        if refused:
            return refused
    if event is None or isinstance(event, Inventory):
        return _on_inventory(part, event, key)
    if isinstance(event, NodeEvent | CapacityEvent):
        state = part.get(key, route.TelemetryState)
        if state is not None:  # a node or slice goes away on purpose: tell its detectors
            part.put(key, route.on_announcement(state, event))
        return []
    assert isinstance(event, route.Telemetry)
    family = route.FAMILY_OF[type(event)]
    clock = part.clock(route.DOOR_CLOCK[type(event)])
    state = part.get(key, route.TelemetryState)
    state, admitted, refusal, skew = route.door(state, event, clock, part.settings, part.wall_ms)
    part.put(key, state)
    outs = [_finding(finding) for finding in skew]
    if refusal is not None or admitted is None:
        return [*outs, Out(DEAD_LETTERS, key, refusal or Refusal("refused", "refused"))]
    if part.settings.inventory.enforce and state.inventory is None:
        part.count("unknown_target")  # processed, never removed (pipeline/decide/guard.py)
    admitted, impossible = route.screen(admitted)
    for _ in range(impossible):
        part.count("impossible_values")  # missing data, not evidence (detect/plausible.py)
    if isinstance(admitted, route.CLOCK_MOVERS):
        outs += tick(part, family, part.observe(family, key, admitted.ts))
        state = part.get(key, route.TelemetryState)  # the tick may have changed it
    elif isinstance(admitted, FabricSample):
        part.observe("fabric", key, admitted.ts)  # its door clock only: it ticks nothing
    state, findings, rows = route.on_telemetry(state, admitted, part.settings)
    fleet = route.fleet_inputs(state, admitted, findings, part.settings)
    part.put(key, state)
    part.note_key(key, family)
    outs += [_finding(finding) for finding in findings] + [_row(row) for row in rows]
    cluster = admitted.cluster
    return outs + [Out(FLEET_INPUT, cluster, signal) for signal in fleet]


def _on_inventory(part: Part, event: Inventory | None, key: str) -> list[Out]:
    """What the fleet's owner says a target is (None: a tombstone, it left): kept for the door,
    and passed to the policy stage, whose guard counts members for the budgets."""
    part.put(key, route.on_inventory(part.get(key, route.TelemetryState), event))
    return [] if event is None else [Out(POLICY_INPUT, route.GUARD_KEY, event)]


def tick(part: Part, family: Family, boundaries: list[int]) -> list[Out]:
    """The `family` clock of the partition crossed `boundaries`: check its keys for silence,
    with each boundary as "now" (the same ids whichever driver runs it)."""
    outs: list[Out] = []
    resumed = part.clock(family).resumed
    for now_ms in boundaries:
        for key in part.keys(family):
            state = part.get(key, route.TelemetryState)
            if state is None:
                continue
            try:
                state, findings = route.on_time(state, now_ms, part.settings, resumed)
            except Exception as exc:  # no record is to blame: the driver rolls the key back
                part.failed(key, now_ms, exc)
                continue
            state, rows = route.close_silent_windows(state, now_ms, part.settings)
            part.put(key, state)
            outs += [_finding(finding) for finding in findings] + [_row(row) for row in rows]
    return outs


def flush(part: Part) -> list[Out]:
    """End of input: close the utilization windows still open."""
    outs: list[Out] = []
    for key in part.keys(None):
        state = part.get(key, route.TelemetryState)
        if state is not None:
            outs += [_row(row) for row in route.flush_windows(state)]
    return outs


def family_of(state: route.TelemetryState) -> Family | None:
    if state.gpu is not None or state.xid is not None or state.fabric is not None:
        return "gpu"
    if state.tpu is not None or state.ici is not None:
        return "tpu"
    return None


def _finding(finding: Finding) -> Out:
    return Out("findings", route.health_key(finding), finding)


def _row(row: Utilization) -> Out:
    return Out("utilization", scoped(row.cluster, row.slice or row.node), row)


# --- health -------------------------------------------------------------------------------


def health_key(signal: Event, got: str | None) -> str:
    assert isinstance(signal, route.HealthSignal)
    return expect_key(got, route.health_key(signal), "target name")


def on_health(part: Part, signal: route.HealthSignal, key: str) -> list[Out]:
    if _network_element(signal):  # the fleet stage's verdicts: the network team's, not ours
        return []
    if isinstance(signal, NodeEvent):
        refused = control_door(part, signal, key)
        if refused:
            return refused
    state, proposals, node_state = route.on_health(
        part.get(key, health.HealthState), signal, part.settings
    )
    part.put(key, state)
    outs: list[Out] = []
    if isinstance(signal, NodeEvent):
        outs.append(Out(ANNOUNCE_INPUT, key, signal))
    if node_state is not None:
        target = node_state.target
        outs += [
            Out("node-state", route.target_name(target), node_state),
            Out(POLICY_INPUT, route.pool_key(target), node_state),
            Out(ZONE_INPUT, target.zone, node_state),
        ]
    for proposal in proposals:
        pool = route.policy_key(proposal)
        # the policy reads proposals and node states from one topic: it sees the state a
        # proposal was made in (which reports the action it follows) before the proposal
        outs += [Out("proposals", pool, proposal), Out(POLICY_INPUT, pool, proposal)]
    return outs


def _network_element(signal: route.HealthSignal) -> bool:
    if isinstance(signal, NodeEvent):
        return False  # node_event/2 names nodes and slices only
    target = signal.entity.target if isinstance(signal, Finding) else signal.target
    return target.kind in ("switch", "link")


# --- fleet: fabric localisation, job peers ------------------------------------------------

_FLEET_INPUTS = (Inventory, Finding, FabricTick, FabricSample, PeerSample)


def fleet_key(signal: Event, got: str | None) -> str:
    """One partition per cluster: a leaf switch's or a rail's nodes, and a job's, are in one
    cluster (the zone stage keys by zone the same way)."""
    if not isinstance(signal, _FLEET_INPUTS):
        raise DecodeError(
            field="$.schema",
            expected=("'inventory/1', 'finding/2', 'fabric_tick/1', 'fabric_sample/2' or "
                      "'peer_sample/1'"),
            got=_tag(signal),
        )
    target = signal.entity.target if isinstance(signal, Finding) else signal
    return expect_key(got, target.cluster, "cluster")


def on_fleet(part: Part, signal: cluster_fleet.FleetSignal, key: str) -> list[Out]:
    """Held until every live node of the cluster has reported up to their time, whatever the
    number of workers (pipeline/stages/cluster.py)."""
    state = part.get(key, cluster_fleet.FleetState)
    state, findings, actions = cluster_fleet.on_fleet(state, signal, part.settings, part.wall_ms)
    part.put(key, state)
    return [_finding(finding) for finding in findings] + [_action(a) for a in actions]


def _action(action: Action) -> Out:
    return Out("actions", route.target_name(action.target), action)


# --- zone: capacity fan-out ---------------------------------------------------------------


def zone_key(event: Event, got: str | None) -> str:
    zone = event.target.zone if isinstance(event, NodeState) else getattr(event, "zone", None)
    if not isinstance(zone, str):
        raise DecodeError(field="$.schema", expected="'node_state/2'", got=_tag(event))
    return expect_key(got, zone, "zone")


def on_zone(part: Part, event: NodeState | CapacityEvent, key: str) -> list[Out]:
    before = part.get(key, zones.ZoneState)
    if isinstance(event, NodeState):
        state, owed = zones.on_node_state(before, event)
        if state is before:  # nothing learnt: no changelog write
            return []
        part.put(key, state)
        pool = route.pool_key(event.target)
        return [Out(POLICY_INPUT, pool, capacity) for capacity in owed]
    refused = control_door(part, event, key)
    if refused:
        return refused
    state, pools = zones.on_capacity(before, event, part.settings.worker.capacity_memory)
    part.put(key, state)
    announced = route.announcement_key(event)
    outs = [] if announced is None else [Out(ANNOUNCE_INPUT, announced, event)]
    return outs + [Out(POLICY_INPUT, pool, event) for pool in pools]


# --- policy -------------------------------------------------------------------------------

_POLICY_INPUTS = (Proposal, NodeState, CapacityEvent, Inventory, PolicyRelease)


def policy_key(signal: Event, got: str | None) -> str:
    """One partition for the whole fleet: every removal passes the guard in one order."""
    if not isinstance(signal, _POLICY_INPUTS):
        raise DecodeError(
            field="$.schema",
            expected="'proposal/3', 'node_state/2', 'capacity_event/1', 'inventory/1' or "
            "'policy_release/1'",
            got=_tag(signal),
        )
    if isinstance(signal, CapacityEvent):  # fanned out by the zone stage: keyed by its pool
        if got is None:
            raise DecodeError(field="key", expected="the pool", got="no key")
        return got
    if isinstance(signal, Inventory | PolicyRelease):
        return route.GUARD_KEY
    return expect_key(got, route.policy_key(signal), "pool")


def on_policy(part: Part, signal: route.PolicySignal, pool: str) -> list[Out]:
    if isinstance(signal, PolicyRelease):  # (inventory passed the telemetry stage's door)
        refused = control_door(part, signal, pool)
        if refused:
            return refused
    state = part.get(pool, policy.PolicyState) if pool != route.GUARD_KEY else None
    fleet = part.get(route.GUARD_KEY, guard.GuardState)
    state, fleet, actions, alerts, withheld = route.on_policy(
        state, fleet, signal, part.settings, pool
    )
    part.put(route.GUARD_KEY, fleet)
    if state is not None:
        part.put(pool, state)
    return (
        [_action(a) for a in actions]
        + [Out("alerts", alert.fingerprint, alert) for alert in alerts]
        + [Out(WITHHELD, route.target_name(w.target), w) for w in withheld]
    )


def _tag(event: Event) -> str:
    return repr(type(event).__struct_config__.tag)


# --- the table ----------------------------------------------------------------------------

STAGES: tuple[Stage, ...] = (
    Stage(
        name="telemetry",
        inputs=(*TELEMETRY_TOPICS, ANNOUNCE_INPUT, INVENTORY),
        aligned=TELEMETRY_TOPICS,
        table="telemetry",
        key=telemetry_key,
        on_item=on_telemetry,
        on_time=tick,
        on_eof=flush,
        outputs=("findings", "utilization", POLICY_INPUT, FLEET_INPUT, DEAD_LETTERS),
        replayable=False,
    ),
    Stage(
        name="fleet",
        inputs=(FLEET_INPUT,),
        # one input topic, in the order the telemetry stage (itself aligned) wrote it
        aligned=(),
        table="fleet",
        key=fleet_key,
        on_item=on_fleet,
        outputs=("findings", "actions"),
    ),
    Stage(
        name="health",
        inputs=HEALTH_TOPICS,
        # our own actions come back late whatever we do: processed as they come
        aligned=("findings", "events.node"),
        table="health",
        key=health_key,
        on_item=on_health,
        outputs=(
            "proposals", "node-state", POLICY_INPUT, ZONE_INPUT, ANNOUNCE_INPUT, DEAD_LETTERS
        ),
    ),
    Stage(
        name="zone",
        inputs=("events.capacity", ZONE_INPUT),
        aligned=(),  # the fan-out rule does not depend on arrival order (zones.py)
        table="zones",
        key=zone_key,
        on_item=on_zone,
        outputs=(POLICY_INPUT, ANNOUNCE_INPUT, DEAD_LETTERS),
    ),
    Stage(
        name="policy",
        inputs=(POLICY_INPUT, "events.policy"),
        aligned=(),
        table="policy",
        key=policy_key,
        on_item=on_policy,
        outputs=("actions", "alerts", WITHHELD, DEAD_LETTERS),
    ),
)
# Which stage reads a topic: every topic has at most one reader inside the pipeline.
READER: dict[str, Stage] = {topic: stage for stage in STAGES for topic in stage.inputs}
