"""Acting on a proposal that passed the gates: the action (real or dry run), the pool's
bookkeeping (open actions, dedupe, throttles) and the per-target cordon alert.
"""

from __future__ import annotations

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.pool_state import Acted, OpenAction, Out, PolicyState
from pipeline.ids import stable_id
from pipeline.model import REPAIR_KINDS, Action, Proposal, target_key

_MS = 1000
DISRUPTIVE: frozenset[str] = frozenset({"cordon", "drain"}) | REPAIR_KINDS  # per-check dry run
RATE_LIMITED: frozenset[str] = frozenset({"cordon"}) | REPAIR_KINDS


def is_dry(proposal: Proposal, settings: PolicySettings) -> bool:
    if settings.dry_run:
        return True
    checks = proposal.reason.checks
    return (
        proposal.kind in DISRUPTIVE
        and bool(checks)
        and all(check in settings.dry_run_checks for check in checks)
    )


def act(
    st: PolicyState,
    proposal: Proposal,
    settings: PolicySettings,
    out: Out,
    *,
    maintenance: bool,
    dry: bool | None = None,
    at: int | None = None,
) -> None:
    """Publish the action for `proposal`, dated `at` (default: the pool's clock); the pool's
    own bookkeeping (open actions, dedupe, throttles) runs on its clock."""
    dry = is_dry(proposal, settings) if dry is None else dry
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
    out: Out,
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
