"""Webhook TLS against a real HTTPS server with a certificate of our own CA: the certificate is
checked by default (nothing is delivered to a server we cannot verify), `tls_ca_file` trusts
that CA, and `tls_insecure_skip_verify` turns the check off for a test target."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from pipeline.commands.alerts import _target
from pipeline.config import HttpClientSettings
from pipeline.sinks.webhook import DeliveryError, JsonPoster


def _certificate(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 signed by it (openssl, as the secure Kafka
    profile makes them)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=fleetpulse-test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.cnf")
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    ca, cert, key = _certificate(tmp_path_factory.mktemp("tls"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hook", ca
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, http_settings: HttpClientSettings) -> None:
    poster = JsonPoster(max_attempts=1, timeout_s=5)
    try:
        poster.post(_target(url, http_settings, "alerts.webhooks[0]"), {"alert": "x"})
    finally:
        poster.close()


def test_an_unverifiable_certificate_is_refused_by_default(https: tuple[str, Path]) -> None:
    url, _ = https
    before = len(_Receiver.bodies)
    with pytest.raises(DeliveryError) as refused:
        _post(url, HttpClientSettings())
    assert "SSLError" in str(refused.value) or "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert len(_Receiver.bodies) == before  # nothing reached a server we could not verify


def test_the_configured_ca_is_trusted(https: tuple[str, Path]) -> None:
    url, ca = https
    before = len(_Receiver.bodies)
    _post(url, HttpClientSettings(tls_ca_file=str(ca)))
    assert _Receiver.bodies[before:] == [b'{"alert":"x"}']


def test_skipping_verification_is_an_explicit_choice(https: tuple[str, Path]) -> None:
    url, _ = https
    before = len(_Receiver.bodies)
    _post(url, HttpClientSettings(tls_insecure_skip_verify=True))
    assert len(_Receiver.bodies) == before + 1
