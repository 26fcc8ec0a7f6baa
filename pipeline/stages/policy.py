"""The policy stage: every removal in the fleet passes one pool's policy and the fleet's guard.

Reads `policy-input` (proposals, node states, capacity events fanned out by zone, inventory)
keyed by pool (`cluster/pool`, keys.py), and `events.policy` (a person's release of a common
cause); one partition for the whole fleet, so every removal passes the guard in one order.
Its table is `policy`: a `PolicyState` per pool and the guard's `GuardState` under GUARD_KEY.
Writes actions, alerts and why a proposal was withheld.
"""

from __future__ import annotations

from typing import NamedTuple

from pipeline.config import Settings
from pipeline.decide import guard, policy
from pipeline.errors import DecodeError
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    Event,
    Inventory,
    NodeState,
    PolicyRelease,
    Proposal,
    WithheldRecord,
)
from pipeline.stages.base import Out, Part, Stage, action_out, control_door, expect_key, tag
from pipeline.stages.keys import GUARD_KEY, policy_key, target_name
from pipeline.wire.internal import DEAD_LETTERS, POLICY_INPUT, POLICY_TABLE, WITHHELD

PolicySignal = Proposal | NodeState | CapacityEvent | Inventory | PolicyRelease
_INPUTS = (Proposal, NodeState, CapacityEvent, Inventory, PolicyRelease)


def key(signal: Event, got: str | None) -> str:
    """One partition for the whole fleet: every removal passes the guard in one order."""
    if not isinstance(signal, _INPUTS):
        raise DecodeError(
            field="$.schema",
            expected="'proposal/3', 'node_state/2', 'capacity_event/1', 'inventory/1' or "
            "'policy_release/1'",
            got=tag(signal),
        )
    if isinstance(signal, CapacityEvent):  # fanned out by the zone stage: keyed by its pool
        if got is None:
            raise DecodeError(field="key", expected="the pool", got="no key")
        return got
    if isinstance(signal, Inventory | PolicyRelease):
        return GUARD_KEY
    return expect_key(got, policy_key(signal), "pool")


def on_item(part: Part, signal: PolicySignal, pool: str) -> list[Out]:
    if isinstance(signal, PolicyRelease):  # (inventory passed the telemetry stage's door)
        refused = control_door(part, signal, pool)
        if refused:
            return refused
    state = part.get(pool, policy.PolicyState) if pool != GUARD_KEY else None
    fleet = part.get(GUARD_KEY, guard.GuardState)
    state, fleet, actions, alerts, withheld = on_policy(state, fleet, signal, part.settings, pool)
    part.put(GUARD_KEY, fleet)
    if state is not None:
        part.put(pool, state)
    return (
        [action_out(a) for a in actions]
        + [Out("alerts", alert.fingerprint, alert) for alert in alerts]
        + [Out(WITHHELD, target_name(w.target), w) for w in withheld]
    )


class PolicyOutcome(NamedTuple):
    state: policy.PolicyState | None
    fleet: guard.GuardState
    actions: list[Action]
    alerts: list[Alert]
    withheld: list[WithheldRecord]  # why proposals were held back or dropped


def on_policy(
    state: policy.PolicyState | None,
    fleet: guard.GuardState | None,
    signal: PolicySignal,
    settings: Settings,
    pool: str,
) -> PolicyOutcome:
    """One policy-stage input: the guard learns from it (membership, open checks, releases),
    then the pool decides, gated by the guard (caps, common causes); the guard then learns
    what the pool has out. Inventory records and releases concern the guard only."""
    alerts: list[Alert] = []
    if isinstance(signal, CapacityEvent):
        fleet = fleet or guard.GuardState()
    else:
        fleet, alerts = guard.observe(fleet, signal, settings)
    if isinstance(signal, Inventory | PolicyRelease):
        return PolicyOutcome(state, fleet, [], alerts, [])
    gate = guard.view(fleet, settings, pool)
    state, actions, pool_alerts, withheld = policy.decide_all(
        state, signal, settings.policy, gate
    )
    out = policy.out_for_faults(state, settings.policy)
    fleet = guard.settle(fleet, gate, pool, out, policy.maintenance_out(state))
    notices = {
        key: guard.Mark(pool=pool, zone=zone, ts=ts)
        for key, (zone, ts) in policy.maintenance_notices(state).items()
    }
    if guard.note_maintenance(fleet, pool, notices):
        alerts += guard.sync(fleet, settings)
    return PolicyOutcome(state, fleet, actions, alerts + pool_alerts, withheld)


STAGE = Stage(
    name="policy",
    inputs=(POLICY_INPUT, "events.policy"),
    aligned=(),
    table=POLICY_TABLE,
    key=key,
    on_item=on_item,
    outputs=("actions", "alerts", WITHHELD, DEAD_LETTERS),
)
