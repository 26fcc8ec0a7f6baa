"""The fleet stage's state and logic for one cluster, in event-time order whatever the runtime.

The fleet stage reads one internal topic keyed by cluster, written by the telemetry stage of
every partition that holds one of the cluster's nodes. On Kafka those partitions are spread over
workers that run at their own pace, so the cluster's records arrive interleaved differently
with one worker or three, and after every rebalance. The judgements across nodes (a switch is
several nodes' ports failing within a window, a link is a port's trouble no switch explained
after it; a node against its job's peers at the same time) would then depend on how many
workers there are. So signals are held, and handed to the detectors in (event time, node,
source, the node's own order) once every live node of the cluster has reported up to that time
(the watermark). A node's own records keep their order on any runtime, so the sequence the detectors
see is the same everywhere. A node silent for longer than `node_down_s` no longer holds the
watermark back (it is down, or left: the staleness checks are the telemetry stage's).

Inventory records (placement) are not events in time: they apply on arrival.

A record seen again (a replay after a rebalance) is dropped: one at or before the newest time
already heard from its node and source.
"""

from __future__ import annotations

import msgspec

from pipeline.config import Settings
from pipeline.detect import fabric_localise, job_peers
from pipeline.model import Action, FabricSample, Finding, Inventory, PeerSample
from pipeline.runtime.topics import record_key, scoped

FleetSignal = Inventory | Finding | FabricSample | PeerSample


class Held(msgspec.Struct, kw_only=True, gc=False):
    """A signal waiting for the watermark: ordered by (ts, node, seq)."""

    ts: int
    node: str  # cluster/node
    seq: int  # the node's own arrival order (its records keep their order on any runtime)
    signal: Finding | FabricSample | PeerSample


class FleetState(msgspec.Struct, kw_only=True):
    """What the fleet stage keeps for one cluster: fabric localisation (ports of many nodes
    behind one leaf switch or rail), job peers (a job's nodes against each other), and the
    signals held until the watermark passes them."""

    fabric: fabric_localise.FabricFleetState | None = None
    peers: job_peers.JobPeersState | None = None
    placing: dict[str, fabric_localise.Placement] = {}  # node -> its inventory's placement
    heard: dict[str, int] = {}  # "cluster/node|source" -> newest event time received
    seq: dict[str, int] = {}  # node -> signals received from it
    held: list[Held] = []


def on_fleet(
    state: FleetState | None, signal: FleetSignal, settings: Settings
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
    node = _node(signal)
    source = f"{node}|{'gpu' if isinstance(signal, PeerSample) else 'fabric'}"
    if signal.ts <= state.heard.get(source, -1):
        return state, [], []  # a repeat (the sample that came with it moved `heard` past it)
    state.seq[node] = seq = state.seq.get(node, 0) + 1
    state.held.append(Held(ts=signal.ts, node=node, seq=seq, signal=signal))
    if isinstance(signal, Finding):
        return state, [], []  # its sample follows at the same time, and may move the watermark
    state.heard[source] = signal.ts
    return _release(state, settings)


def _node(signal: Finding | FabricSample | PeerSample) -> str:
    if isinstance(signal, Finding):
        target = signal.entity.target
        return scoped(target.cluster, target.name)
    return scoped(signal.cluster, signal.node)


def watermark(state: FleetState, horizon_ms: int) -> int | None:
    """The time every live node of the cluster has reported up to (None: none heard)."""
    newest: dict[str, int] = {}
    for source, ts in state.heard.items():
        node = source.rpartition("|")[0]
        newest[node] = max(ts, newest.get(node, ts))
    if not newest:
        return None
    top = max(newest.values())
    return min(ts for ts in newest.values() if top - ts <= horizon_ms)


def _release(
    state: FleetState, settings: Settings
) -> tuple[FleetState, list[Finding], list[Action]]:
    mark = watermark(state, settings.detect.node_down_s * 1000)
    if mark is None or not any(h.ts <= mark for h in state.held):
        return state, [], []
    ready = sorted((h for h in state.held if h.ts <= mark), key=_order)
    state.held = [h for h in state.held if h.ts > mark]
    findings: list[Finding] = []
    actions: list[Action] = []
    for held in ready:
        found, acted = _detect(state, held, settings)
        findings += found
        actions += acted
    return state, findings, actions


_RANK = {PeerSample: 0, Finding: 1, FabricSample: 2}  # a fabric sample's findings precede it


def _order(held: Held) -> tuple[int, str, int, int]:
    # a node's GPU and fabric records of one time may be read in either order (two topics)
    return held.ts, held.node, _RANK[type(held.signal)], held.seq


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
    if isinstance(signal, FabricSample):
        state.fabric, found, actions = fabric_localise.advance(
            state.fabric, signal.ts, settings.detect, dry_run
        )
        return found, actions
    state.peers, found = job_peers.detect_job_peers(state.peers, signal, settings.detect)
    return found, []
