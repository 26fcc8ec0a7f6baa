"""The pool's alerts: one per cause (budget, capacity, throttle) while proposals are held back
for it, re-sent when their number doubles or halves or after ALERT_REFRESH_MS, resolved when
none is left.
"""

from __future__ import annotations

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.budget import budget
from pipeline.decide.guard_view import GuardView
from pipeline.decide.pool_state import Out, PolicyState, Withheld
from pipeline.decide.verdicts import WITHHELD_ALERT
from pipeline.ids import stable_id
from pipeline.model import Alert

ALERT_REFRESH_MS = 300_000


def sync_pool_alerts(
    st: PolicyState, settings: PolicySettings, out: Out, guard: GuardView | None = None
) -> None:
    by_alert: dict[alerts.PoolAlert, list[Withheld]] = {name: [] for name in alerts.POOL_ALERTS}
    for key in sorted(st.withheld):
        reason = st.withheld[key].reason
        name = WITHHELD_ALERT[reason] if reason else None
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
