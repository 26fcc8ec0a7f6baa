"""How the prometheus source reaches Prometheus: TLS, auth, headers, and the series selector."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.config import HttpClientSettings, SourcesSettings, load_settings
from pipeline.errors import ConfigError, SourceError
from pipeline.redact import redact
from pipeline.sources.prometheus import PrometheusSource, http_session, series_selector


def _settings(tmp_path: Path, **fields: Any) -> SourcesSettings:
    return SourcesSettings(state_dir=str(tmp_path), prometheus_lag_s=0.0, **fields)


def test_certificates_are_checked_by_default(tmp_path: Path) -> None:
    source = PrometheusSource(_settings(tmp_path, prometheus_url="https://prom.example:9090"))
    session = source._client._session  # the PrometheusConnect the source built
    assert session.verify is True
    assert "Authorization" not in session.headers and session.auth is None


def test_a_ca_file_is_what_certificates_are_checked_against(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    http = HttpClientSettings(tls_ca_file=str(ca))
    assert http_session(_settings(tmp_path, prometheus_http=http)).verify == str(ca)
    missing = HttpClientSettings(tls_ca_file=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigError, match=r"tls_ca_file .*nope\.pem"):
        http_session(_settings(tmp_path, prometheus_http=missing))


def test_skipping_verification_is_explicit_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    http = HttpClientSettings(tls_insecure_skip_verify=True)
    with caplog.at_level(logging.WARNING):
        session = http_session(_settings(tmp_path, prometheus_http=http))
    assert session.verify is False
    assert "not checked" in caplog.text


def test_bearer_token_from_a_file_is_sent_and_remembered(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("prom-token-8f3a1c\n")
    http = HttpClientSettings(bearer_token_file=str(token))
    headers = {"X-Scope-OrgID": "team-a"}
    settings = _settings(tmp_path, prometheus_http=http, prometheus_headers=headers)
    session = PrometheusSource(settings)._client._session
    assert session.headers["Authorization"] == "Bearer prom-token-8f3a1c"
    assert session.headers["X-Scope-OrgID"] == "team-a"
    assert redact("answer echoed prom-token-8f3a1c") == "answer echoed ***"


def test_basic_auth_and_its_password_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret-basic-pw\n")
    http = HttpClientSettings(basic_username="reader", basic_password_file=str(password))
    session = http_session(_settings(tmp_path, prometheus_http=http))
    assert session.auth == ("reader", "s3cret-basic-pw")
    assert "Authorization" not in session.headers
    assert redact("s3cret-basic-pw") == "***"
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"basic_password_file .* is empty"):
        http_session(_settings(tmp_path, prometheus_http=HttpClientSettings(
            basic_username="reader", basic_password_file=str(empty))))


def test_auth_settings_come_from_the_environment(tmp_path: Path) -> None:
    settings = load_settings(
        environ={
            "FLEETPULSE_SOURCES__PROMETHEUS_HTTP": '{bearer_token = "env-token-1234"}',
            "FLEETPULSE_SOURCES__PROMETHEUS_HEADERS": '{X-Scope-OrgID = "t1"}',
            # without braces: a braced value would read as a TOML table
            "FLEETPULSE_SOURCES__PROMETHEUS_SELECTOR": 'shard="a"',
        }
    )
    assert series_selector(settings.sources.prometheus_selector).endswith(',shard="a"}')
    assert "env-token-1234" not in repr(settings)  # printed settings show no secret
    session = http_session(settings.sources)
    assert session.headers["Authorization"] == "Bearer env-token-1234"
    assert session.headers["X-Scope-OrgID"] == "t1"


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"prometheus_selector": 'up{shard="a"}'}, "prometheus_selector"),
        ({"prometheus_selector": "{shard=a}"}, "prometheus_selector"),
        (
            {
                "prometheus_headers": {"authorization": "Bearer x"},
                "prometheus_http": {"bearer_token": "y"},
            },
            "not both",
        ),
    ],
)
def test_bad_settings_are_refused(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=match):
        msgspec.convert(bad, SourcesSettings)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", '{__name__=~"(?i)dcgm_fi_.+"}'),
        ('{shard="a"}', '{__name__=~"(?i)dcgm_fi_.+",shard="a"}'),
        (' zone=~"us-.*",pool!="a" ', '{__name__=~"(?i)dcgm_fi_.+",zone=~"us-.*",pool!="a"}'),
        ("{}", '{__name__=~"(?i)dcgm_fi_.+"}'),
    ],
)
def test_the_selector_is_merged_into_the_series_selector(selector: str, expected: str) -> None:
    assert series_selector(selector) == expected


class _RecordingClient:
    """prometheus-api-client's custom_query, recorded: what query the source sends."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, dict[str, str]]] = []

    def custom_query(self, query: str, params: dict[str, str]) -> list[Any]:
        self.queries.append((query, params))
        return []


def test_the_query_carries_the_selector(tmp_path: Path) -> None:
    client = _RecordingClient()
    settings = _settings(tmp_path, prometheus_selector='{shard="b"}')
    PrometheusSource(settings, clock=lambda: 1000.0, client=client).poll()
    [(query, params), (fabric, fabric_params)] = client.queries
    assert query == '{__name__=~"(?i)dcgm_fi_.+",shard="b"}[600000ms]'
    assert params == {"time": "1000.000"}
    # node_exporter's ports of the same shard, same window (sources.prometheus_fabric)
    assert fabric == '{__name__=~"node_(infiniband|network)_.+",shard="b"}[600000ms]'
    assert fabric_params == params


def test_a_redirect_is_not_followed(tmp_path: Path) -> None:
    """A 3xx would carry our headers (tenant, auth) to wherever it points: a failed poll."""
    import http.server
    import threading

    followed: list[str] = []

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/elsewhere"):
                followed.append(self.path)
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(_settings(tmp_path, prometheus_url=url), clock=lambda: 1000.0)
        with pytest.raises(SourceError, match="redirects"):
            source.poll()
    finally:
        server.shutdown()
        server.server_close()
    assert followed == []
