"""Alerts to a generic webhook, and the retrying JSON POST both alert sinks share.

Only a 2xx answer counts as delivered. 408, 429, 5xx and connection failures are retried with
jittered exponential backoff (pipeline.retry; a `Retry-After` in seconds is honoured, capped at
the maximum delay); any other status is a verdict on the payload and is not retried. The body
a webhook receives is Alertmanager's webhook format (version "4"), so receivers written for
Alertmanager work unchanged; each alert keeps its FleetPulse fingerprint, so a receiver can
drop the duplicates that at-least-once delivery brings.

Receivers can trust what they get: with a secret, each POST is signed per Standard Webhooks
(pipeline/webhooks.py: webhook-id is derived from the alerts, so a retry or replay carries the
same id); a target may add bearer or basic auth, and its TLS certificate is checked unless it
says otherwise. Redirects are never followed: `requests` would turn a 301/302 into a GET
without the body (whose 200 would count as delivered) and re-post a 307 to wherever it points,
so a 3xx is a refusal naming where it pointed. Every URL and error text in a message goes
through pipeline.redact first: a webhook URL is often a credential.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import requests
import requests.auth
import tenacity

from pipeline.errors import SinkError
from pipeline.ids import stable_id
from pipeline.model import Alert
from pipeline.redact import redact
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


@dataclass(frozen=True)
class Target:
    """Where and how to POST: auth and TLS per target (credentials already read)."""

    url: str
    auth: requests.auth.AuthBase | None = None
    verify: bool | str = True  # requests' `verify`: True, a CA bundle path, or False
    # extra headers for one attempt, from the body (Standard Webhooks signing: fresh timestamp)
    sign: Callable[[bytes], dict[str, str]] | None = None


class BearerAuth(requests.auth.AuthBase):
    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._token}"
        return request

    def __repr__(self) -> str:
        return "BearerAuth(***)"


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

    def post(self, target: Target | str, body: object) -> Delivered:
        if isinstance(target, str):
            target = Target(target)
        data = msgspec.json.encode(body)
        shown = redact(target.url)
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
                    status = self._post_once(target, shown, data)
                outcome = attempt.retry_state.outcome
                if outcome is not None and not outcome.failed:
                    return Delivered(status, attempt.retry_state.attempt_number)
        except tenacity.RetryError as exc:
            problem = exc.last_attempt.exception()
            # `from None`: the chained requests exception would print the raw URL
            raise DeliveryError(
                f"{shown}: not delivered after {self.max_attempts} attempts ({problem})",
                status=None,
                permanent=False,
            ) from None
        raise AssertionError("unreachable: tenacity stops with a success or an error")

    def _post_once(self, target: Target, shown: str, data: bytes) -> int:
        """One POST: the 2xx status, or _TransientError (worth retrying), or DeliveryError."""
        headers = {"Content-Type": "application/json", "User-Agent": "fleetpulse"}
        if target.sign is not None:
            headers.update(target.sign(data))
        try:
            response = self._session.post(
                target.url,
                data=data,
                headers=headers,
                timeout=self.timeout_s,
                auth=target.auth,
                verify=target.verify,
                allow_redirects=False,  # a POST is never re-sent elsewhere, nor turned into a GET
            )
        except requests.RequestException as exc:
            raise _TransientError(redact(f"{type(exc).__name__}: {exc}"), None) from None
        if 200 <= response.status_code < 300:
            return response.status_code
        if 300 <= response.status_code < 400:
            location = redact(response.headers.get("Location", "(no Location)"))
            raise DeliveryError(
                f"{shown} answered HTTP {response.status_code} redirecting to {location}: "
                "redirects are not followed for a POST; configure the final URL",
                status=response.status_code,
                permanent=True,
            )
        problem = redact(f"HTTP {response.status_code}: {response.text[:300]!r}")
        if response.status_code not in RETRIED_STATUSES:
            raise DeliveryError(
                f"{shown} refused the payload ({problem})",
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


def webhook_id(alerts: Sequence[Alert]) -> str:
    """Standard Webhooks `webhook-id`: the same alert records give the same id, so a retry or a
    replay of the batch is recognisably the one the receiver already has."""
    return stable_id("alerts", *(f"{a.fingerprint}:{a.status}:{a.ts}" for a in alerts))


class WebhookSink:
    """One webhook receiver; `sign(msg_id, body)` gives the webhook-* headers when set."""

    def __init__(
        self,
        target: Target | str,
        poster: JsonPoster,
        sign: Callable[[str, bytes], dict[str, str]] | None = None,
    ) -> None:
        self.target = Target(target) if isinstance(target, str) else target
        self.url = self.target.url
        self.name = f"webhook {redact(self.url)}"
        self._poster = poster
        self._sign = sign

    def deliver(self, alerts: Sequence[Alert]) -> Delivered:
        target = self.target
        if self._sign is not None:
            msg_id, sign = webhook_id(alerts), self._sign
            target = dataclasses.replace(target, sign=lambda body: sign(msg_id, body))
        return self._poster.post(target, webhook_payload(alerts))
