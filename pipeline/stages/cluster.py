"""The fleet stage (per cluster): fabric localisation and job peers, in event-time order whatever
the runtime.

Reads `fleet-input` keyed by cluster; its table is `fleet` (the stage and table keep their
first name, which the group's changelog and agent carry); writes findings (switch and link
verdicts, job stragglers) and the network team's repair actions.

The fleet stage reads one internal topic keyed by cluster, written by the telemetry stage of
every partition that holds one of the cluster's nodes. On Kafka those partitions are spread over
workers that run at their own pace, so the cluster's records arrive interleaved differently
with one worker or three, and after every rebalance. The judgements across nodes (a switch is
several nodes' ports failing within a window, a link is a port's trouble no switch explained
after it; a node against its job's peers at the same time) would then depend on how many
workers there are. So signals are held, and handed to the detectors in (event time, node,
source, the node's own order) once every live node of the cluster has reported up to that time
(the watermark). A node's own records keep their order on any runtime, so the sequence the detectors
see is the same everywhere.

A node is live while it is heard. It stops holding the watermark back once it has been silent,
in arrivals, for `node_down_s`: the cluster's newest time has moved that far past the newest
time at which the node was last heard, and, where the driver has a wall clock, that much wall
time has passed too (it is down, or left; the staleness checks are the telemetry stage's).
Silence is not measured in the node's own event times because a backlog is read one partition
far ahead of another (after an outage; faust fetches a partition's records in chunks of up
to a megabyte): a live node's records arrive minutes of event time behind the others', and
in a small fleet none of them for ten minutes of the cluster's time, but only seconds of wall
time. The stage waits at most `fleet_wait_max_s` of event time for a node that is behind (a
partition stuck, a host clock far slow): past that, the node's signals are judged as they
arrive. The wall clock decides only whether a node already silent in event time is waited
for; the embedded runtime, which has none, reads in event-time order and never needs it.
(The Kafka driver replays this stage's records after a failed one, streams/context.py: the
replay hears the nodes at its own, later, wall time, so a node may count as live a little
longer than it did the first time. Nothing else the stage decides reads the wall clock.)

Inventory records (placement) are not events in time: they apply on arrival.

A record seen again (a replay after a rebalance) is dropped: one at or before the newest time
already heard from its node and source.
"""

from __future__ import annotations

import heapq

import msgspec

from pipeline.config import Settings
from pipeline.detect import fabric_localise, job_peers
from pipeline.errors import DecodeError
from pipeline.model import Action, Event, FabricSample, FabricTick, Finding, Inventory, PeerSample
from pipeline.stages.base import Out, Part, Stage, action_out, expect_key, finding_out, tag
from pipeline.stages.keys import node_key, record_key, target_name
from pipeline.wire.internal import FLEET_INPUT, FLEET_TABLE

# a FabricSample itself: what workers before FabricTick passed on (their records still read)
FleetSignal = Inventory | Finding | FabricTick | FabricSample | PeerSample


class Held(msgspec.Struct, kw_only=True, gc=False, order=True):
    """A signal waiting for the watermark, ordered by (ts, node, rank, seq): `held` is a heap
    of them, so the next to release is always first. (node, seq) is unique: the signal itself
    is never compared."""

    ts: int
    node: str  # cluster/node
    # a node's GPU and fabric records of one time may be read in either order (two topics):
    # peer sample, then the fabric findings, then the fabric tick (_RANK)
    rank: int = 0
    seq: int  # the node's own arrival order (its records keep their order on any runtime)
    signal: Finding | FabricTick | FabricSample | PeerSample


class FleetState(msgspec.Struct, kw_only=True):
    """What the fleet stage keeps for one cluster: fabric localisation (ports of many nodes
    behind one leaf switch or rail), job peers (a job's nodes against each other), and the
    signals held until the watermark passes them.

    The watermark is kept incrementally (a cluster has thousands of nodes and every signal
    asks for it): `newest` per node, `top` the newest of all, and `marks`, a heap of
    (ts, node) whose stale entries (a node heard again since, or silent beyond the horizon)
    are dropped when they come to the top."""

    fabric: fabric_localise.FabricFleetState | None = None
    peers: job_peers.JobPeersState | None = None
    placing: dict[str, fabric_localise.Placement] = {}  # node -> its inventory's placement
    heard: dict[str, int] = {}  # "cluster/node|source" -> newest event time received
    seq: dict[str, int] = {}  # node -> signals received from it
    held: list[Held] = []  # a heap
    newest: dict[str, int] = {}  # node -> newest event time heard from either source
    # node -> `top` when the node was last heard (its liveness; missing in a state kept before
    # it existed: then its newest time stands in)
    heard_at: dict[str, int] = {}
    heard_wall: dict[str, int] = {}  # node -> the driver's wall clock when last heard (if any)
    top: int = 0
    marks: list[tuple[int, str]] = []  # a heap
    indexed: bool = False  # held, newest and marks kept as above (a state from before: rebuilt)


def on_fleet(
    state: FleetState | None, signal: FleetSignal, settings: Settings, wall_ms: int | None = None
) -> tuple[FleetState, list[Finding], list[Action]]:
    """One signal of the cluster; returns what the signals released by it found. Fabric:
    switch/link findings and the repair actions for the network team's actuator (no node
    health machine acts on them). Job peers: findings about the node, for its health machine."""
    state = state or FleetState()
    if isinstance(signal, Inventory):
        state.placing[record_key(signal)] = fabric_localise.Placement(
            leaf=signal.leaf_switch, rail=signal.rail
        )
        return state, [], []
    if not state.indexed:
        _index(state)
    node = _node(signal)
    source = f"{node}|{'gpu' if isinstance(signal, PeerSample) else 'fabric'}"
    if signal.ts <= state.heard.get(source, -1):
        return state, [], []  # a repeat (the sample that came with it moved `heard` past it)
    state.seq[node] = seq = state.seq.get(node, 0) + 1
    heapq.heappush(
        state.held, Held(ts=signal.ts, node=node, rank=_RANK[type(signal)], seq=seq, signal=signal)
    )
    if isinstance(signal, Finding):
        return state, [], []  # its sample follows at the same time, and may move the watermark
    state.heard[source] = signal.ts
    if signal.ts > state.newest.get(node, -1):
        state.newest[node] = signal.ts
        state.top = max(state.top, signal.ts)
        heapq.heappush(state.marks, (signal.ts, node))
    state.heard_at[node] = state.top
    if wall_ms is not None:
        state.heard_wall[node] = wall_ms
    return _release(state, settings, wall_ms)


def _node(signal: Finding | FabricTick | FabricSample | PeerSample) -> str:
    if isinstance(signal, Finding):
        return target_name(signal.entity.target)
    return node_key(signal.cluster, signal.node)


def watermark(
    state: FleetState, horizon_ms: int, wait_max_ms: int, wall_ms: int | None = None
) -> int | None:
    """The time every live node of the cluster has reported up to (None: none heard): the
    oldest newest time among the nodes last heard within `horizon_ms` of the newest time of
    all (or of `wall_ms`, the wall clock), leaving out those more than `wait_max_ms` behind."""
    marks, top = state.marks, state.top
    while marks:
        ts, node = marks[0]
        if state.newest.get(node) == ts and _live(state, node, horizon_ms, wall_ms) and (
            top - ts <= wait_max_ms
        ):
            return ts
        # heard again since (a newer entry follows), silent past the horizon, or too far behind:
        # it holds nothing back until it is heard with a newer time
        heapq.heappop(marks)
    return None


def _live(state: FleetState, node: str, horizon_ms: int, wall_ms: int | None) -> bool:
    """Heard within the horizon, in the cluster's time at arrival or on the wall clock."""
    if state.top - state.heard_at.get(node, state.newest[node]) <= horizon_ms:
        return True
    heard_wall = state.heard_wall.get(node)
    return wall_ms is not None and heard_wall is not None and wall_ms - heard_wall <= horizon_ms


def _release(
    state: FleetState, settings: Settings, wall_ms: int | None
) -> tuple[FleetState, list[Finding], list[Action]]:
    detect = settings.detect
    mark = watermark(state, detect.node_down_s * 1000, detect.fleet_wait_max_s * 1000, wall_ms)
    findings: list[Finding] = []
    actions: list[Action] = []
    while mark is not None and state.held and state.held[0].ts <= mark:
        found, acted = _detect(state, heapq.heappop(state.held), settings)
        findings += found
        actions += acted
    return state, findings, actions


def _index(state: FleetState) -> None:
    """Build the heaps of a state kept before they existed (the same signals, in order)."""
    state.held = [
        Held(ts=h.ts, node=h.node, rank=_RANK[type(h.signal)], seq=h.seq, signal=h.signal)
        for h in state.held
    ]
    heapq.heapify(state.held)
    state.newest = {}
    for source, ts in state.heard.items():
        node = source.rpartition("|")[0]
        state.newest[node] = max(ts, state.newest.get(node, ts))
    state.top = max(state.newest.values(), default=0)
    state.marks = [(ts, node) for node, ts in state.newest.items()]
    heapq.heapify(state.marks)
    state.indexed = True


# a fabric scrape's findings precede its tick
_RANK = {PeerSample: 0, Finding: 1, FabricTick: 2, FabricSample: 2}


def _detect(
    state: FleetState, held: Held, settings: Settings
) -> tuple[list[Finding], list[Action]]:
    signal, dry_run = held.signal, settings.policy.dry_run
    if isinstance(signal, Finding):
        placement = state.placing.get(held.node) or fabric_localise.Placement()
        state.fabric, found, actions = fabric_localise.localise(
            state.fabric, signal, placement, settings.detect, dry_run
        )
        return found, actions
    if isinstance(signal, FabricTick | FabricSample):
        state.fabric, found, actions = fabric_localise.advance(
            state.fabric, signal.ts, settings.detect, dry_run
        )
        return found, actions
    state.peers, found = job_peers.detect_job_peers(state.peers, signal, settings.detect)
    return found, []


# --- the stage ----------------------------------------------------------------------------

_INPUTS = (Inventory, Finding, FabricTick, FabricSample, PeerSample)


def key(signal: Event, got: str | None) -> str:
    """One partition per cluster: a leaf switch's or a rail's nodes, and a job's, are in one
    cluster (the zone stage keys by zone the same way)."""
    if not isinstance(signal, _INPUTS):
        raise DecodeError(
            field="$.schema",
            expected=("'inventory/1', 'finding/2', 'fabric_tick/1', 'fabric_sample/1' or "
                      "'peer_sample/1'"),
            got=tag(signal),
        )
    target = signal.entity.target if isinstance(signal, Finding) else signal
    return expect_key(got, target.cluster, "cluster")


def on_item(part: Part, signal: FleetSignal, key: str) -> list[Out]:
    """Held until every live node of the cluster has reported up to their time, whatever the
    number of workers (see above)."""
    state = part.get(key, FleetState)
    state, findings, actions = on_fleet(state, signal, part.settings, part.wall_ms)
    part.put(key, state)
    return [finding_out(finding) for finding in findings] + [action_out(a) for a in actions]


STAGE = Stage(
    name="fleet",
    inputs=(FLEET_INPUT,),
    # one input topic, in the order the telemetry stage (itself aligned) wrote it
    aligned=(),
    table=FLEET_TABLE,
    key=key,
    on_item=on_item,
    outputs=("findings", "actions"),
)
