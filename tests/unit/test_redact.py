"""pipeline.redact: credentials in URLs and error texts are masked before anyone sees them."""

from __future__ import annotations

import pytest

from pipeline.redact import redact, remember


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("https://alice:pw-hunter2@hooks.example.com/alerts", "pw-hunter2"),
        ("https://tok3n-value@hooks.example.com/alerts", "tok3n-value"),
        ("https://hooks.example.com/a?token=s3cr3t-t0k3n&x=1", "s3cr3t-t0k3n"),
        ("https://h/a?x=1&api_key=s3cr3t-k3y", "s3cr3t-k3y"),
        ("https://h/a?sig=abcDEF123&se=2026", "abcDEF123"),
        ("https://bucket.s3/x?X-Amz-Signature=deadbeef99", "deadbeef99"),
        ("https://hooks.slack.com/services/T0123ABCD/B0456EFGH/XyZ123secretPath", "XyZ123secret"),
        (
            "HTTPSConnectionPool(host='hooks.slack.com', port=443): Max retries exceeded with "
            "url: /services/T0123ABCD/B0456EFGH/XyZ123secretPath (Caused by ...)",
            "XyZ123secret",
        ),
        ("https://discord.com/api/webhooks/1234567890/AbC-dEf_ghI123", "AbC-dEf_ghI123"),
        ("https://discordapp.com/api/webhooks/1234567890/AbC-dEf_ghI123/slack", "AbC-dEf_ghI"),
        ("https://x.webhook.office.com/webhookb2/guid@guid/IncomingWebhook/abc/def", "abc/def"),
        ("https://api.telegram.org/bot123456:AAH-secret_tok/sendMessage", "AAH-secret_tok"),
        ("HTTP 401: 'bad Authorization: Bearer eyJhbGciOi.payload.sig'", "eyJhbGciOi"),
        ("echo: Authorization: Basic YWxpY2U6aHVudGVyMg==", "YWxpY2U6aHVudGVyMg"),
        ("secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw in a message", "MfKQ9r8GKYqr"),
    ],
)
def test_known_secret_shapes_are_masked(text: str, secret: str) -> None:
    shown = redact(text)
    assert secret not in shown and "***" in shown


def test_what_is_not_secret_stays_readable() -> None:
    text = "https://alertmanager.example.com:9093/api/v2/alerts?receiver=ops refused (HTTP 400)"
    assert redact(text) == text
    assert redact("https://hooks.slack.com/services/T0/B0/x").startswith("https://hooks.slack.com")


def test_redacting_twice_changes_nothing_more() -> None:
    once = redact("https://u:p4ss@h/x?token=abc123 Bearer abcdefgh /services/T1/B2/c3")
    assert redact(once) == once


def test_remembered_secrets_are_masked_whatever_their_shape() -> None:
    remember("rm-Secret-Value-7", "ab")  # too short to remember: would mask ordinary text
    assert redact("server said: rm-Secret-Value-7 is wrong") == "server said: *** is wrong"
    assert redact("about ab") == "about ab"
