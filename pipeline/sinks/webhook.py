"""Alerts to a generic webhook, and the retrying JSON POST both alert sinks share.

Only a 2xx answer counts as delivered. 408, 429, 5xx and connection failures are retried with
jittered exponential backoff (pipeline.retry; a `Retry-After` in seconds is honoured, capped at
the maximum delay); any other status is a verdict on the payload and is not retried. The body
a webhook receives is Alertmanager's webhook format (version "4"), so receivers written for
Alertmanager work unchanged; each alert keeps its FleetPulse fingerprint, so a receiver can
drop the duplicates that at-least-once delivery brings.

Receivers can trust what they get: with a secret, each POST is signed per Standard Webhooks
(pipeline/sinks/signing.py: webhook-id is derived from the alerts, so a retry or replay carries the
same id); a target may add bearer or basic auth, and its TLS certificate is checked unless it
says otherwise. Redirects are never followed: `requests` would turn a 301/302 into a GET
without the body (whose 200 would count as delivered) and re-post a 307 to wherever it points,
so a 3xx is a refusal naming where it pointed. Every URL and error text in a message goes
through pipeline.redact first: a webhook URL is often a credential.

A receiver cannot hold a delivery: `timeout_s` is the deadline of one whole POST (connect, TLS,
request, status line, headers and the answer's body), not of each socket read, so a receiver
that drips one byte a second is cut at the deadline (its socket shut from a timer thread) and
the attempt counts as failed. At most MAX_RESPONSE_BYTES of an answer's body are read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import requests
import requests.adapters
import requests.auth
import tenacity
import urllib3
import urllib3.connection

from pipeline.errors import SinkError
from pipeline.ids import stable_id
from pipeline.model import Alert
from pipeline.redact import redact
from pipeline.retry import retrying

RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Alertmanager writes this for "no end time" in its webhook payload.
ZERO_TIME = "0001-01-01T00:00:00Z"
# what is read of an answer's body (quoted in errors): a receiver cannot make us read more
MAX_RESPONSE_BYTES = 8192
# a request the URL alone rules out (file://, no host): retrying it cannot help
_BAD_URL = (requests.exceptions.InvalidSchema, requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema)


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


# --- one deadline for a whole POST ------------------------------------------------------------
# requests' timeout bounds each socket operation, so a receiver answering a byte at a time never
# trips it. The connections of our sessions put their sockets in `_attempt.sockets` of the
# thread making the request; a timer shuts them when the attempt's deadline passes, which ends
# any blocked read or write at once.

_attempt = threading.local()


def _watched(sock: Any) -> Any:
    sockets: list[Any] | None = getattr(_attempt, "sockets", None)
    if sockets is not None and sock is not None:
        sockets.append(sock)
        if getattr(_attempt, "expired", None) is not None and _attempt.expired.is_set():
            _shut(sock)  # made after the deadline passed (the timer has run)
    return sock


def _shut(sock: Any) -> None:
    with contextlib.suppress(OSError):  # closed already, or detached by the TLS wrapper
        sock.shutdown(socket.SHUT_RDWR)


class WatchedHTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _watched(super()._new_conn())  # type: ignore[no-any-return]

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watched(self.sock)  # a kept-alive connection: its socket was made by another attempt
        super().request(*args, **kwargs)


class WatchedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _watched(super()._new_conn())  # type: ignore[no-any-return]  # the handshake

    def connect(self) -> None:
        super().connect()
        _watched(self.sock)  # the TLS socket (the plain one is detached by the wrapper)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watched(self.sock)
        super().request(*args, **kwargs)


class WatchedHTTPConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSConnectionPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


_WATCHED_POOLS = {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}


class _DeadlineAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter whose connections (direct or through an HTTP(S) proxy) are watched."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools are its own (not watched)
            manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager


def deadline_session() -> requests.Session:
    """A requests session whose sockets `_deadline` can cut."""
    session = requests.Session()
    adapter = _DeadlineAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[threading.Event]:
    """Within the block, this thread's requests on a deadline_session are cut `seconds` from
    now; the event says whether they were."""
    expired, sockets = threading.Event(), list[Any]()
    _attempt.sockets, _attempt.expired = sockets, expired

    def cut() -> None:
        expired.set()
        for sock in list(sockets):
            _shut(sock)

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        yield expired
    finally:
        timer.cancel()
        _attempt.sockets = _attempt.expired = None


class JsonPoster:
    """POST a JSON body, retrying what may succeed later; each attempt ends by `timeout_s`."""

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
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s: expected a finite number of seconds > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._session = session or deadline_session()
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
        with _deadline(self.timeout_s) as expired:
            try:
                answer = self._exchange(target, data, headers)
            except _BAD_URL as exc:
                raise DeliveryError(f"{shown}: not an http(s) URL ({type(exc).__name__})",
                                    status=None, permanent=True) from None
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                if expired.is_set():
                    raise _TransientError(
                        f"no complete answer within the {self.timeout_s:g} s deadline "
                        "(alerts.timeout_s)", None) from None
                raise _TransientError(redact(f"{type(exc).__name__}: {exc}"), None) from None
        return _verdict(shown, answer)

    def _exchange(self, target: Target, data: bytes, headers: dict[str, str]) -> _Answer:
        """POST; of the answer's body, at most MAX_RESPONSE_BYTES are read."""
        response = self._session.post(
            target.url,
            data=data,
            headers=headers,
            timeout=self.timeout_s,  # each socket operation; _deadline bounds the whole
            auth=target.auth,
            verify=target.verify,
            allow_redirects=False,  # a POST is never re-sent elsewhere, nor turned into a GET
            stream=True,  # the body is read below, capped
        )
        with response:
            body = b""
            if not 200 <= response.status_code < 300:  # a 2xx body is not needed
                body = response.raw.read(MAX_RESPONSE_BYTES, decode_content=True) or b""
        return _Answer(response.status_code, response.headers, body)

    def close(self) -> None:
        self._session.close()


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes  # at most MAX_RESPONSE_BYTES; empty for a 2xx


def _verdict(shown: str, answer: _Answer) -> int:
    """A 2xx status; else DeliveryError (a verdict on the payload) or _TransientError."""
    status, headers = answer.status, answer.headers
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        location = redact(headers.get("Location", "(no Location)"))
        raise DeliveryError(
            f"{shown} answered HTTP {status} redirecting to {location}: "
            "redirects are not followed for a POST; configure the final URL",
            status=status,
            permanent=True,
        )
    text = answer.body.decode("utf-8", "replace")
    problem = redact(f"HTTP {status}: {text[:300]!r}")
    if status not in RETRIED_STATUSES:
        raise DeliveryError(f"{shown} refused the payload ({problem})", status=status,
                            permanent=True)
    raise _TransientError(problem, _retry_after(headers.get("Retry-After")))


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
