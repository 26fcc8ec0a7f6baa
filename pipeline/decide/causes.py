"""Common causes: one check open on a large share of a pool, a zone or the fleet at once is one
cause (an outage, a driver wave, a partition, an ingest bug), not many node faults. Judged
here, with its FleetPulseCommonCause alert; pipeline/decide/guard.py's docstring has the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from pipeline.config import Settings
from pipeline.decide import alerts
from pipeline.decide.guard_state import SCOPES, Cause, GuardState, Mark, scope_name, sizes
from pipeline.model import Alert

COMMON_CAUSE = "FleetPulseCommonCause"
_MS = 1000


def sync_causes(st: GuardState, settings: Settings) -> list[Alert]:
    policy = settings.policy
    counted = sizes(st, settings)
    window_ms = policy.common_cause_window_s * _MS
    seen_now: set[str] = set()
    out: list[Alert] = []
    for check in sorted(st.raised):
        groups = _group(st.raised[check].values())
        for (scope, name), marks in sorted(groups.items()):
            size = max(counted.get((scope, name), 0), len(marks))
            recent = sum(1 for mark in marks if st.clock - mark.ts <= window_ms)
            key = f"{check}|{scope}|{name}"
            cause = st.causes.get(key)
            share = policy.common_cause_share * size
            if cause is None and recent >= policy.common_cause_min_targets and recent > share:
                cause = Cause(check=check, scope=scope, name=name, since=st.clock)
            elif cause is not None:
                cause = _quieten(cause, len(marks), share, st.clock, settings)
            if cause is None:
                continue
            seen_now.add(key)
            cause, alert = _cause_alert(cause, len(marks), size, st.clock, settings)
            st.causes[key] = cause
            out += alert
    for key in sorted(set(st.causes) - seen_now):
        gone = st.causes.pop(key)
        if gone.alert is not None:
            out.append(alerts.resolve(gone.alert, st.clock))
    return out


def _quieten(
    cause: Cause, open_on: int, share: float, now: int, settings: Settings
) -> Cause | None:
    """The cause, or None once it has stayed under half its share (or the minimum) for a
    window: the hold lets every node's state catch up, so removals withheld through the
    outage are judged on how the nodes read after it, not released in one burst."""
    policy = settings.policy
    if open_on >= policy.common_cause_min_targets and open_on > share / 2:
        return msgspec.structs.replace(cause, quiet_since=None)
    if cause.quiet_since is None:
        return msgspec.structs.replace(cause, quiet_since=now)
    if now - cause.quiet_since >= policy.common_cause_window_s * _MS:
        return None
    return cause


def _group(marks: Iterable[Mark]) -> dict[tuple[str, str], list[Mark]]:
    groups: dict[tuple[str, str], list[Mark]] = {}
    for mark in marks:
        for scope in SCOPES:
            groups.setdefault((scope, scope_name(scope, mark)), []).append(mark)
    return groups


def _cause_alert(
    cause: Cause, count: int, size: int, now: int, settings: Settings
) -> tuple[Cause, list[Alert]]:
    labels = {
        "alertname": COMMON_CAUSE,
        "check": cause.check,
        "scope": cause.scope,
        "scope_name": cause.name,
        "severity": "critical",
        "source": alerts.SOURCE,
        # the labels routes match on, where the scope has them
        **({"pool": cause.name} if cause.scope == "pool" else {}),
        **({"zone": cause.name} if cause.scope == "zone" else {}),
    }
    summary = (
        f"{cause.check} on {count} of {size} targets in {cause.scope} {cause.name}: one "
        "common cause, not node faults"
    )
    held = "released by a person" if cause.released else "removals paused beyond canaries"
    annotations = {
        "summary": summary,
        "description": (
            f"{summary}. FleetPulse {held} for this check in this scope until fewer targets "
            f"keep it open, or `fleetpulse policy release --check {cause.check} --scope "
            f"{cause.scope}:{cause.name}`. Look for a monitoring outage, a driver or firmware "
            "wave, a network partition or an ingest bug."
        ),
        "targets": str(count),
    }
    if cause.alert is None:
        alert = alerts.firing(
            labels,
            annotations,
            now,
            runbook_base=settings.policy.runbook_base,
            generator_base=settings.policy.generator_base,
        )
    elif (cause.alert.annotations.get("targets") != str(count) and (
        count >= 2 * int(cause.alert.annotations.get("targets", "1"))
    )) or (cause.alert.annotations.get("description") != annotations["description"] and (
        cause.released
    )):
        alert = alerts.update(cause.alert, annotations, now)
    else:
        return cause, []
    return msgspec.structs.replace(cause, alert=alert), [alert]
