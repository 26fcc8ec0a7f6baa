"""withheld/1 records: why a proposal was held back or given up, with the rule's numbers in
words, for a person asking why a target is still in service.
"""

from __future__ import annotations

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.budget import Budget, budget, maintenance_out
from pipeline.decide.caps import maintenance_allowance
from pipeline.decide.guard_state import FLEET, cause_check
from pipeline.decide.guard_view import GuardView
from pipeline.decide.pool_state import Out, PolicyState, stale
from pipeline.decide.verdicts import Dropped, Hold
from pipeline.ids import stable_id
from pipeline.model import Proposal, Target, WithheldRecord, target_key

# why a proposal was given up, in words (the reason is "dropped: <why>")
_DROPPED: dict[Dropped, str] = {
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


def note(
    st: PolicyState,
    proposal: Proposal,
    reason: Hold,
    out: Out,
    settings: PolicySettings,
    guard: GuardView | None,
    now: Budget | None = None,
) -> None:
    """A proposal held back for `reason` (called when the reason is new for it)."""
    detail = _detail(st, proposal, reason, settings, guard, now)
    out.withheld.append(_record(st, proposal, reason, detail))


def note_dropped(st: PolicyState, proposal: Proposal, why: Dropped, out: Out) -> None:
    out.withheld.append(_record(st, proposal, f"dropped: {why}", _DROPPED[why]))


def why_dropped(st: PolicyState, proposal: Proposal) -> Dropped:
    """Which of `_gate`'s drop rules gave the proposal up."""
    key = target_key(proposal.target)
    view = st.targets.get(key)
    if view is not None and view.human_hold:
        return "human_hold"
    if view is not None and stale(proposal, view):
        return "replayed"
    plan = st.maintenance.get(key)
    if plan is not None and plan.cordoned and not plan.done:
        return "maintenance"
    return "not_our_cordon"


def _detail(
    st: PolicyState,
    proposal: Proposal,
    reason: Hold,
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
        allowance = maintenance_allowance(counts.size, settings)
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
