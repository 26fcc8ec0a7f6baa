"""The alert settings are refused at load when they would stall or silence delivery: an
endless or zero timeout, a URL that is no HTTP receiver, a signing key short enough to guess,
an empty hold annotation; each error names the field, what was expected and what arrived."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from pipeline.commands.alerts import build_sinks
from pipeline.config import AlertSettings, Settings, WebhookTarget, load_settings
from pipeline.errors import ConfigError

KEY = "whsec_" + base64.b64encode(b"k" * 24).decode()  # the shortest key accepted
SHORT = "whsec_" + base64.b64encode(b"short-key-23-bytes-long").decode()  # 23 bytes


@pytest.fixture(autouse=True)
def _no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no fleetpulse.toml of the checkout is read


@pytest.mark.parametrize("setting", ["timeout_s", "backoff_initial_s", "backoff_max_s",
                                     "stalled_after_s"])
@pytest.mark.parametrize(("value", "shown"), [("inf", "inf"), ("nan", "nan"), ("0", "0.0"),
                                              ("-1", "-1.0")])
def test_seconds_must_be_finite_and_positive(setting: str, value: str, shown: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={f"FLEETPULSE_ALERTS__{setting.upper()}": value})
    message = str(refused.value)
    assert f"{setting}: expected a finite number of seconds > 0, got {shown}" in message
    assert "`alerts`" in message


@pytest.mark.parametrize(
    ("environ", "named", "arrived"),
    [
        ({"FLEETPULSE_ALERTS__WEBHOOK_URLS": '["http://ok.example/a", "file:///etc/passwd"]'},
         "webhook_urls[1]", "'file:///etc/passwd'"),
        ({"FLEETPULSE_ALERTS__WEBHOOKS": '[{url = "ftp://ops:pw-9@files.example/in"}]'},
         "alerts.webhooks[0]", "'ftp://***@files.example/in'"),  # credentials masked
        ({"FLEETPULSE_ALERTS__ALERTMANAGER_URL": "alertmanager:9093"},
         "alertmanager_url", "'alertmanager:9093'"),
        ({"FLEETPULSE_ALERTS__WEBHOOK_URLS": '["http:///no-host"]'},
         "webhook_urls[0]", "'http:///no-host'"),
    ],
)
def test_only_http_urls_with_a_host_are_receivers(
    environ: dict[str, str], named: str, arrived: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ=environ)
    message = str(refused.value)
    assert named in message and "expected an http:// or https:// URL" in message
    assert f"got {arrived}" in message and "pw-9" not in message


def test_https_and_http_receivers_load() -> None:
    settings = load_settings(environ={
        "FLEETPULSE_ALERTS__WEBHOOK_URLS": '["https://hooks.example/a", "http://10.0.0.5:8080/"]',
        "FLEETPULSE_ALERTS__ALERTMANAGER_URL": "http://alertmanager:9093",
        "FLEETPULSE_ALERTS__TIMEOUT_S": "2.5",
    })
    assert settings.alerts.timeout_s == 2.5 and len(settings.alerts.webhook_urls) == 2


def test_a_short_signing_key_is_refused_with_how_to_make_one() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"FLEETPULSE_ALERTS__WEBHOOK_SECRET": SHORT})
    message = str(refused.value)
    assert "webhook_secret: the key is 23 bytes, expected at least 24 random bytes" in message
    assert "secrets.token_bytes(32)" in message  # how to generate one
    assert SHORT.removeprefix("whsec_") not in message
    assert load_settings(environ={"FLEETPULSE_ALERTS__WEBHOOK_SECRET": KEY}).alerts.webhook_secret


def test_a_short_key_in_a_file_is_refused_at_start(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text(SHORT + "\n")
    good = tmp_path / "good"
    good.write_text(KEY + "\n")
    for alerts, named in [
        (AlertSettings(webhook_urls=["http://127.0.0.1:9/a"], webhook_secret_file=str(short)),
         f"alerts.webhook_secret_file {short}"),
        (AlertSettings(webhook_secret_file=str(good),
                       webhooks=[WebhookTarget(url="http://127.0.0.1:9/b",
                                               secret_file=str(short))]),
         f"alerts.webhooks[0].secret_file {short}"),
    ]:
        with pytest.raises(ConfigError) as refused:
            build_sinks(Settings(alerts=alerts))
        assert named in str(refused.value) and "23 bytes" in str(refused.value)


def test_an_empty_hold_annotation_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"FLEETPULSE_KUBERNETES__HELD_ANNOTATION": '""'})
    assert "kubernetes.held_annotation" in str(refused.value)
    assert "length >= 1" in str(refused.value)
