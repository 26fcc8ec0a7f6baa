"""Scheduled maintenance in one pool: the plan per target from the notices, and the cordon,
drain and release around each window.

Cordon, then drain, maintenance_lead_s before the window; release after MAINTENANCE_DONE or
maintenance_release_s after the window (once the pool's clock is there). A maintenance cordon
passes a gate of its own (`maintenance_gate`): at most maintenance_max_unavailable_pct of the
pool out for maintenance at once (never below maintenance_floor), and above the pool the guard's
membership, zone and fleet maintenance allowances and the maintenance-storm rule
(pipeline/decide/guard.py); one withheld waits, its reason kept on the plan, and is asked again
at every signal. Maintenance does not count against the failure budget, but does count as out of
service in what the alerts report. A target already out of service is left alone, and not
released afterwards.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.acting import act
from pipeline.decide.budget import maintenance_out, pool_size
from pipeline.decide.caps import maintenance_allowance
from pipeline.decide.guard_view import GuardView
from pipeline.decide.pool_state import Maintenance, Out, PolicyState, TargetView
from pipeline.decide.verdicts import Hold
from pipeline.decide.withheld import note, note_dropped
from pipeline.ids import stable_id
from pipeline.model import (
    MAINTENANCE_CHECK,
    ActionKind,
    CapacityEvent,
    Proposal,
    Reason,
    Target,
    target_key,
)

_MS = 1000


def on_maintenance(st: PolicyState, event: CapacityEvent, settings: PolicySettings) -> None:
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


def run_maintenance(
    st: PolicyState, settings: PolicySettings, out: Out, guard: GuardView | None
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
    out: Out,
    guard: GuardView | None,
) -> None:
    key = target_key(plan.target)
    if key in st.open:
        return  # one action at a time per target
    if not plan.cordoned:
        if view is not None and view.unavailable:
            st.maintenance[key] = _plan(plan, done=True)  # out already (a fault, a person)
            if plan.withheld:
                note_dropped(st, maintenance_proposal(st, plan, "cordon"), "out_of_service", out)
            return
        cordon = maintenance_proposal(st, plan, "cordon")
        verdict = maintenance_gate(st, plan, cordon, settings, guard)
        if verdict is not None:
            if verdict != plan.withheld:  # once per reason, not at every signal
                note(st, cordon, verdict, out, settings, guard)
            st.maintenance[key] = _plan(plan, withheld=verdict)
            return
        act(st, cordon, settings, out, maintenance=True)
        dry = st.acted[_maintenance_id(plan, "cordon")].dry_run
        st.maintenance[key] = _plan(plan, cordoned=True, dry_run=dry, withheld="")
    elif not plan.drained and (plan.dry_run or (view is not None and view.cordoned_by_us)):
        act(st, maintenance_proposal(st, plan, "drain"), settings, out, maintenance=True)
        st.maintenance[key] = _plan(plan, drained=True)


def _end_maintenance(
    st: PolicyState,
    plan: Maintenance,
    view: TargetView | None,
    settings: PolicySettings,
    out: Out,
) -> None:
    key = target_key(plan.target)
    if plan.cordoned and key in st.open:
        return
    release = maintenance_proposal(st, plan, "uncordon")
    if not plan.cordoned and plan.withheld:  # held until its window was over
        note_dropped(st, maintenance_proposal(st, plan, "cordon"), "window_over", out)
    if plan.cordoned and plan.dry_run:  # a dry-run cordon gets a dry-run release
        act(st, release, settings, out, maintenance=True, dry=True)
    elif plan.cordoned and view is not None and view.cordoned_by_us and not view.human_hold:
        act(st, release, settings, out, maintenance=True)
    st.maintenance[key] = _plan(plan, done=True)


def maintenance_gate(
    st: PolicyState,
    plan: Maintenance,
    cordon: Proposal,
    settings: PolicySettings,
    guard: GuardView | None,
) -> Hold | None:
    """None when the maintenance cordon may go now; else why it waits. Maintenance has its own
    allowance in the pool (beside the failure budget), then the guard's (membership, zone and
    fleet allowances, a storm of notices)."""
    allowance = maintenance_allowance(pool_size(st, guard), settings)
    if len(maintenance_out(st).keys() | {target_key(plan.target)}) > allowance:
        return "maintenance_budget"
    if guard is None:
        return None
    return guard.admit_maintenance(cordon, window_started=st.clock >= plan.start)


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


def maintenance_proposal(st: PolicyState, plan: Maintenance, kind: ActionKind) -> Proposal:
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
