"""pipeline.sinks.signing: what a receiver accepts, and every way it refuses a webhook."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks.webhooks import Webhook

from pipeline.sinks.signing import (
    ReplayedWebhookError,
    WebhookVerificationError,
    sign_headers,
    signer,
    verify,
)

SECRET = "whsec_" + base64.b64encode(b"a 32-byte secret for the tests!!").decode()
BODY = b'{"version": "4", "alerts": [{"fingerprint": "8f14e45fceea167a"}]}'
NOW = 1_764_424_804.0


def _signed(msg_id: str = "alerts-0123456789abcdef", at: float = NOW) -> dict[str, str]:
    return sign_headers(msg_id, BODY, signer(SECRET), now=at)


def test_a_signed_webhook_verifies_and_its_id_is_remembered() -> None:
    seen: set[str] = set()
    verify(_signed(), BODY, SECRET, now=NOW + 30, seen_ids=seen)
    assert seen == {"alerts-0123456789abcdef"}


def test_the_reference_library_accepts_our_signature() -> None:
    # interoperability: a receiver using the standardwebhooks package (any language port)
    headers = sign_headers("alerts-1", BODY, signer(SECRET))  # now: the library reads the clock
    assert Webhook(SECRET).verify(BODY, headers) == {
        "version": "4",
        "alerts": [{"fingerprint": "8f14e45fceea167a"}],
    }


def test_a_tampered_body_is_rejected() -> None:
    tampered = BODY.replace(b"8f14e45fceea167a", b"0000000000000000")
    with pytest.raises(WebhookVerificationError, match="no matching v1 signature"):
        verify(_signed(), tampered, SECRET, now=NOW)


def test_a_wrong_secret_is_rejected() -> None:
    other = "whsec_" + base64.b64encode(b"another secret, same length!!!!!").decode()
    with pytest.raises(WebhookVerificationError, match="no matching v1 signature"):
        verify(_signed(), BODY, other, now=NOW)


def test_a_changed_id_or_timestamp_breaks_the_signature() -> None:
    headers = _signed()
    for name, value in (("webhook-id", "alerts-other"), ("webhook-timestamp", str(int(NOW) + 1))):
        with pytest.raises(WebhookVerificationError, match="no matching v1 signature"):
            verify({**headers, name: value}, BODY, SECRET, now=NOW)


@pytest.mark.parametrize("offset_s", [-301, 301, -3600])
def test_a_stale_or_future_timestamp_is_rejected(offset_s: float) -> None:
    # a captured request replayed later (or signed by a clock far off) is refused
    with pytest.raises(WebhookVerificationError, match="tolerance 300 s"):
        verify(_signed(at=NOW + offset_s), BODY, SECRET, now=NOW)


def test_within_the_tolerance_is_accepted() -> None:
    verify(_signed(at=NOW - 299), BODY, SECRET, now=NOW)


def test_a_replayed_id_is_rejected_as_a_replay() -> None:
    seen: set[str] = set()
    verify(_signed(), BODY, SECRET, now=NOW, seen_ids=seen)
    # the same message sent again, freshly signed: genuine, but already handled
    with pytest.raises(ReplayedWebhookError, match="already received"):
        verify(_signed(at=NOW + 60), BODY, SECRET, now=NOW + 60, seen_ids=seen)


def test_a_forged_webhook_does_not_poison_the_seen_ids() -> None:
    seen: set[str] = set()
    with pytest.raises(WebhookVerificationError):
        verify(_signed(), b"{}", SECRET, now=NOW, seen_ids=seen)
    assert seen == set()


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_headers_are_rejected(missing: str) -> None:
    headers = {k: v for k, v in _signed().items() if k != missing}
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(headers, BODY, SECRET, now=NOW)


def test_headers_are_case_insensitive_and_rotated_signatures_accepted() -> None:
    headers = {k.title(): v for k, v in _signed().items()}
    headers["Webhook-Signature"] = "v1,bm90IGl0 " + headers["Webhook-Signature"]  # old key first
    verify(headers, BODY, SECRET, now=NOW)


def test_a_bad_secret_is_refused_without_naming_it() -> None:
    with pytest.raises(ValueError) as bad:
        signer("whsec_")
    assert "whsec_" in str(bad.value) and "expected" in str(bad.value)
