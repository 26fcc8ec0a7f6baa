"""Alertmanager-shaped alerts (fleet.alerts): what the policy raises, built in one place.

Labels name an alert and never change while it fires; annotations carry the explanation and may
be updated (same labels, same fingerprint, new annotations). The fingerprint is Alertmanager's
own (FNV-1a 64 over the label names and values sorted by name, a 0xff byte after each), so the
key of our topic is the id Alertmanager shows. `ts` is ms like every topic; startsAt/endsAt are
RFC 3339 UTC as Alertmanager's API wants them. A firing alert has no endsAt: whoever posts it to
Alertmanager re-sends it while it fires, and the resolved copy carries endsAt.

Labels are what Alertmanager users route and group on: `alertname`, `severity`, `service`,
`cluster`, `pool`, `check`, and for an alert about one target `zone` and `node` or `slice`.
Every alert has a `runbook_url` annotation (the runbook of its check, under a configurable
base) and a `generatorURL` (the target's or pool's page under another base).

Pure: built from the data passed in, never from the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import quote

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
# PolicySettings.runbook_base / generator_base default to these
RUNBOOK_BASE = "https://fleetpulse.io/runbooks"
GENERATOR_BASE = "https://fleetpulse.io/fleet"


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


def runbook_url(labels: Mapping[str, str], base: str = RUNBOOK_BASE) -> str:
    """The runbook of the alert's check (its first, for a cordon over several checks)."""
    check = labels.get("check", "").split(",")[0] or labels.get("alertname", "")
    return f"{base.rstrip('/')}/{quote(check, safe='')}"


def generator_url(labels: Mapping[str, str], base: str = GENERATOR_BASE) -> str:
    """Where to look: base/cluster/node-or-slice for a target, base/cluster/pool for a pool."""
    parts = [labels.get("cluster", "")]
    parts.append(labels.get("node") or labels.get("slice") or labels.get("pool") or "")
    path = "/".join(quote(part, safe="") for part in parts if part)
    return f"{base.rstrip('/')}/{path}"[:256]


def firing(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    ts: int,
    *,
    runbook_base: str = RUNBOOK_BASE,
    generator_base: str = GENERATOR_BASE,
) -> Alert:
    """A new firing alert that starts at `ts`."""
    noted = {**annotations, "runbook_url": runbook_url(labels, runbook_base)}
    return Alert(
        ts=ts,
        fingerprint=fingerprint(labels),
        status="firing",
        labels=dict(labels),
        annotations={key: clip(value) for key, value in noted.items()},
        startsAt=rfc3339(ts),
        generatorURL=generator_url(labels, generator_base),
    )


def update(alert: Alert, annotations: Mapping[str, str], ts: int) -> Alert:
    """The same firing alert (same labels, fingerprint, startsAt, links) with new annotations."""
    link = alert.annotations.get("runbook_url")
    kept = {} if link is None else {"runbook_url": link}
    clipped = {key: clip(value) for key, value in {**annotations, **kept}.items()}
    return msgspec.structs.replace(alert, ts=ts, annotations=clipped)


def resolve(alert: Alert, ts: int) -> Alert:
    """The resolved copy of a firing alert: endsAt = ts."""
    return msgspec.structs.replace(alert, ts=ts, status="resolved", endsAt=rfc3339(ts))


def target_labels(target: Target, alertname: str, severity: str, check: str) -> dict[str, str]:
    """`node` or `slice` names the target (by its kind), as routes match on them."""
    return {
        "alertname": alertname,
        "severity": severity,
        "service": SOURCE,
        "cluster": target.cluster,
        "pool": target.pool,
        "zone": target.zone,
        target.kind: target.name,
        "check": check[:256],
    }


def cordon_alert(
    target: Target,
    reason: Reason,
    ts: int,
    *,
    action_id: str,
    fatal: bool,
    maintenance: bool,
    runbook_base: str = RUNBOOK_BASE,
    generator_base: str = GENERATOR_BASE,
) -> Alert:
    """One alert per node/slice FleetPulse cordons; resolved when it is released. `check` is
    the checks behind the cordon, comma-separated (match with a regex when there are several)."""
    if maintenance:
        labels = target_labels(target, MAINTENANCE, "info", "maintenance")
        summary = f"{target.kind} {target.name} cordoned ahead of scheduled maintenance"
    else:
        severity = "critical" if fatal else "warning"
        labels = target_labels(target, CORDONED, severity, ",".join(reason.checks) or "unknown")
        summary = f"{target.kind} {target.name} cordoned by FleetPulse: {', '.join(reason.checks)}"
    annotations = {
        "summary": summary,
        "description": reason.summary,
        "action_id": action_id,
        "finding_ids": ", ".join(reason.finding_ids),
    }
    return firing(
        labels, annotations, ts, runbook_base=runbook_base, generator_base=generator_base
    )


def pool_labels(name: PoolAlert, pool: str, cluster: str) -> dict[str, str]:
    alertname, severity = POOL_ALERTS[name]
    # `check` is the policy's own check that held the removals back
    labels = {
        "alertname": alertname,
        "severity": severity,
        "service": SOURCE,
        "pool": pool,
        "check": f"policy.{name}",
    }
    if cluster:
        labels["cluster"] = cluster
    return labels


def pool_alert(
    name: PoolAlert,
    pool: str,
    cluster: str,
    ts: int,
    annotations: Mapping[str, str],
    *,
    runbook_base: str = RUNBOOK_BASE,
    generator_base: str = GENERATOR_BASE,
) -> Alert:
    """One alert per pool and cause (budget spent, capacity deferral, throttling)."""
    labels = pool_labels(name, pool, cluster)
    return firing(
        labels, annotations, ts, runbook_base=runbook_base, generator_base=generator_base
    )
