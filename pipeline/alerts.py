"""Alertmanager-shaped alerts (fleet.alerts): what the policy raises, built in one place.

Labels name an alert and never change while it fires; annotations carry the explanation and may
be updated (same labels, same fingerprint, new annotations). The fingerprint is Alertmanager's
own (FNV-1a 64 over the label names and values sorted by name, a 0xff byte after each), so the
key of our topic is the id Alertmanager shows. `ts` is ms like every topic; startsAt/endsAt are
RFC 3339 UTC as Alertmanager's API wants them. A firing alert has no endsAt: whoever posts it to
Alertmanager re-sends it while it fires, and the resolved copy carries endsAt.

Pure: built from the data passed in, never from the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

import msgspec

from pipeline.model import Alert, Reason, Target

SOURCE = "fleetpulse"
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF
_MASK = (1 << 64) - 1
_TEXT_MAX = 4000  # Alert annotations are Text (4096); leave room for the ellipsis

PoolAlert = Literal["budget", "capacity", "throttle"]
POOL_ALERTS: dict[PoolAlert, tuple[str, str]] = {
    # name -> (alertname, severity)
    "budget": ("FleetPulseBudgetExhausted", "critical"),
    "capacity": ("FleetPulseCapacityDeferral", "warning"),
    "throttle": ("FleetPulseRemediationThrottled", "warning"),
}
CORDONED = "FleetPulseTargetCordoned"
MAINTENANCE = "FleetPulseMaintenanceCordon"


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's label-set fingerprint as 16 lowercase hex digits."""
    digest = _FNV_OFFSET
    for name in sorted(labels):
        for text in (name, labels[name]):
            for byte in text.encode():
                digest = ((digest ^ byte) * _FNV_PRIME) & _MASK
            digest = ((digest ^ _SEPARATOR) * _FNV_PRIME) & _MASK
    return f"{digest:016x}"


def rfc3339(ms: int) -> str:
    """Epoch ms → '2024-05-01T12:00:00.250Z' (UTC, millisecond precision)."""
    seconds, millis = divmod(ms, 1000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{millis:03d}Z"


def clip(text: str, limit: int = _TEXT_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def firing(labels: Mapping[str, str], annotations: Mapping[str, str], ts: int) -> Alert:
    """A new firing alert that starts at `ts`."""
    return Alert(
        ts=ts,
        fingerprint=fingerprint(labels),
        status="firing",
        labels=dict(labels),
        annotations={key: clip(value) for key, value in annotations.items()},
        startsAt=rfc3339(ts),
    )


def update(alert: Alert, annotations: Mapping[str, str], ts: int) -> Alert:
    """The same firing alert (same labels, fingerprint, startsAt) with new annotations."""
    clipped = {key: clip(value) for key, value in annotations.items()}
    return msgspec.structs.replace(alert, ts=ts, annotations=clipped)


def resolve(alert: Alert, ts: int) -> Alert:
    """The resolved copy of a firing alert: endsAt = ts."""
    return msgspec.structs.replace(alert, ts=ts, status="resolved", endsAt=rfc3339(ts))


def target_labels(target: Target, alertname: str, severity: str) -> dict[str, str]:
    return {
        "alertname": alertname,
        "severity": severity,
        "service": SOURCE,
        "cluster": target.cluster,
        "pool": target.pool,
        "zone": target.zone,
        "target_kind": target.kind,
        "target": target.name,
    }


def cordon_alert(
    target: Target, reason: Reason, ts: int, *, action_id: str, fatal: bool, maintenance: bool
) -> Alert:
    """One alert per node/slice FleetPulse cordons; resolved when it is released."""
    if maintenance:
        labels = target_labels(target, MAINTENANCE, "info")
        summary = f"{target.kind} {target.name} cordoned ahead of scheduled maintenance"
    else:
        labels = target_labels(target, CORDONED, "critical" if fatal else "warning")
        summary = f"{target.kind} {target.name} cordoned by FleetPulse: {', '.join(reason.checks)}"
    annotations = {
        "summary": summary,
        "description": reason.summary,
        "action_id": action_id,
        "finding_ids": ", ".join(reason.finding_ids),
    }
    return firing(labels, annotations, ts)


def pool_labels(name: PoolAlert, pool: str, cluster: str) -> dict[str, str]:
    alertname, severity = POOL_ALERTS[name]
    labels = {"alertname": alertname, "severity": severity, "service": SOURCE, "pool": pool}
    if cluster:
        labels["cluster"] = cluster
    return labels


def pool_alert(
    name: PoolAlert, pool: str, cluster: str, ts: int, annotations: Mapping[str, str]
) -> Alert:
    """One alert per pool and cause (budget spent, capacity deferral, throttling)."""
    return firing(pool_labels(name, pool, cluster), annotations, ts)
