"""One signal applied to a target's health state: a finding, a node event, our own action.

What each means is in pipeline/decide/health.py's docstring; these change the state in place.
"""

from __future__ import annotations

from pipeline.decide.health_state import (
    LEVEL,
    RANK,
    Condition,
    HealthState,
    enter,
    is_actionable,
)
from pipeline.decide.rewind import assign
from pipeline.model import (
    HEARTBEAT,
    MAINTENANCE_CHECK,
    PRE_CORDON,
    REPAIR_KINDS,
    Action,
    Finding,
    NodeEvent,
)

_RECREATE = frozenset({"replace", "repair", "repair_slice"})  # the target is deleted, then created
_SEVERITY = {"info": 0, "warning": 1, "critical": 2}
MAX_CONDITIONS = 256  # beyond this, new devices of a check share one condition
_APPLIED_MAX = 16
_MESSAGE_MAX = 240  # kept per condition; the finding itself is in the lake


def on_finding(st: HealthState, finding: Finding) -> None:
    if finding.check == HEARTBEAT:
        return
    key = f"{finding.check}|{finding.entity.device or ''}"
    if finding.healthy:
        _close(st, finding, key)
        return
    cond = st.conditions.get(key)
    if cond is None and len(st.conditions) >= MAX_CONDITIONS:
        key = f"{finding.check}|*"
        cond = st.conditions.get(key)
    if cond is None:
        st.conditions[key] = Condition(
            check=finding.check,
            device=finding.entity.device,
            first_ts=finding.ts,
            last_ts=finding.ts,
            severity=finding.severity,
            fatal=finding.fatal,
            recommended=finding.recommended_action,
            finding_ids=[finding.finding_id],
            message=finding.message[:_MESSAGE_MAX],
        )
        return
    cond.first_ts = min(cond.first_ts, finding.ts)
    cond.last_ts = max(cond.last_ts, finding.ts)
    cond.fatal = cond.fatal or finding.fatal
    if _strength(finding.recommended_action) > _strength(cond.recommended):
        cond.recommended = finding.recommended_action
    if _SEVERITY[finding.severity] > _SEVERITY.get(cond.severity, 0):
        cond.severity = finding.severity
    if finding.finding_id != cond.finding_ids[0]:
        cond.finding_ids = [cond.finding_ids[0], finding.finding_id]
    cond.message = finding.message[:_MESSAGE_MAX] or cond.message


def _strength(recommended: str) -> tuple[int, int]:
    return LEVEL[recommended], RANK.get(recommended, 0)


def _close(st: HealthState, finding: Finding, key: str) -> None:
    # A device-less clear closes the check on every device; a clear older than the latest
    # unhealthy evidence is stale (out-of-order delivery) and closes nothing.
    if finding.entity.device is None:
        keys = [k for k, c in st.conditions.items() if c.check == finding.check]
    else:
        keys = [key] if key in st.conditions else []
    for k in keys:
        cond = st.conditions[k]
        if finding.ts < cond.last_ts:
            continue
        del st.conditions[k]
        if is_actionable(cond):
            st.flaps.append(finding.ts)


def on_node_event(st: HealthState, event: NodeEvent) -> None:
    if event.action_id is not None and event.kind in ("cordoned", "uncordoned"):
        return
    if event.kind == "cordoned":
        # Cordoning is idempotent in Kubernetes: a "cordoned" while we hold the cordon is a
        # watcher echoing ours, not a person, so it does not become a human hold.
        if not st.cordoned_by_us:
            _human_hold(st)
    elif event.kind == "uncordoned":
        if st.human_hold or st.cordoned_by_us:
            _human_release(st)
    elif event.kind == "held":
        # an actuator refused to act because a person holds the target (or a watcher saw the
        # hold appear): the same as a person's cordon, whoever reports it
        _human_hold(st)
    elif event.kind == "drained":
        if st.state == "draining":
            st.drained, st.drain_failed = True, False
    elif event.kind in _NOT_CARRIED_OUT and event.action_id is not None:
        _not_carried_out(st, event.action_id)
    elif event.kind == "repaired":
        _repaired(st, fresh_node=False)
    elif event.kind == "created":
        if st.state == "repairing":
            _repaired(st, fresh_node=True)
        else:
            _reset(st)
    elif event.kind == "deleted" and not _our_recreate(st, event):
        _reset(st)
    elif event.kind in ("ready", "not_ready"):
        st.not_ready = event.kind == "not_ready"


def _our_recreate(st: HealthState, event: NodeEvent) -> bool:
    # The first half of a replacement we ordered: the node is gone until "created", and out of
    # service meanwhile, even where a person's cordon came in between (forgetting it here let
    # the budget count the missing node as available).
    if st.state == "repairing" and st.repair_kind in _RECREATE:
        return True
    kind, _, action_id = (st.last_action or "").partition(":")
    return event.action_id is not None and action_id == event.action_id and kind in _RECREATE


_NOT_CARRIED_OUT = frozenset({"blocked", "skipped", "refused"})


def _not_carried_out(st: HealthState, action_id: str) -> None:
    """An actuator reports our current action was not carried out (an echo of an older one
    changes nothing: the state has moved on since)."""
    kind, _, current = (st.last_action or "").partition(":")
    if current != action_id or not st.cordoned_by_us:
        return
    if kind == "cordon":
        # the node was never cordoned: it is in service, and our claim on it ends here
        st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
        st.outstanding = None
        open_now = any(is_actionable(c) for c in st.conditions.values())
        enter(st, "degraded" if open_now else "healthy")
    elif kind == "drain" or kind in REPAIR_KINDS:
        st.drain_failed = True  # pods may still run: no repair on top (a person's turn)


def _human_hold(st: HealthState) -> None:
    st.human_hold = True
    st.outstanding = None
    if st.state in PRE_CORDON or (st.state == "probation" and not st.cordoned_by_us):
        enter(st, "cordoned")  # out of service: a person's cordon, shown as such


def _human_release(st: HealthState) -> None:
    # A person put the target back in service: our episode is over and what was open then is
    # waived (draino drained a node an admin had uncordoned; we must not).
    was_out = st.state not in PRE_CORDON
    st.human_hold = st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
    st.outstanding = None
    for cond in st.conditions.values():
        cond.waived = True
    st.unhealthy_since = None
    st.episode, st.round = None, 0
    enter(st, "probation" if was_out and st.conditions else "healthy")
    st.quiet_since = st.clock


def _repaired(st: HealthState, *, fresh_node: bool) -> None:
    if st.human_hold or (st.state in PRE_CORDON and not st.cordoned_by_us):
        return  # someone else's business, or nothing of ours to finish
    if fresh_node:  # a recreated node object comes up schedulable: our cordon went with it
        st.cordoned_by_us = st.drained = False
    st.outstanding = None
    st.repaired_at = st.clock
    enter(st, "probation")
    st.quiet_since = None


def _reset(st: HealthState) -> None:
    fresh = HealthState(target=st.target, since=st.clock, clock=st.clock, past=st.past)
    assign(st, fresh)


def on_action(st: HealthState, action: Action) -> None:
    # Our own action comes back through Kafka, later than the findings of the same moment when
    # a backlog is worked off (minutes to an hour of event time); what it starts is dated by
    # the action's own ts (when the policy acted), not by when it arrived, so drain timeouts,
    # repairs and probation run from the same `since` as in the live and embedded runs.
    at = min(action.ts, st.clock)
    if action.action_id in st.applied:
        return
    if action.dry_run:
        if st.outstanding is not None and st.outstanding.proposal_id == action.proposal_id:
            st.outstanding.dry_run = True
        return
    st.applied = [*st.applied, action.action_id][-_APPLIED_MAX:]
    st.last_action = f"{action.kind}:{action.action_id}"
    if st.outstanding is not None and st.outstanding.proposal_id == action.proposal_id:
        st.outstanding = None
    if action.kind == "cordon":
        st.cordoned_by_us = True
        st.maintenance = MAINTENANCE_CHECK in action.reason.checks
        if st.state in PRE_CORDON:
            st.drained = st.drain_failed = False
            enter(st, "cordoned", at)
    elif action.kind == "drain":
        st.drained = st.drain_failed = False
        enter(st, "draining", at)
    elif action.kind == "uncordon":
        st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
        if not st.human_hold:
            # Back in service: anything still open is judged afresh from then (a new episode,
            # persistence counted again), never folded into the episode just closed.
            open_now = any(is_actionable(c) for c in st.conditions.values())
            st.episode, st.round = None, 0
            st.unhealthy_since = at if open_now else None
            enter(st, "healthy", at)
    else:
        st.repairs = [*st.repairs, action.ts]
        st.repair_kind = action.kind
        if st.state == "probation" and st.repaired_at is not None and st.repaired_at >= at:
            return  # reported done before the action came back: it is over already
        enter(st, "repairing", at)
