"""The health stage: one health machine per node or slice (pipeline/decide/health.py).

Reads findings, node events and our own actions (fed back) keyed by target (`cluster/name`,
keys.py); its table is `health`. Writes proposals (keyed by pool), every changed node state
(to `node-state`, to the policy's input by pool and to the zone stage by zone), and node
events re-keyed by target to the telemetry stage (`announce-input`: planned silence).
Switch and link verdicts of the fleet stage pass by: they are the network team's.
"""

from __future__ import annotations

import msgspec

from pipeline.config import Settings
from pipeline.decide import health
from pipeline.model import Action, Event, Finding, NodeEvent, NodeState, Proposal
from pipeline.stages.base import Out, Part, Stage, control_door, expect_key
from pipeline.stages.keys import health_key, policy_key, pool_key, target_name
from pipeline.wire.internal import (
    ANNOUNCE_INPUT,
    CAPACITY_INPUT,
    CAPACITY_KEY,
    DEAD_LETTERS,
    HEALTH_TABLE,
    HEALTH_TOPICS,
    POLICY_INPUT,
    ZONE_INPUT,
)

HealthSignal = Finding | NodeEvent | Action
# A node state is republished at the first signal of each REPUBLISH_MS of event time
# (_state_changed).
REPUBLISH_MS = 5 * 60_000


def key(signal: Event, got: str | None) -> str:
    assert isinstance(signal, HealthSignal)  # the topics' value types guarantee it
    return expect_key(got, health_key(signal), "target name")


def on_item(part: Part, signal: HealthSignal, key: str) -> list[Out]:
    if _network_element(signal):  # the fleet stage's verdicts: the network team's, not ours
        return []
    if isinstance(signal, NodeEvent):
        refused = control_door(part, signal, key)
        if refused:
            return refused
    state, proposals, node_state = on_health(
        part.get(key, health.HealthState), signal, part.settings
    )
    part.put(key, state)
    outs: list[Out] = []
    if isinstance(signal, NodeEvent):
        outs.append(Out(ANNOUNCE_INPUT, key, signal))
    if node_state is not None:
        target = node_state.target
        outs += [
            Out("node-state", target_name(target), node_state),
            Out(POLICY_INPUT, pool_key(target), node_state),
            Out(ZONE_INPUT, target.zone, node_state),
            Out(CAPACITY_INPUT, CAPACITY_KEY, node_state),
        ]
    for proposal in proposals:
        pool = policy_key(proposal)
        # the policy reads proposals and node states from one topic: it sees the state a
        # proposal was made in (which reports the action it follows) before the proposal
        outs += [Out("proposals", pool, proposal), Out(POLICY_INPUT, pool, proposal)]
    return outs


def _network_element(signal: HealthSignal) -> bool:
    if isinstance(signal, NodeEvent):
        return False  # node_event/2 names nodes and slices only
    target = signal.entity.target if isinstance(signal, Finding) else signal.target
    return target.kind in ("switch", "link")


def on_health(
    state: health.HealthState | None, signal: HealthSignal, settings: Settings
) -> tuple[health.HealthState, list[Proposal], NodeState | None]:
    """Returns the node state to publish when it changed (or on first sight), else None."""
    before = None if state is None else health.to_node_state(state)
    state, proposals = health.transition(state, signal, settings.health)
    after = health.to_node_state(state)
    changed = before is None or _state_changed(before, after)
    return state, proposals, after if changed else None


def _state_changed(before: NodeState, after: NodeState) -> bool:
    # `ts` moves with every heartbeat; a change of what the state says is news, and so is the
    # first signal of each REPUBLISH_MS of event time: the policy has no clock but its inputs,
    # and maintenance lead times or throttled proposals must not wait for the next failure.
    if before.ts // REPUBLISH_MS != after.ts // REPUBLISH_MS:
        return True
    return msgspec.structs.replace(before, ts=after.ts) != after


STAGE = Stage(
    name="health",
    inputs=HEALTH_TOPICS,
    # our own actions come back late whatever we do: processed as they come
    aligned=("findings", "events.node"),
    table=HEALTH_TABLE,
    key=key,
    on_item=on_item,
    outputs=(
        "proposals",
        "node-state",
        POLICY_INPUT,
        ZONE_INPUT,
        ANNOUNCE_INPUT,
        CAPACITY_INPUT,
        DEAD_LETTERS,
    ),
)
