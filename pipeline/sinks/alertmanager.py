"""Alerts to a real Alertmanager: `POST /api/v2/alerts` with a JSON array of postable alerts.

Each alert is `{labels, annotations, startsAt, endsAt?, generatorURL?}` (Alertmanager's API v2
`postableAlert`). A resolved alert always carries `endsAt` (its own, or the time it was
resolved); a firing alert carries none, so Alertmanager keeps it until `resolve_timeout`
unless it is sent again — as Prometheus does, the producer re-sends firing alerts. Alertmanager
identifies an alert by its label set, so re-posting after a retry or a replay is harmless.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from pipeline.model import Alert
from pipeline.redact import redact
from pipeline.sinks.webhook import Delivered, JsonPoster, Target


def postable_alert(alert: Alert) -> dict[str, Any]:
    body: dict[str, Any] = {
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": alert.startsAt,
    }
    ends = alert.endsAt or (_rfc3339(alert.ts) if alert.status == "resolved" else None)
    if ends:
        body["endsAt"] = ends
    if alert.generatorURL:  # the API validates it as a URI: leave it out rather than send ""
        body["generatorURL"] = alert.generatorURL
    return body


def _rfc3339(ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AlertmanagerSink:
    def __init__(self, base: Target | str, poster: JsonPoster) -> None:
        base = Target(base) if isinstance(base, str) else base
        self.url = base.url.rstrip("/") + "/api/v2/alerts"
        self.target = dataclasses.replace(base, url=self.url)
        self.name = f"alertmanager {redact(base.url)}"
        self._poster = poster

    def deliver(self, alerts: Sequence[Alert]) -> Delivered:
        return self._poster.post(self.target, [postable_alert(alert) for alert in alerts])
