"""Signed webhooks (the Standard Webhooks spec, https://www.standardwebhooks.com): both ends.

FleetPulse signs every webhook it sends with three headers: `webhook-id` (deterministic: the
same alerts give the same id, so a retry or a replay carries the id the receiver already saw),
`webhook-timestamp` (seconds, the time of this attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`). The secret is a Standard Webhooks secret,
`whsec_` + base64 (or bare base64), as the `standardwebhooks` package and its ports in other
languages expect, of at least MIN_KEY_BYTES random bytes (a short key can be guessed offline
from one signed request); make one with GENERATE.

A receiver calls `verify(headers, body, secret, seen_ids=...)` with the raw body bytes before
parsing them. It rejects a tampered body (or a wrong secret), a timestamp outside the tolerance
(a captured request replayed later) and an id it has already seen. A replayed id raises
`ReplayedWebhookError`: answer it 2xx without acting again — FleetPulse delivers at least once, and
an error answer would make it a dead letter.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from collections.abc import Mapping, MutableSet
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

from pipeline.config import check_webhook_secret
from pipeline.errors import FleetPulseError

TOLERANCE_S = 5 * 60  # the spec's (and the reference library's) default


class WebhookVerificationError(FleetPulseError):
    """Not a genuine, fresh webhook from the holder of the secret: do not act on it."""


class ReplayedWebhookError(WebhookVerificationError):
    """Genuine and fresh, but its id was seen before: acknowledge it, do not act again."""


def signer(secret: str) -> Webhook:
    """The signing key; a ValueError (never naming the secret) when it is not one, or when it
    is shorter than MIN_KEY_BYTES (the check is config's, so a bad secret fails at start-up)."""
    check_webhook_secret(secret)
    return Webhook(secret)


def sign_headers(
    msg_id: str, body: bytes, secret: Webhook, now: float | None = None
) -> dict[str, str]:
    """The three webhook-* headers for one delivery attempt of `body`."""
    stamp = datetime.fromtimestamp(int(time.time() if now is None else now), tz=UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": secret.sign(msg_id, stamp, body.decode("utf-8")),
    }


def verify(
    headers: Mapping[str, str],
    body: bytes,
    secret: str | Webhook,
    now: float | None = None,
    seen_ids: MutableSet[str] | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> None:
    """Raise WebhookVerificationError unless `body` was signed with `secret` within
    `tolerance_s` of `now` (default: the clock); with `seen_ids`, raise ReplayedWebhookError for an
    id already in it, and add the id once the webhook is verified."""
    key = secret if isinstance(secret, Webhook) else signer(secret)
    lower = {name.lower(): value for name, value in headers.items()}
    msg_id = lower.get("webhook-id", "")
    stamp_text = lower.get("webhook-timestamp", "")
    signatures = lower.get("webhook-signature", "")
    if not (msg_id and stamp_text and signatures):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        stamp = int(stamp_text)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp {stamp_text!r} is not seconds") from None
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance_s:
        raise WebhookVerificationError(
            f"webhook-timestamp is {stamp - current:+.0f} s from now "
            f"(tolerance {tolerance_s:.0f} s)"
        )
    signed_at = datetime.fromtimestamp(stamp, tz=UTC)
    expected = _signature_bytes(key.sign(msg_id, signed_at, _text(body)))
    if not any(
        hmac.compare_digest(expected, _signature_bytes(candidate))
        for candidate in signatures.split()
        if candidate.startswith("v1,")
    ):
        raise WebhookVerificationError("no matching v1 signature: body altered or wrong secret")
    if seen_ids is not None:
        if msg_id in seen_ids:
            raise ReplayedWebhookError(f"webhook-id {msg_id} was already received")
        seen_ids.add(msg_id)


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise WebhookVerificationError("body is not UTF-8") from None


def _signature_bytes(versioned: str) -> bytes:
    try:
        return base64.b64decode(versioned.partition(",")[2], validate=True)
    except binascii.Error:
        return b""
