"""Common causes: one check open on a large share of a pool, a zone or the fleet at once is one
cause (an outage, a driver wave, a partition, an ingest bug), not many node faults. Judged
here, with its FleetPulseCommonCause alert; pipeline/decide/guard.py's docstring has the rule.

Silence is also judged by onset, whatever the targets' labels: `common_cause_min_targets`
targets whose silence showed within `ONSET_MS` of each other (the event time of the node state
that first said so) are one cause (the
nodes behind one Prometheus server or scrape job, a rack, a partition), even when they are few
in every pool and zone. Onset windows are fixed, 2 x ONSET_MS long, starting every ONSET_MS, so
two marks that close always share one and a mark's windows never move; a cause opens only on a
window no neighbour covers (one alert per outage).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import msgspec

from pipeline.config import Settings
from pipeline.decide import alerts
from pipeline.decide.guard_state import (
    ONSET,
    ONSET_MS,
    SCOPES,
    SILENCE,
    Cause,
    GuardState,
    Mark,
    scope_name,
    sizes,
)
from pipeline.model import Alert

COMMON_CAUSE = "FleetPulseCommonCause"
_MS = 1000


def sync_causes(st: GuardState, settings: Settings) -> list[Alert]:
    counted = sizes(st, settings)
    seen_now: set[str] = set()
    out: list[Alert] = []
    for check in sorted(st.raised):
        for (scope, name), marks in sorted(_group(st.raised[check].values()).items()):
            out += _judge(st, check, scope, name, marks, counted, settings, seen_now)
        if check == SILENCE:  # after the pools' and zones': what they explain is theirs
            onset = _onset_groups(st, st.raised[check], seen_now)
            for (scope, name), marks in sorted(onset.items()):
                out += _judge(st, check, scope, name, marks, counted, settings, seen_now)
    for key in sorted(set(st.causes) - seen_now):
        gone = st.causes.pop(key)
        if gone.alert is not None:
            out.append(alerts.resolve(gone.alert, st.clock))
    return out


def _judge(
    st: GuardState,
    check: str,
    scope: str,
    name: str,
    marks: list[Mark],
    counted: dict[tuple[str, str], int],
    settings: Settings,
    seen_now: set[str],
) -> list[Alert]:
    """Open, keep or quieten the cause of `check` in one scope; its alert when it changed."""
    policy = settings.policy
    size = max(counted.get((scope, name), 0), len(marks))
    recent = sum(1 for mark in marks if st.clock - mark.ts <= policy.common_cause_window_s * _MS)
    key = f"{check}|{scope}|{name}"
    cause = st.causes.get(key)
    share = policy.common_cause_share * size
    if cause is None and recent >= policy.common_cause_min_targets and recent > share:
        cause = Cause(check=check, scope=scope, name=name, since=st.clock)
    elif cause is not None:
        cause = _quieten(cause, len(marks), share, st.clock, settings)
    if cause is None:
        return []
    seen_now.add(key)
    cause, alert = _cause_alert(cause, len(marks), size, st.clock, settings)
    st.causes[key] = cause
    return alert


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


def onset_names(mark: Mark) -> tuple[str, str]:
    """The two onset windows a silent target's mark falls in (their start, ISO 8601 UTC)."""
    k = mark.ts // ONSET_MS
    return _onset_name(k - 1), _onset_name(k)


def _onset_name(k: int) -> str:
    return datetime.fromtimestamp(k * ONSET_MS / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _onset_groups(
    st: GuardState, marks: dict[str, Mark], open_now: set[str]
) -> dict[tuple[str, str], list[Mark]]:
    """The onset windows of the silent targets: those a cause is already open on, and those no
    neighbouring window covers (the earlier one wins a tie), of the targets no silence cause
    of their pool, zone or fleet (`open_now`) explains already (one outage, one alert)."""
    windows: dict[int, dict[str, Mark]] = {}
    for key, mark in marks.items():
        if f"{SILENCE}|{ONSET}|{_onset_name(mark.ts // ONSET_MS)}" not in st.causes and (
            f"{SILENCE}|{ONSET}|{_onset_name(mark.ts // ONSET_MS - 1)}" not in st.causes
        ) and any(f"{SILENCE}|{scope}|{scope_name(scope, mark)}" in open_now for scope in SCOPES):
            continue  # its pool's, zone's or the fleet's silence
        k = mark.ts // ONSET_MS
        windows.setdefault(k - 1, {})[key] = mark
        windows.setdefault(k, {})[key] = mark
    groups: dict[tuple[str, str], list[Mark]] = {}
    for k, members in windows.items():
        name = _onset_name(k)
        covered = members.keys() <= windows.get(k - 1, {}).keys() or (
            members.keys() < windows.get(k + 1, {}).keys()
        )
        if not covered or f"{SILENCE}|{ONSET}|{name}" in st.causes:
            groups[(ONSET, name)] = list(members.values())
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
    until = (
        f"until fewer targets keep it open, or `fleetpulse policy release --check {cause.check} "
        f"--scope {cause.scope}:{cause.name}`"
    )
    if cause.scope == ONSET:
        summary = (
            f"{count} targets fell silent together (from {cause.name}): one common cause, "
            "not node faults"
        )
        until = "until fewer of them stay silent"
    annotations = {
        "summary": summary,
        "description": (
            f"{summary}. FleetPulse {held} for this check in this scope {until}. Look for a "
            "monitoring outage (a Prometheus server or scrape job), a driver or firmware wave, "
            "a network partition or an ingest bug."
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
