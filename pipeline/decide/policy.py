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

Scheduled maintenance: cordon, then drain, maintenance_lead_s before the window; release after
MAINTENANCE_DONE or maintenance_release_s after the window (once the pool's clock is there).
A maintenance cordon passes a guard of its own (`_maintenance_gate`): at most
maintenance_max_unavailable_pct of the pool out for maintenance at once (never below
maintenance_floor), and above the pool the guard's membership, zone and fleet maintenance
allowances and the maintenance-storm rule (pipeline/decide/guard.py); one withheld waits, its reason
kept on the plan, and is asked again at every signal. Maintenance does not count against the
failure budget, but does count as out of service in what the alerts report.
A target already out of service is left alone, and not released afterwards.

Alerts: one per pool and cause (budget, capacity, throttle) fires while proposals are withheld
for it, is re-sent when their number doubles or halves or after ALERT_REFRESH_MS, and resolves
when none is left; one per cordoned target fires with the cordon and resolves with its release
(ours or a person's). Pure: no I/O, no clock; the state passed in is left untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.guard import FLEET, GuardView, cause_check, maintenance_allowance, silence_only
from pipeline.ids import stable_id
from pipeline.model import (
    MAINTENANCE_CHECK,
    REPAIR_KINDS,
    Action,
    ActionKind,
    Alert,
    CapacityEvent,
    HealthStateName,
    NodeState,
    Proposal,
    Reason,
    Target,
    WithheldRecord,
    target_key,
)

_MS = 1000
_HOUR_MS = 3_600_000
DISRUPTIVE: frozenset[str] = frozenset({"cordon", "drain"}) | REPAIR_KINDS  # per-check dry run
RATE_LIMITED: frozenset[str] = frozenset({"cordon"}) | REPAIR_KINDS
NEEDS_CAPACITY: frozenset[str] = frozenset({"cordon", "replace", "repair", "repair_slice"})
NEEDS_OUR_CORDON: frozenset[str] = frozenset({"drain", "uncordon"}) | REPAIR_KINDS
OUT_OF_SERVICE: frozenset[str] = frozenset({"cordoned", "draining", "repairing"})
# why a proposal is withheld -> the pool alert that reports it (None: transient, no alert)
WITHHELD_ALERT: dict[str, alerts.PoolAlert | None] = {
    "budget": "budget",
    "fatal_ceiling": "budget",
    "capacity": "capacity",
    "slow_start": "throttle",
    "rate_limit": "throttle",
    "busy": None,
    "awaiting_cordon": None,
    "correlating": None,  # silence only: waiting silence_grace_s to see its peers
    # above the pool (pipeline/decide/guard.py): the caps report as a spent budget; a common cause
    # raises its own alert; membership holds are for the inventory's owner to fix
    "zone_cap": "budget",
    "fleet_cap": "budget",
    "common_cause": None,
    "not_in_inventory": None,
    "inventory_mismatch": None,
    # scheduled maintenance (the plan keeps the reason): its allowance spent reports as a
    # spent budget; a storm of notices raises its common-cause alert
    "maintenance_budget": "budget",
    "maintenance_zone_cap": "budget",
    "maintenance_fleet_cap": "budget",
    "maintenance_storm": None,
}
_ACT, _DROP = "act", "drop"
# A proposal acted on at once (or once the node state showed our cordon) is dated by it: when
# its action comes back late to the health machine (a backlog) that is where it goes, not at the
# pool's clock, which runs ahead. One held for the pool (budget, capacity, throttles, our open
# action that was never reported) goes when the pool's clock lets it.
_OWN_WAITS = frozenset({"", "awaiting_cordon"})
ALERT_REFRESH_MS = 300_000


class TargetView(msgspec.Struct, kw_only=True, frozen=True):
    """The latest NodeState of a pool member, as far as the policy needs it."""

    target: Target
    state: HealthStateName
    episode: str | None = None
    cordoned_by_us: bool = False
    human_hold: bool = False
    last_action: str | None = None
    ts: int = 0

    @property
    def unavailable(self) -> bool:
        return self.cordoned_by_us or self.human_hold or self.state in OUT_OF_SERVICE


class OpenAction(msgspec.Struct, kw_only=True, frozen=True):
    """A real action the health machine has not reported back yet (at most one per target)."""

    action_id: str
    proposal_id: str
    kind: str
    ts: int
    expires_at: int
    maintenance: bool = False


class Withheld(msgspec.Struct, kw_only=True, frozen=True):
    proposal: Proposal
    first_ts: int
    last_ts: int
    reason: str = ""
    # held by a common cause at some point: when the cause ends it goes only if the node's own
    # evidence persists (its checks still open in a node state), fatal or not
    common: bool = False


class Acted(msgspec.Struct, kw_only=True, frozen=True):
    ts: int
    dry_run: bool


class Maintenance(msgspec.Struct, kw_only=True, frozen=True):
    event_id: str
    target: Target
    start: int
    end: int
    release_at: int
    cordoned: bool = False
    drained: bool = False
    dry_run: bool = False
    done: bool = False
    announced: int = 0  # the notice's time (the maintenance-storm rule counts notices by it)
    withheld: str = ""  # why its cordon is waiting (a WITHHELD_ALERT reason), "" when not


class PolicyState(msgspec.Struct, kw_only=True):
    pool: str
    cluster: str = ""
    clock: int = 0
    targets: dict[str, TargetView] = {}
    open: dict[str, OpenAction] = {}
    acted: dict[str, Acted] = {}  # proposal id -> what we did, for dedupe
    withheld: dict[str, Withheld] = {}  # by target: the latest proposal only
    shadow: dict[str, str] = {}  # dry-run cordons: target -> episode
    cordons: list[int] = []  # when cordons went out (slow start)
    disruptive: list[int] = []  # when cordons and repairs went out (rate limit)
    slow_start_until: int = 0
    quota_until: int = 0  # the latest of quota_holds
    quota_holds: dict[str, int] = {}  # by quota metric: a zone has several quotas at once
    stockout_until: int = 0
    capacity_note: str = ""
    maintenance: dict[str, Maintenance] = {}  # by target
    alerts: dict[str, Alert] = {}  # firing: "budget" / "capacity" / "throttle" / "cordon:<target>"
    # by target: our cordon (its alert firing) that no node state has reported yet; kept past
    # the open action's expiry, as node states published before the health machine saw it
    # may still come (a backlog brings our actions back late)
    unreported: dict[str, str] = {}


@dataclass
class _Out:
    actions: list[Action] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    withheld: list[WithheldRecord] = field(default_factory=list)


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
    out = _Out()
    if isinstance(signal, Proposal):
        _on_proposal(st, signal, settings, out)
    elif isinstance(signal, NodeState):
        _on_node_state(st, signal, out)
    else:
        _on_capacity(st, signal, settings)
    _expire(st, settings, out)
    _run_maintenance(st, settings, out, guard)
    _release_withheld(st, settings, out, guard)
    _sync_pool_alerts(st, settings, out, guard)
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
    # changed in place and returned: the driver keeps the snapshot (stages/topology.py)
    state.pool = state.pool or pool
    return state


# --- signals ------------------------------------------------------------------------------


def _learn(st: PolicyState, target: Target, state: HealthStateName) -> TargetView:
    """A pool member, first seen in a proposal or a node state (ts 0: any NodeState is news)."""
    key = target_key(target)
    st.cluster = st.cluster or target.cluster
    view = st.targets.get(key)
    if view is None:
        view = st.targets[key] = TargetView(target=target, state=state)
    return view


def _on_proposal(
    st: PolicyState, proposal: Proposal, settings: PolicySettings, out: _Out
) -> None:
    _learn(st, proposal.target, proposal.state)
    prior = st.acted.get(proposal.proposal_id)
    if prior is not None and (not prior.dry_run or _is_dry(proposal, settings)):
        return  # the same proposal again: one action (or one dry run while dry run is on)
    key = target_key(proposal.target)
    held = st.withheld.get(key)
    if held is not None and held.proposal.proposal_id == proposal.proposal_id:
        st.withheld[key] = msgspec.structs.replace(held, last_ts=st.clock)
    else:
        if held is not None and held.reason:  # a newer proposal takes the held one's place
            _note_dropped(st, held.proposal, "superseded", out)
        st.withheld[key] = Withheld(proposal=proposal, first_ts=st.clock, last_ts=st.clock)


def _on_node_state(st: PolicyState, ns: NodeState, out: _Out) -> None:
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
            _note_dropped(st, gone.proposal, "reported", out)
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
        why = (
            "human_hold" if ns.human_hold
            else "episode_over" if ns.episode != held.proposal.episode
            else "cleared"
        )
        _note_dropped(st, held.proposal, why, out)
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
    note = f"{event.kind} in {event.zone}" + (f": {event.message}" if event.message else "")
    if event.kind == "QUOTA_EXCEEDED":
        metric = event.quota.metric if event.quota is not None else ""
        st.quota_holds[metric] = max(st.quota_holds.get(metric, 0), hold)
        st.capacity_note = note
    elif event.kind == "STOCKOUT":
        st.stockout_until, st.capacity_note = max(st.stockout_until, hold), note
    elif event.kind in ("QUOTA_USAGE", "QUOTA_CHANGED") and event.quota is not None:
        quota = event.quota
        near = quota.limit <= 0 or quota.usage / quota.limit >= settings.quota_near_frac
        # a reading clears only its own quota's hold: another quota may still be exhausted
        if near:
            st.quota_holds[quota.metric] = hold
            st.capacity_note = f"{note}: {quota.metric} {quota.usage:g} of {quota.limit:g}"
        else:
            st.quota_holds.pop(quota.metric, None)
    st.quota_until = max(st.quota_holds.values(), default=0)
    if event.kind.startswith("MAINTENANCE_"):
        _on_maintenance(st, event, settings)


def _applies(st: PolicyState, event: CapacityEvent) -> bool:
    if event.pool is not None:
        return event.pool == st.pool
    if event.cluster is not None and st.cluster and event.cluster != st.cluster:
        return False
    zones = {view.target.zone for view in st.targets.values()}
    return not zones or event.zone in zones


def _on_maintenance(st: PolicyState, event: CapacityEvent, settings: PolicySettings) -> None:
    target = _maintenance_target(st, event)
    if target is None:
        return  # zone-wide notices name no target to move out of the way
    key = target_key(target)
    plan = st.maintenance.get(key)
    if event.kind == "MAINTENANCE_DONE":
        if plan is not None:
            st.maintenance[key] = _plan(plan, release_at=min(plan.release_at, event.ts))
        return
    if plan is not None and (plan.event_id == event.event_id or not plan.done):
        if event.kind == "MAINTENANCE_STARTED":  # late notice: move it out now
            st.maintenance[key] = _plan(plan, start=min(plan.start, event.ts))
        return
    window = event.window
    start = window.start if window is not None else event.ts
    end = window.end if window is not None else event.ts
    if event.kind == "MAINTENANCE_STARTED":
        start = min(start, event.ts)
    st.maintenance[key] = Maintenance(
        event_id=event.event_id,
        target=target,
        start=start,
        end=end,
        release_at=end + settings.maintenance_release_s * _MS,
        announced=event.ts,
    )


def _maintenance_target(st: PolicyState, event: CapacityEvent) -> Target | None:
    if event.target is None:
        return None
    for view in st.targets.values():
        if view.target.name == event.target and (
            event.target_kind is None or view.target.kind == event.target_kind
        ):
            return view.target
    if event.cluster is None or event.target_kind is None or not st.pool:
        return None
    return Target(
        cluster=event.cluster,
        kind=event.target_kind,
        name=event.target,
        pool=st.pool,
        zone=event.zone,
    )


# --- housekeeping -------------------------------------------------------------------------


def _expire(st: PolicyState, settings: PolicySettings, out: _Out) -> None:
    now = st.clock
    st.open = {k: o for k, o in st.open.items() if now < o.expires_at}
    keep = settings.dedupe_window_s * _MS
    st.acted = {k: a for k, a in st.acted.items() if now - a.ts <= keep}
    ttl = settings.pending_ttl_s * _MS
    for held in st.withheld.values():
        if now - held.last_ts > ttl and held.reason:
            _note_dropped(st, held.proposal, "expired", out)
    st.withheld = {k: w for k, w in st.withheld.items() if now - w.last_ts <= ttl}
    window = max(settings.burst_window_s * _MS, _HOUR_MS)
    st.cordons = [t for t in st.cordons if now - t < window]
    st.disruptive = [t for t in st.disruptive if now - t < _HOUR_MS]
    st.maintenance = {
        k: m for k, m in st.maintenance.items() if not m.done or now - m.release_at <= keep
    }


# --- maintenance --------------------------------------------------------------------------


def _run_maintenance(
    st: PolicyState, settings: PolicySettings, out: _Out, guard: GuardView | None
) -> None:
    for key in sorted(st.maintenance):
        plan = st.maintenance[key]
        if plan.done:
            continue
        view = st.targets.get(key)
        if st.clock >= plan.release_at:
            _end_maintenance(st, plan, view, settings, out)
        elif st.clock >= plan.start - settings.maintenance_lead_s * _MS:
            _begin_maintenance(st, plan, view, settings, out, guard)


def _begin_maintenance(
    st: PolicyState,
    plan: Maintenance,
    view: TargetView | None,
    settings: PolicySettings,
    out: _Out,
    guard: GuardView | None,
) -> None:
    key = target_key(plan.target)
    if key in st.open:
        return  # one action at a time per target
    if not plan.cordoned:
        if view is not None and view.unavailable:
            st.maintenance[key] = _plan(plan, done=True)  # out already (a fault, a person)
            if plan.withheld:
                _note_dropped(st, _maintenance_proposal(st, plan, "cordon"), "out_of_service", out)
            return
        cordon = _maintenance_proposal(st, plan, "cordon")
        verdict = _maintenance_gate(st, plan, cordon, settings, guard)
        if verdict:
            if verdict != plan.withheld:  # once per reason, not at every signal
                _note(st, cordon, verdict, out, settings, guard)
            st.maintenance[key] = _plan(plan, withheld=verdict)
            return
        _act(st, cordon, settings, out, maintenance=True)
        dry = st.acted[_maintenance_id(plan, "cordon")].dry_run
        st.maintenance[key] = _plan(plan, cordoned=True, dry_run=dry, withheld="")
    elif not plan.drained and (plan.dry_run or (view is not None and view.cordoned_by_us)):
        _act(st, _maintenance_proposal(st, plan, "drain"), settings, out, maintenance=True)
        st.maintenance[key] = _plan(plan, drained=True)


def _end_maintenance(
    st: PolicyState,
    plan: Maintenance,
    view: TargetView | None,
    settings: PolicySettings,
    out: _Out,
) -> None:
    key = target_key(plan.target)
    if plan.cordoned and key in st.open:
        return
    release = _maintenance_proposal(st, plan, "uncordon")
    if not plan.cordoned and plan.withheld:  # held until its window was over
        _note_dropped(st, _maintenance_proposal(st, plan, "cordon"), "window_over", out)
    if plan.cordoned and plan.dry_run:  # a dry-run cordon gets a dry-run release
        _act(st, release, settings, out, maintenance=True, dry=True)
    elif plan.cordoned and view is not None and view.cordoned_by_us and not view.human_hold:
        _act(st, release, settings, out, maintenance=True)
    st.maintenance[key] = _plan(plan, done=True)


def _maintenance_gate(
    st: PolicyState,
    plan: Maintenance,
    cordon: Proposal,
    settings: PolicySettings,
    guard: GuardView | None,
) -> str:
    """'' when the maintenance cordon may go now; else why it waits. Maintenance has its own
    allowance in the pool (beside the failure budget), then the guard's (membership, zone and
    fleet allowances, a storm of notices)."""
    allowance = maintenance_allowance(_pool_size(st, guard), settings)
    if len(maintenance_out(st).keys() | {target_key(plan.target)}) > allowance:
        return "maintenance_budget"
    if guard is None:
        return ""
    return guard.admit_maintenance(cordon, window_started=st.clock >= plan.start)


def maintenance_out(st: PolicyState) -> dict[str, str]:
    """The pool's targets out for scheduled maintenance (cordoned for it, not yet released):
    target key -> zone, for the guard's zone and fleet allowances."""
    return {
        key: plan.target.zone
        for key, plan in st.maintenance.items()
        if plan.cordoned and not plan.done
    }


def maintenance_notices(st: PolicyState) -> dict[str, tuple[str, int]]:
    """The pool's maintenance notices still pending: target key -> (zone, notice time)."""
    return {
        key: (plan.target.zone, plan.announced)
        for key, plan in st.maintenance.items()
        if not plan.done
    }


def _plan(plan: Maintenance, **changes: Any) -> Maintenance:
    return msgspec.structs.replace(plan, **changes)


def _maintenance_id(plan: Maintenance, kind: str) -> str:
    return stable_id("prp", "maintenance", plan.event_id, kind)


def _maintenance_proposal(st: PolicyState, plan: Maintenance, kind: ActionKind) -> Proposal:
    view = st.targets.get(target_key(plan.target))
    window = f"{alerts.rfc3339(plan.start)} .. {alerts.rfc3339(plan.end)}"
    return Proposal(
        proposal_id=_maintenance_id(plan, kind),
        ts=st.clock,
        kind=kind,
        target=plan.target,
        reason=Reason(
            checks=[MAINTENANCE_CHECK],
            finding_ids=[],
            summary=f"{kind} {plan.target.kind} {plan.target.name}: scheduled maintenance "
            f"{window} ({plan.event_id})",
        ),
        fatal=False,
        episode=stable_id("ep", "maintenance", plan.event_id),
        state=view.state if view is not None else "healthy",
    )


# --- gates --------------------------------------------------------------------------------


def _priority(held: Withheld) -> tuple[int, int, str]:
    proposal = held.proposal
    rank = 0 if proposal.kind == "uncordon" else 1 if proposal.fatal else 2
    return rank, held.first_ts, proposal.proposal_id


def _release_withheld(
    st: PolicyState, settings: PolicySettings, out: _Out, guard: GuardView | None
) -> None:
    # The budget is counted once per pass and again only after an action went out.
    counted: list[Budget] = []

    def now() -> Budget:
        if not counted:
            counted.append(budget(st, settings, guard))
        return counted[0]

    for held in sorted(st.withheld.values(), key=_priority):
        proposal = held.proposal
        verdict = _gate(st, proposal, settings, now)
        if verdict == _ACT and _correlating(st, held, settings):
            verdict = "correlating"
        if verdict == _ACT and proposal.kind == "cordon" and guard is not None:
            key = target_key(proposal.target)
            verdict = guard.admit(proposal, key in now().really_out) or _ACT
        if verdict in (_ACT, _DROP):
            del st.withheld[target_key(proposal.target)]
            if verdict == _ACT:
                at = proposal.ts if held.reason in _OWN_WAITS else st.clock
                _act(st, proposal, settings, out, maintenance=False, at=at)
                counted.clear()
            else:
                _note_dropped(st, proposal, _why_dropped(st, proposal), out)
        elif verdict != held.reason:
            common = held.common or verdict == "common_cause"
            st.withheld[target_key(proposal.target)] = msgspec.structs.replace(
                held, reason=verdict, common=common
            )
            _note(st, proposal, verdict, out, settings, guard, now())


def _gate(
    st: PolicyState, proposal: Proposal, settings: PolicySettings, now: Callable[[], Budget]
) -> str:
    key = target_key(proposal.target)
    view = st.targets.get(key)
    if view is not None and (view.human_hold or _stale(proposal, view)):
        return _DROP
    plan = st.maintenance.get(key)
    if plan is not None and plan.cordoned and not plan.done:
        return _DROP  # out for maintenance: the health machine asks again after the release
    if key in st.open:
        return "busy"
    kind = proposal.kind
    if kind in NEEDS_OUR_CORDON and (view is None or not view.cordoned_by_us):
        return _DROP if kind == "uncordon" else "awaiting_cordon"
    if kind == "cordon":
        verdict = _budget_gate(now(), key, proposal.fatal)
        if verdict:
            return verdict
    if proposal.fatal or kind == "uncordon":
        return _ACT
    if kind in NEEDS_CAPACITY and _capacity_constrained(st):
        return "capacity"
    if kind == "cordon" and _slow_start_blocks(st, settings):
        return "slow_start"
    if kind in RATE_LIMITED and len(st.disruptive) >= settings.max_actions_per_hour:
        return "rate_limit"
    return _ACT


def _correlating(st: PolicyState, held: Withheld, settings: PolicySettings) -> bool:
    """A cordon citing silence only waits silence_grace_s from when it was first proposed:
    the peers of an outage go silent within it, and the guard then sees one cause."""
    proposal = held.proposal
    return (
        proposal.kind == "cordon"
        and silence_only(proposal.reason.checks)
        and st.clock - held.first_ts < settings.silence_grace_s * _MS
    )


def _stale(proposal: Proposal, view: TargetView) -> bool:
    # A node state the health machine published after the proposal, in another episode: the
    # proposal is a replay from the past (a redelivery, a restarted consumer), not a request.
    return view.ts > proposal.ts and view.episode != proposal.episode


@dataclass(frozen=True)
class Budget:
    size: int
    failure: frozenset[str]  # out for a fault or a person, or as a dry run: what is counted
    total: frozenset[str]  # ... plus scheduled maintenance
    really_out: frozenset[str]  # out of service for real (no dry-run cordons)
    limit: int
    ceiling: int  # how far fatal faults may go


def budget(st: PolicyState, settings: PolicySettings, guard: GuardView | None = None) -> Budget:
    """The pool's blast-radius budget right now (its size: `_pool_size`)."""
    maintenance = {k for k, m in st.maintenance.items() if m.cordoned and not m.done}
    really_out = {k for k, v in st.targets.items() if v.unavailable}
    really_out |= {k for k, o in st.open.items() if o.kind == "cordon"}
    total = really_out | set(st.shadow)
    failure = total - maintenance
    size = _pool_size(st, guard)
    limit = min(
        settings.max_unavailable,
        max(settings.budget_floor, math.floor(settings.max_unavailable_pct * size / 100)),
    )
    ceiling = max(limit, math.floor(settings.fatal_max_unavailable_pct * size / 100))
    return Budget(size, frozenset(failure), frozenset(total), frozenset(really_out), limit, ceiling)


def _pool_size(st: PolicyState, guard: GuardView | None) -> int:
    """The guard's size of the pool (its inventory, or the largest pool seen); alone, the
    targets this pool has seen."""
    return len(st.targets) if guard is None else guard.pool_size()


def _budget_gate(now: Budget, key: str, fatal: bool) -> str:
    if key in now.really_out:
        return ""  # out of service already: cordoning it takes nothing more away
    # A target counted only as a dry run becomes really out: the count stays, but it must fit.
    after = len(now.failure | {key})
    if after <= now.limit or (fatal and after <= now.ceiling):
        return ""
    return "fatal_ceiling" if fatal else "budget"


def _capacity_constrained(st: PolicyState) -> bool:
    return st.clock < st.quota_until or st.clock < st.stockout_until


def _slow_start_blocks(st: PolicyState, settings: PolicySettings) -> bool:
    if st.clock >= st.slow_start_until or not st.cordons:
        return False
    return st.clock - st.cordons[-1] < settings.slow_start_interval_s * _MS


# --- acting -------------------------------------------------------------------------------


def _is_dry(proposal: Proposal, settings: PolicySettings) -> bool:
    if settings.dry_run:
        return True
    checks = proposal.reason.checks
    return (
        proposal.kind in DISRUPTIVE
        and bool(checks)
        and all(check in settings.dry_run_checks for check in checks)
    )


def _act(
    st: PolicyState,
    proposal: Proposal,
    settings: PolicySettings,
    out: _Out,
    *,
    maintenance: bool,
    dry: bool | None = None,
    at: int | None = None,
) -> None:
    """Publish the action for `proposal`, dated `at` (default: the pool's clock); the pool's
    own bookkeeping (open actions, dedupe, throttles) runs on its clock."""
    dry = _is_dry(proposal, settings) if dry is None else dry
    key = target_key(proposal.target)
    action_id = stable_id("act", proposal.proposal_id, *(["dry-run"] if dry else []))
    ts = st.clock if at is None else min(at, st.clock)
    action = Action(
        action_id=action_id,
        ts=ts,
        kind=proposal.kind,
        target=proposal.target,
        reason=proposal.reason,
        dry_run=dry,
        proposal_id=proposal.proposal_id,
        expires_at=ts + settings.action_ttl_s * _MS,
        device=proposal.device,
    )
    out.actions.append(action)
    st.acted[proposal.proposal_id] = Acted(ts=st.clock, dry_run=dry)
    if dry:
        if proposal.kind == "cordon" and not maintenance:
            st.shadow[key] = proposal.episode
    else:
        st.open[key] = OpenAction(
            action_id=action_id,
            proposal_id=proposal.proposal_id,
            kind=proposal.kind,
            ts=st.clock,
            expires_at=st.clock + settings.report_ttl_s * _MS,
            maintenance=maintenance,
        )
        _target_alert(st, action, proposal.fatal, maintenance, out, settings)
    if not maintenance:
        _count(st, proposal.kind, settings)


def _count(st: PolicyState, kind: str, settings: PolicySettings) -> None:
    if kind in RATE_LIMITED:
        st.disruptive.append(st.clock)
    if kind != "cordon":
        return
    in_slow_start = st.clock < st.slow_start_until
    st.cordons.append(st.clock)
    burst = [t for t in st.cordons if st.clock - t < settings.burst_window_s * _MS]
    if in_slow_start or len(burst) >= settings.burst_cordons:
        st.slow_start_until = st.clock + settings.calm_s * _MS


def _target_alert(
    st: PolicyState,
    action: Action,
    fatal: bool,
    maintenance: bool,
    out: _Out,
    settings: PolicySettings,
) -> None:
    name = f"cordon:{target_key(action.target)}"
    if action.kind == "cordon" and name not in st.alerts:
        alert = alerts.cordon_alert(
            action.target,
            action.reason,
            st.clock,
            action_id=action.action_id,
            fatal=fatal,
            maintenance=maintenance,
            runbook_base=settings.runbook_base,
            generator_base=settings.generator_base,
        )
        st.alerts[name] = alert
        st.unreported[target_key(action.target)] = action.action_id
        out.alerts.append(alert)
    elif action.kind == "uncordon" and name in st.alerts:
        st.unreported.pop(target_key(action.target), None)
        out.alerts.append(alerts.resolve(st.alerts.pop(name), st.clock))


# --- withheld records ---------------------------------------------------------------------

# why a proposal was given up, in words (the reason is "dropped: <why>")
_DROPPED: dict[str, str] = {
    "human_hold": "a person holds the target: FleetPulse never fights a person",
    "replayed": "a newer node state is in another episode: the proposal is a replay",
    "maintenance": "the target is out for scheduled maintenance",
    "not_our_cordon": "an uncordon of a cordon that is not ours",
    "episode_over": "the target's trouble episode is over",
    "cleared": "none of its checks is still open on the target",
    "expired": "held longer than pending_ttl_s without being proposed again",
    "superseded": "a newer proposal for the target took its place",
    "reported": "our earlier action came back: the health machine proposes again",
    "window_over": "its maintenance window is over",
    "out_of_service": "the target went out of service before its maintenance",
}


def _record(st: PolicyState, proposal: Proposal, reason: str, detail: str) -> WithheldRecord:
    return WithheldRecord(
        ts=st.clock,
        withheld_id=stable_id("whd", proposal.proposal_id, reason),
        proposal_id=proposal.proposal_id,
        kind=proposal.kind,
        target=proposal.target,
        reason=reason,
        detail=detail,
        checks=list(proposal.reason.checks),
        fatal=proposal.fatal,
    )


def _note(
    st: PolicyState,
    proposal: Proposal,
    reason: str,
    out: _Out,
    settings: PolicySettings,
    guard: GuardView | None,
    now: Budget | None = None,
) -> None:
    """A proposal held back for `reason` (called when the reason is new for it)."""
    detail = _detail(st, proposal, reason, settings, guard, now)
    out.withheld.append(_record(st, proposal, reason, detail))


def _note_dropped(st: PolicyState, proposal: Proposal, why: str, out: _Out) -> None:
    out.withheld.append(_record(st, proposal, f"dropped: {why}", _DROPPED.get(why, why)))


def _why_dropped(st: PolicyState, proposal: Proposal) -> str:
    """Which of `_gate`'s drop rules gave the proposal up."""
    key = target_key(proposal.target)
    view = st.targets.get(key)
    if view is not None and view.human_hold:
        return "human_hold"
    if view is not None and _stale(proposal, view):
        return "replayed"
    plan = st.maintenance.get(key)
    if plan is not None and plan.cordoned and not plan.done:
        return "maintenance"
    return "not_our_cordon"


def _detail(
    st: PolicyState,
    proposal: Proposal,
    reason: str,
    settings: PolicySettings,
    guard: GuardView | None,
    now: Budget | None,
) -> str:
    """The rule's numbers in words, for a person asking why the target is still in service."""
    target = proposal.target
    kinds = f"{target.kind}s"
    counts = now or budget(st, settings, guard)
    out = len(counts.failure)
    if reason == "budget":
        return (f"pool {st.pool}: {out} of {counts.limit} out "
                f"(budget {counts.limit} of {counts.size} {kinds})")
    if reason == "fatal_ceiling":
        return (f"pool {st.pool}: {out} out; fatal faults may take it to {counts.ceiling} "
                f"of {counts.size} {kinds}")
    if reason == "capacity":
        return f"zone {target.zone}: {st.capacity_note or 'capacity constrained'}"
    if reason == "slow_start":
        return (f"pool {st.pool}: slow start, one cordon per {settings.slow_start_interval_s} s "
                f"until {alerts.rfc3339(st.slow_start_until)}")
    if reason == "rate_limit":
        return (f"pool {st.pool}: {len(st.disruptive)} of {settings.max_actions_per_hour} "
                "cordons and repairs in the last hour")
    if reason == "busy":
        open_action = st.open.get(target_key(target))
        what = f"{open_action.kind} {open_action.action_id}" if open_action else "action"
        return f"our {what} on {target.name} is not reported back yet"
    if reason == "awaiting_cordon":
        return f"{proposal.kind} waits for our cordon of {target.name}"
    if reason == "correlating":
        return "silence only: waiting out the grace in which an outage's peers fall silent too"
    if reason.startswith("maintenance_"):
        return _maintenance_detail(st, target, reason, settings, counts)
    return _guard_detail(target, reason, proposal, guard)


def _maintenance_detail(
    st: PolicyState, target: Target, reason: str, settings: PolicySettings, counts: Budget
) -> str:
    pct = f"{settings.maintenance_max_unavailable_pct:g}%"
    if reason == "maintenance_budget":
        allowance = max(
            settings.maintenance_floor,
            math.floor(settings.maintenance_max_unavailable_pct * counts.size / 100),
        )
        return (f"pool {st.pool}: {len(maintenance_out(st))} of {allowance} out for "
                f"maintenance ({pct} of {counts.size} {target.kind}s)")
    if reason == "maintenance_storm":
        return ("a storm of maintenance notices: canaries only, until a person releases it "
                "or the window starts")
    scope = "zone " + target.zone if reason == "maintenance_zone_cap" else "the fleet"
    return f"{scope}: its maintenance allowance ({pct}) is spent"


def _guard_detail(
    target: Target, reason: str, proposal: Proposal, guard: GuardView | None
) -> str:
    """The guard's rules (decide/guard.py): membership, caps above the pool, common causes."""
    counted = guard.counted if guard is not None else {}
    if reason == "zone_cap":
        size = counted.get(("zone", target.zone), 0)
        return f"zone {target.zone}: its cap of targets out is reached ({size} in the zone)"
    if reason == "fleet_cap":
        size = counted.get(("fleet", FLEET), 0)
        return f"the fleet's cap of targets out is reached ({size} in the fleet)"
    if reason == "not_in_inventory":
        return f"{target.kind} {target.name} is not in the inventory, which is enforced"
    if reason == "inventory_mismatch":
        return (f"the inventory has {target.name} in another pool or zone than "
                f"{target.pool} / {target.zone}")
    if reason == "common_cause" and guard is not None:
        checks = {cause_check(check) for check in proposal.reason.checks}
        causes = sorted(
            f"{c.check} across {c.scope} {c.name}"
            for c in guard.state.causes.values()
            if not c.released and c.check in checks
        )
        return ("a common cause is open: " + (", ".join(causes) or "its checks") +
                "; its canaries are spent until it clears or a person releases it")
    return reason


# --- pool alerts --------------------------------------------------------------------------


def out_for_faults(st: PolicyState, settings: PolicySettings) -> dict[str, str]:
    """This pool's targets out of service for faults or by people (what the zone and fleet
    caps count), by target key, with their zone."""
    failure = budget(st, settings).failure
    zones = {key: view.target.zone for key, view in st.targets.items()}
    return {key: zones.get(key, "") for key in sorted(failure)}


def _sync_pool_alerts(
    st: PolicyState, settings: PolicySettings, out: _Out, guard: GuardView | None = None
) -> None:
    by_alert: dict[alerts.PoolAlert, list[Withheld]] = {name: [] for name in alerts.POOL_ALERTS}
    for key in sorted(st.withheld):
        name = WITHHELD_ALERT.get(st.withheld[key].reason)
        if name is not None:
            by_alert[name].append(st.withheld[key])
    for name, items in by_alert.items():
        current = st.alerts.get(name)
        if not items:
            if current is not None:
                out.alerts.append(alerts.resolve(st.alerts.pop(name), st.clock))
            continue
        digest = stable_id("withheld", *(w.proposal.proposal_id for w in items))
        if current is not None and not _update_due(current, digest, len(items), st.clock):
            continue
        annotations = _describe(st, name, items, settings, guard)
        annotations |= {"withheld_count": str(len(items)), "withheld_digest": digest}
        if current is None:
            alert = alerts.pool_alert(
                name,
                st.pool or "unknown",
                st.cluster,
                st.clock,
                annotations,
                runbook_base=settings.runbook_base,
                generator_base=settings.generator_base,
            )
        else:
            alert = alerts.update(current, annotations, st.clock)
        st.alerts[name] = alert
        out.alerts.append(alert)


def _update_due(current: Alert, digest: str, count: int, now: int) -> bool:
    # One alert, not a storm: a burst of withheld proposals re-sends it when their number
    # doubles or halves (log-many updates), otherwise at most every ALERT_REFRESH_MS.
    if current.annotations.get("withheld_digest") == digest:
        return False
    before = int(current.annotations.get("withheld_count", "0"))
    return count >= 2 * before or 2 * count <= before or now - current.ts >= ALERT_REFRESH_MS


def _describe(
    st: PolicyState,
    name: alerts.PoolAlert,
    items: list[Withheld],
    settings: PolicySettings,
    guard: GuardView | None,
) -> dict[str, str]:
    now = budget(st, settings, guard)
    listed = ", ".join(
        f"{w.proposal.kind} {w.proposal.target.name} ({', '.join(w.proposal.reason.checks)}"
        f"{', fatal' if w.proposal.fatal else ''})"
        for w in items
    )
    counts = (
        f"{len(now.failure)} of {now.size} targets out of service for faults or by people, "
        f"{len(now.total)} including scheduled maintenance"
    )
    if name == "budget":
        summary = f"pool {st.pool}: remediation budget spent, {len(items)} proposals withheld"
        why = (
            f"{counts}; budget {now.limit} = min(cap {settings.max_unavailable}, "
            f"max({settings.budget_floor}, {settings.max_unavailable_pct:g}% of {now.size})); "
            f"fatal faults may go to {now.ceiling}. FleetPulse stopped cordoning in this pool."
        )
    elif name == "capacity":
        summary = f"pool {st.pool}: {len(items)} remediations deferred for capacity"
        why = f"{st.capacity_note}; {counts}. Fatal faults still proceed."
    else:
        summary = f"pool {st.pool}: remediation throttled, {len(items)} proposals waiting"
        why = (
            f"slow start after {settings.burst_cordons} cordons in {settings.burst_window_s} s "
            f"(one per {settings.slow_start_interval_s} s) or the rate limit of "
            f"{settings.max_actions_per_hour} actions per hour; {counts}."
        )
    return {
        "summary": summary,
        "description": f"{why} Withheld: {listed}.",
    }
