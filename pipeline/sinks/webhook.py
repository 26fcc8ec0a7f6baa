"""Alerts to a generic webhook, and the retrying JSON POST both alert sinks share.

Only a 2xx answer counts as delivered. 408, 429, 5xx and connection failures are retried with
jittered exponential backoff (pipeline.retry; a `Retry-After` in seconds is honoured, capped at
the maximum delay); any other status is a verdict on the payload and is not retried. The body
a webhook receives is Alertmanager's webhook format (version "4"), so receivers written for
Alertmanager work unchanged; each alert keeps its FleetPulse fingerprint, so a receiver can
drop the duplicates that at-least-once delivery brings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import requests
import tenacity

from pipeline.errors import SinkError
from pipeline.model import Alert
from pipeline.retry import retrying

RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Alertmanager writes this for "no end time" in its webhook payload.
ZERO_TIME = "0001-01-01T00:00:00Z"


class DeliveryError(SinkError):
    """Not delivered. `permanent`: retrying the same payload cannot help (a 4xx verdict)."""

    def __init__(self, message: str, *, status: int | None, permanent: bool) -> None:
        super().__init__(message)
        self.status, self.permanent = status, permanent


class _TransientError(Exception):
    """A failure worth retrying; `retry_after`: the delay the server asked for, if any."""

    def __init__(self, problem: str, retry_after: float | None) -> None:
        super().__init__(problem)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Delivered:
    status: int
    attempts: int


class JsonPoster:
    """POST a JSON body, retrying what may succeed later."""

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._session = session or requests.Session()
        self._sleep = sleep

    def post(self, url: str, body: object) -> Delivered:
        data = msgspec.json.encode(body)
        headers = {"Content-Type": "application/json", "User-Agent": "fleetpulse"}
        attempts = retrying(
            attempts=self.max_attempts,
            initial_s=self.backoff_initial_s,
            maximum_s=self.backoff_max_s,
            retry_on=_TransientError,
            sleep=self._sleep,
            delay_hint=lambda exc: exc.retry_after if isinstance(exc, _TransientError) else None,
        )
        try:
            for attempt in attempts:
                with attempt:  # a retried failure is recorded here; tenacity decides
                    status = self._post_once(url, data, headers)
                outcome = attempt.retry_state.outcome
                if outcome is not None and not outcome.failed:
                    return Delivered(status, attempt.retry_state.attempt_number)
        except tenacity.RetryError as exc:
            problem = exc.last_attempt.exception()
            raise DeliveryError(
                f"{url}: not delivered after {self.max_attempts} attempts ({problem})",
                status=None,
                permanent=False,
            ) from problem
        raise AssertionError("unreachable: tenacity stops with a success or an error")

    def _post_once(self, url: str, data: bytes, headers: dict[str, str]) -> int:
        """One POST: the 2xx status, or _TransientError (worth retrying), or DeliveryError."""
        try:
            response = self._session.post(url, data=data, headers=headers, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise _TransientError(f"{type(exc).__name__}: {exc}", None) from exc
        if 200 <= response.status_code < 300:
            return response.status_code
        problem = f"HTTP {response.status_code}: {response.text[:300]!r}"
        if response.status_code not in RETRIED_STATUSES:
            raise DeliveryError(
                f"{url} refused the payload ({problem})",
                status=response.status_code,
                permanent=True,
            )
        raise _TransientError(problem, _retry_after(response.headers.get("Retry-After")))

    def close(self) -> None:
        self._session.close()


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def webhook_payload(alerts: Sequence[Alert], receiver: str = "fleetpulse") -> dict[str, Any]:
    """Alertmanager's webhook JSON (version 4) for a group of alerts."""
    labels = [alert.labels for alert in alerts]
    annotations = [alert.annotations for alert in alerts]
    return {
        "version": "4",
        "groupKey": "{}:{fingerprints=" + ",".join(a.fingerprint for a in alerts) + "}",
        "truncatedAlerts": 0,
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": _common(labels),
        "commonAnnotations": _common(annotations),
        "externalURL": "",
        "alerts": [
            {
                "status": alert.status,
                "labels": alert.labels,
                "annotations": alert.annotations,
                "startsAt": alert.startsAt,
                "endsAt": alert.endsAt or ZERO_TIME,
                "generatorURL": alert.generatorURL,
                "fingerprint": alert.fingerprint,
            }
            for alert in alerts
        ],
    }


def _common(maps: Sequence[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    return {k: v for k, v in maps[0].items() if all(m.get(k) == v for m in maps[1:])}


class WebhookSink:
    """One webhook receiver."""

    def __init__(self, url: str, poster: JsonPoster) -> None:
        self.url = url
        self.name = f"webhook {url}"
        self._poster = poster

    def deliver(self, alerts: Sequence[Alert]) -> Delivered:
        return self._poster.post(self.url, webhook_payload(alerts))
