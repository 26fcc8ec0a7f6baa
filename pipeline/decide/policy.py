"""Remediation policy per pool: decide(state, signal) -> (state, actions, alerts).

Signals: Proposals from the health machine, NodeStates (pool membership and what is out of
service, ours or a person's), CapacityEvents (quota, stock-out, scheduled maintenance; they may
be broadcast to every pool, each keeps those for its zone). Every proposal is withheld first;
after each signal the withheld ones are released in order (uncordons, then fatal, then oldest)
through the gates below, so one held back for the budget goes out as soon as the budget frees,
and one whose episode ended meanwhile is dropped instead of replayed (NVSentinel's closing
breaker replayed days-old events). The same proposal id twice is one action.

Gates, in order:
- drop: a person holds the target (never fight a person); a node state newer than the
  proposal says another episode (a replay); the target is out for scheduled maintenance;
- wait: an action of ours on the target is still open (not yet reported back by the health
  machine, nor report_ttl_s old): at most one open action per target;
- drain and repairs need our cordon (NodeState.cordoned_by_us), else wait; an uncordon of
  anything we did not cordon, or that a person also holds, is dropped;
- blast radius (cordons only: drains and repairs act on a target already out): targets out of
  service in the pool, counting our open cordons, dry-run cordons and people's cordons, stay
  <= min(max_unavailable, max(budget_floor, floor(pct x size))). budget_floor (1) lets a small
  pool lose its one broken node. Fatal faults may go past the budget up to
  fatal_max_unavailable_pct of the pool: a dead accelerator is lost capacity already, so taking
  it out costs little, while past half a pool the cause is more likely systemic (a driver
  regression, a detector bug) than independent failures, and everything stops;
- capacity (non-fatal cordons, and repairs that recreate the target, while the zone is out of
  quota, near it, or stocked out): defer, with an alert;
- slow start (non-fatal cordons): after burst_cordons within burst_window_s, one per
  slow_start_interval_s until calm_s after the last one;
- rate (non-fatal cordons and repairs): max_actions_per_hour per pool;
- correlating (cordons citing silence only): silence_grace_s after first proposed, so the
  guard sees an outage's peers fall silent before it judges the first of them.
Releases (uncordon) pass every capacity gate: a breaker must never keep recovered nodes out.

Dry run (global, or per check when every check behind a disruptive proposal is a dry-run
check): the action is published with dry_run=True and the id stable_id("act", proposal_id,
"dry-run"), so a real action for the same proposal after dry run is switched off never collides
with it; a dry-run cordon counts against the budget for as long as its episode lasts, so dry
run shows what the real run would do, throttling included.

Time: the pool's clock is the newest proposal or node state (the health machine's event
time, republished at least every 5 minutes per reporting target); capacity events do not move
it, so a backlog in which they arrive far ahead of the health machine decides as live did.

Scheduled maintenance (maintenance.py): cordon, drain and release around each announced
window, through a gate and allowances of its own, not the failure budget.

Alerts: one per pool and cause (budget, capacity, throttle) fires while proposals are withheld
for it, is re-sent when their number doubles or halves or after ALERT_REFRESH_MS, and resolves
when none is left; one per cordoned target fires with the cordon and resolves with its release
(ours or a person's).

Pure: no I/O, no clock; `decide` changes the state it is given and returns it (the driver keeps
the snapshot to roll back to). The state is in pool_state.py; the budget in budget.py, acting
in acting.py, maintenance in maintenance.py, withheld/1 records in withheld.py, the pool alerts
in pool_alerts.py; the gates' verdicts are typed in verdicts.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.acting import RATE_LIMITED, act, is_dry
from pipeline.decide.budget import Budget, budget, budget_gate, maintenance_out, out_for_faults
from pipeline.decide.guard_state import silence_only
from pipeline.decide.guard_view import GuardView
from pipeline.decide.maintenance import maintenance_notices, on_maintenance, run_maintenance
from pipeline.decide.pool_alerts import sync_pool_alerts
from pipeline.decide.pool_state import Out, PolicyState, TargetView, Withheld, stale
from pipeline.decide.verdicts import ACT, DROP, WITHHELD_ALERT, Dropped, Verdict
from pipeline.decide.withheld import note, note_dropped, why_dropped
from pipeline.model import (
    REPAIR_KINDS,
    Action,
    Alert,
    CapacityEvent,
    HealthStateName,
    NodeState,
    Proposal,
    Target,
    WithheldRecord,
    target_key,
)

# what the stages, the backtest and the tests call (the rest of the policy is in its modules)
__all__ = [
    "WITHHELD_ALERT",
    "Budget",
    "Decision",
    "PolicyState",
    "budget",
    "decide",
    "decide_all",
    "maintenance_notices",
    "maintenance_out",
    "out_for_faults",
]

_MS = 1000
_HOUR_MS = 3_600_000
NEEDS_CAPACITY: frozenset[str] = frozenset({"cordon", "replace", "repair", "repair_slice"})
NEEDS_OUR_CORDON: frozenset[str] = frozenset({"drain", "uncordon"}) | REPAIR_KINDS
# A proposal acted on at once (or once the node state showed our cordon) is dated by it: when
# its action comes back late to the health machine (a backlog) that is where it goes, not at the
# pool's clock, which runs ahead. One held for the pool (budget, capacity, throttles, our open
# action that was never reported) goes when the pool's clock lets it.
_OWN_WAITS = frozenset({"", "awaiting_cordon"})


class Decision(NamedTuple):
    state: PolicyState
    actions: list[Action]
    alerts: list[Alert]
    withheld: list[WithheldRecord]  # why proposals were held back or dropped (withheld/1)


def decide(
    state: PolicyState | None,
    signal: Proposal | NodeState | CapacityEvent,
    settings: PolicySettings,
    guard: GuardView | None = None,
) -> tuple[PolicyState, list[Action], list[Alert]]:
    """Apply one signal to one pool's state; return the new state, actions and alerts.

    `guard` is the fleet beyond this pool (pipeline/decide/guard.py): inventory membership, zone and
    fleet caps, common causes. Without it the pool decides alone, as it did before."""
    st, actions, pool_alerts, _ = decide_all(state, signal, settings, guard)
    return st, actions, pool_alerts


def decide_all(
    state: PolicyState | None,
    signal: Proposal | NodeState | CapacityEvent,
    settings: PolicySettings,
    guard: GuardView | None = None,
) -> Decision:
    """`decide`, with the withheld/1 records of what it held back or dropped: one when a
    proposal is first held, one when the rule holding it changes, one when it is dropped."""
    st = _start(state, signal)
    if not isinstance(signal, CapacityEvent):
        # The pool's time is the health machine's (proposals and node states). Capacity events
        # take another path (the zone stage), which runs far ahead of it while a backlog is
        # worked off: had they moved the clock, open actions would expire and withheld
        # proposals age before the health machine could answer, and a backlog would decide
        # differently from live. A capacity event acts by its own ts (holds, maintenance
        # windows), judged at the pool's time.
        st.clock = max(st.clock, signal.ts)
    out = Out()
    if isinstance(signal, Proposal):
        _on_proposal(st, signal, settings, out)
    elif isinstance(signal, NodeState):
        _on_node_state(st, signal, out)
    else:
        _on_capacity(st, signal, settings)
    _expire(st, settings, out)
    run_maintenance(st, settings, out, guard)
    _release_withheld(st, settings, out, guard)
    sync_pool_alerts(st, settings, out, guard)
    return Decision(st, out.actions, out.alerts, out.withheld)


def _start(state: PolicyState | None, signal: Proposal | NodeState | CapacityEvent) -> PolicyState:
    if isinstance(signal, CapacityEvent):  # broadcast to pools; _applies sorts them out
        pool = "" if state is not None else signal.pool or ""
    else:
        pool = signal.target.pool
    if state is None:
        return PolicyState(pool=pool)
    if pool and state.pool and pool != state.pool:
        raise ValueError(f"signal for pool {pool!r} sent to the policy state of {state.pool!r}")
    # changed in place and returned: the driver keeps the snapshot (stages/base.py)
    state.pool = state.pool or pool
    return state


def _learn(st: PolicyState, target: Target, state: HealthStateName) -> TargetView:
    """A pool member, first seen in a proposal or a node state (ts 0: any NodeState is news)."""
    key = target_key(target)
    st.cluster = st.cluster or target.cluster
    view = st.targets.get(key)
    if view is None:
        view = st.targets[key] = TargetView(target=target, state=state)
    return view


def _on_proposal(
    st: PolicyState, proposal: Proposal, settings: PolicySettings, out: Out
) -> None:
    _learn(st, proposal.target, proposal.state)
    prior = st.acted.get(proposal.proposal_id)
    if prior is not None and (not prior.dry_run or is_dry(proposal, settings)):
        return  # the same proposal again: one action (or one dry run while dry run is on)
    key = target_key(proposal.target)
    held = st.withheld.get(key)
    if held is not None and held.proposal.proposal_id == proposal.proposal_id:
        st.withheld[key] = msgspec.structs.replace(held, last_ts=st.clock)
    else:
        if held is not None and held.reason:  # a newer proposal takes the held one's place
            note_dropped(st, held.proposal, "superseded", out)
        st.withheld[key] = Withheld(proposal=proposal, first_ts=st.clock, last_ts=st.clock)


def _on_node_state(st: PolicyState, ns: NodeState, out: Out) -> None:
    key = target_key(ns.target)
    view = _learn(st, ns.target, ns.state)
    if ns.ts < view.ts:
        return  # an older record overtaken by a newer one
    st.targets[key] = TargetView(
        target=ns.target,
        state=ns.state,
        episode=ns.episode,
        cordoned_by_us=ns.cordoned_by_us,
        human_hold=ns.human_hold,
        last_action=ns.last_action,
        ts=ns.ts,
    )
    pending = st.open.get(key)
    if pending is not None and ns.last_action == f"{pending.kind}:{pending.action_id}":
        del st.open[key]  # the health machine has seen it: no longer open
        # what it proposed before it saw our action assumed the action was not taken (it came
        # back late, a backlog): it proposes again, right after this state, what it still wants
        gone = st.withheld.pop(key, None)
        if gone is not None and gone.reason:
            note_dropped(st, gone.proposal, "reported", out)
    if key in st.shadow and st.shadow[key] != ns.episode:
        del st.shadow[key]
    held = st.withheld.get(key)
    stale = held is not None and (
        ns.human_hold
        or ns.episode != held.proposal.episode
        or _cleared(held.proposal, ns, held.common)
    )
    if held is not None and stale and ns.ts >= held.proposal.ts:
        # contested by a person, its episode is over, or what it was for has cleared (a
        # removal withheld through an outage must not run once the node reads well again)
        del st.withheld[key]
        why: Dropped = (
            "human_hold" if ns.human_hold
            else "episode_over" if ns.episode != held.proposal.episode
            else "cleared"
        )
        note_dropped(st, held.proposal, why, out)
    if ns.last_action is not None and ns.last_action == f"cordon:{st.unreported.get(key)}":
        del st.unreported[key]
    name = f"cordon:{key}"
    released = not ns.cordoned_by_us and key not in st.open and key not in st.unreported
    if name in st.alerts and released:
        out.alerts.append(alerts.resolve(st.alerts.pop(name), st.clock))


def _cleared(proposal: Proposal, ns: NodeState, common: bool = False) -> bool:
    """A cordon none of whose checks the node state still has open: a non-fatal one, or any
    that a common cause held (what the cause made, it drops: a fatal reading of an outage)."""
    return (
        proposal.kind == "cordon"
        and (common or not proposal.fatal)
        and not set(proposal.reason.checks) & set(ns.open_checks)
    )


def _on_capacity(st: PolicyState, event: CapacityEvent, settings: PolicySettings) -> None:
    if not _applies(st, event):
        return
    hold = event.ts + settings.capacity_hold_s * _MS
    said = f"{event.kind} in {event.zone}" + (f": {event.message}" if event.message else "")
    if event.kind == "QUOTA_EXCEEDED":
        metric = event.quota.metric if event.quota is not None else ""
        st.quota_holds[metric] = max(st.quota_holds.get(metric, 0), hold)
        st.capacity_note = said
    elif event.kind == "STOCKOUT":
        st.stockout_until, st.capacity_note = max(st.stockout_until, hold), said
    elif event.kind in ("QUOTA_USAGE", "QUOTA_CHANGED") and event.quota is not None:
        quota = event.quota
        near = quota.limit <= 0 or quota.usage / quota.limit >= settings.quota_near_frac
        # a reading clears only its own quota's hold: another quota may still be exhausted
        if near:
            st.quota_holds[quota.metric] = hold
            st.capacity_note = f"{said}: {quota.metric} {quota.usage:g} of {quota.limit:g}"
        else:
            st.quota_holds.pop(quota.metric, None)
    st.quota_until = max(st.quota_holds.values(), default=0)
    if event.kind.startswith("MAINTENANCE_"):
        on_maintenance(st, event, settings)


def _applies(st: PolicyState, event: CapacityEvent) -> bool:
    if event.pool is not None:
        return event.pool == st.pool
    if event.cluster is not None and st.cluster and event.cluster != st.cluster:
        return False
    zones = {view.target.zone for view in st.targets.values()}
    return not zones or event.zone in zones


def _expire(st: PolicyState, settings: PolicySettings, out: Out) -> None:
    now = st.clock
    st.open = {k: o for k, o in st.open.items() if now < o.expires_at}
    keep = settings.dedupe_window_s * _MS
    st.acted = {k: a for k, a in st.acted.items() if now - a.ts <= keep}
    ttl = settings.pending_ttl_s * _MS
    for held in st.withheld.values():
        if now - held.last_ts > ttl and held.reason:
            note_dropped(st, held.proposal, "expired", out)
    st.withheld = {k: w for k, w in st.withheld.items() if now - w.last_ts <= ttl}
    window = max(settings.burst_window_s * _MS, _HOUR_MS)
    st.cordons = [t for t in st.cordons if now - t < window]
    st.disruptive = [t for t in st.disruptive if now - t < _HOUR_MS]
    st.maintenance = {
        k: m for k, m in st.maintenance.items() if not m.done or now - m.release_at <= keep
    }


def _priority(held: Withheld) -> tuple[int, int, str]:
    proposal = held.proposal
    rank = 0 if proposal.kind == "uncordon" else 1 if proposal.fatal else 2
    return rank, held.first_ts, proposal.proposal_id


def _release_withheld(
    st: PolicyState, settings: PolicySettings, out: Out, guard: GuardView | None
) -> None:
    # The budget is counted once per pass and again only after an action went out.
    counted: list[Budget] = []

    def now() -> Budget:
        if not counted:
            counted.append(budget(st, settings, guard))
        return counted[0]

    for held in sorted(st.withheld.values(), key=_priority):
        proposal = held.proposal
        verdict: Verdict = _gate(st, proposal, settings, now)
        if verdict == ACT and _correlating(st, held, settings):
            verdict = "correlating"
        if verdict == ACT and proposal.kind == "cordon" and guard is not None:
            key = target_key(proposal.target)
            verdict = guard.admit(proposal, key in now().really_out) or ACT
        if verdict in (ACT, DROP):
            del st.withheld[target_key(proposal.target)]
            if verdict == ACT:
                at = proposal.ts if held.reason in _OWN_WAITS else st.clock
                act(st, proposal, settings, out, maintenance=False, at=at)
                counted.clear()
            else:
                note_dropped(st, proposal, why_dropped(st, proposal), out)
        elif verdict != held.reason:
            common = held.common or verdict == "common_cause"
            st.withheld[target_key(proposal.target)] = msgspec.structs.replace(
                held, reason=verdict, common=common
            )
            note(st, proposal, verdict, out, settings, guard, now())


def _gate(
    st: PolicyState, proposal: Proposal, settings: PolicySettings, now: Callable[[], Budget]
) -> Verdict:
    """ACT on the proposal now, DROP it (withheld.why_dropped says which rule), or hold it (why)."""
    key = target_key(proposal.target)
    view = st.targets.get(key)
    if view is not None and (view.human_hold or stale(proposal, view)):
        return DROP
    plan = st.maintenance.get(key)
    if plan is not None and plan.cordoned and not plan.done:
        return DROP  # out for maintenance: the health machine asks again after the release
    if key in st.open:
        return "busy"
    kind = proposal.kind
    if kind in NEEDS_OUR_CORDON and (view is None or not view.cordoned_by_us):
        return DROP if kind == "uncordon" else "awaiting_cordon"
    if kind == "cordon":
        held = budget_gate(now(), key, proposal.fatal)
        if held is not None:
            return held
    if proposal.fatal or kind == "uncordon":
        return ACT
    if kind in NEEDS_CAPACITY and _capacity_constrained(st):
        return "capacity"
    if kind == "cordon" and _slow_start_blocks(st, settings):
        return "slow_start"
    if kind in RATE_LIMITED and len(st.disruptive) >= settings.max_actions_per_hour:
        return "rate_limit"
    return ACT


def _correlating(st: PolicyState, held: Withheld, settings: PolicySettings) -> bool:
    """A cordon citing silence only waits silence_grace_s from when it was first proposed:
    the peers of an outage go silent within it, and the guard then sees one cause."""
    proposal = held.proposal
    return (
        proposal.kind == "cordon"
        and silence_only(proposal.reason.checks)
        and st.clock - held.first_ts < settings.silence_grace_s * _MS
    )


def _capacity_constrained(st: PolicyState) -> bool:
    return st.clock < st.quota_until or st.clock < st.stockout_until


def _slow_start_blocks(st: PolicyState, settings: PolicySettings) -> bool:
    if st.clock >= st.slow_start_until or not st.cordons:
        return False
    return st.clock - st.cordons[-1] < settings.slow_start_interval_s * _MS
