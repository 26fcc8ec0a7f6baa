"""[kafka] security settings: validation, and the arguments each client library gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.errors import ConfigError
from pipeline.redact import redact
from pipeline.wire.kafka import client_kwargs, describe

SASL = {
    "FLEETPULSE_KAFKA__BOOTSTRAP": "broker:9096",
    "FLEETPULSE_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "FLEETPULSE_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
    "FLEETPULSE_KAFKA__SASL_USERNAME": "fleetpulse",
}


def test_plaintext_default_passes_bootstrap_only() -> None:
    kafka = KafkaSettings(bootstrap="b:1")
    assert client_kwargs(kafka) == {"bootstrap_servers": "b:1"}
    assert client_kwargs(kafka, "aiokafka") == {"bootstrap_servers": "b:1"}
    assert client_kwargs(kafka, "faust") == {"broker": ["kafka://b:1"]}


def test_env_sets_sasl_and_every_library_gets_it(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-from-file\n")
    env = {**SASL, "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": str(secret)}
    kafka = load_settings(environ=env).kafka
    expected = {
        "bootstrap_servers": "broker:9096",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "fleetpulse",
        "sasl_plain_password": "s3cret-from-file",
    }
    assert client_kwargs(kafka) == expected
    assert client_kwargs(kafka, "aiokafka") == expected
    creds = client_kwargs(kafka, "faust")["broker_credentials"]
    assert (creds.username, creds.password) == ("fleetpulse", "s3cret-from-file")
    assert (creds.protocol.value, creds.mechanism.value) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    # the file's password is now masked wherever it would be logged
    assert "s3cret-from-file" not in redact("login failed for s3cret-from-file")
    assert describe(kafka) == "broker:9096 (SASL_PLAINTEXT, SCRAM-SHA-512 as 'fleetpulse')"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"FLEETPULSE_KAFKA__SASL_USERNAME": ""}, "needs sasl_username"),
        ({"FLEETPULSE_KAFKA__SASL_MECHANISM": ""}, "needs sasl_mechanism"),
        ({}, "needs sasl_password or sasl_password_file"),
        ({"FLEETPULSE_KAFKA__SASL_PASSWORD": "a", "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": "f"},
         "not both"),
        ({"FLEETPULSE_KAFKA__SASL_PASSWORD": "a", "FLEETPULSE_KAFKA__SSL_CAFILE": "ca.pem"},
         "ssl_cafile set, but security_protocol is SASL_PLAINTEXT"),
        ({"FLEETPULSE_KAFKA__SASL_PASSWORD": "a", "FLEETPULSE_KAFKA__SECURITY_PROTOCOL": "SSL"},
         "but security_protocol is SSL"),
        ({"FLEETPULSE_KAFKA__SASL_MECHANISM": "GSSAPI"}, "kafka.sasl_mechanism"),
    ],
)
def test_invalid_security_settings_are_clear_errors(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ={**SASL, **extra})


def test_password_is_masked_in_repr() -> None:
    kafka = load_settings(environ={**SASL, "FLEETPULSE_KAFKA__SASL_PASSWORD": "hunter22"}).kafka
    assert "hunter22" not in repr(kafka)


def test_missing_tls_file_names_the_setting(tmp_path: Path) -> None:
    kafka = KafkaSettings(security_protocol="SSL", ssl_cafile=str(tmp_path / "nope.pem"))
    for library in ("kafka-python", "aiokafka", "faust"):
        with pytest.raises(ConfigError, match=r"kafka.ssl_cafile .*nope.pem does not exist"):
            client_kwargs(kafka, library)  # type: ignore[arg-type]


def test_missing_password_file_names_the_setting(tmp_path: Path) -> None:
    env = {**SASL, "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": str(tmp_path / "gone")}
    with pytest.raises(ConfigError, match=r"kafka.sasl_password_file .*gone"):
        client_kwargs(load_settings(environ=env).kafka)


def test_kafka_python_gets_tls_files_and_hostname_check(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    kafka = KafkaSettings(security_protocol="SSL", ssl_cafile=str(ca))
    assert client_kwargs(kafka) == {
        "bootstrap_servers": "127.0.0.1:19092",
        "security_protocol": "SSL",
        "ssl_check_hostname": True,
        "ssl_cafile": str(ca),
    }


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends


def test_until_connected_waits_for_an_absent_broker_and_says_why() -> None:
    import threading

    from kafka import KafkaProducer

    from pipeline.wire.kafka import STAY_CONNECTED, until_connected

    kafka = KafkaSettings(bootstrap=f"127.0.0.1:{_closed_port()}")
    stop, heard = threading.Event(), []

    def on_wait(reason: str) -> None:
        heard.append(reason)
        stop.set()  # one failed attempt is enough to see that it waits instead of raising

    got = until_connected(lambda: KafkaProducer(**client_kwargs(kafka), **STAY_CONNECTED),
                          kafka, "test", stop, on_wait)
    assert got is None
    assert len(heard) == 1 and heard[0].startswith(f"waiting for Kafka at {kafka.bootstrap}")


def test_until_connected_lets_other_errors_through() -> None:
    from pipeline.wire.kafka import until_connected

    def refuse() -> None:
        raise ConfigError("bad settings")

    with pytest.raises(ConfigError, match="bad settings"):
        until_connected(refuse, KafkaSettings(), "test")
