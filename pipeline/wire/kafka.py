"""One place that turns [kafka] settings into each client library's connection arguments.

Every producer, consumer and admin client (kafka-python), every aiokafka consumer and the faust
worker is built with `client_kwargs(settings.kafka, library)`, so security settings
(security_protocol, SASL, TLS files, hostname checks) reach every client the same way.

- kafka-python takes the TLS files itself (ssl_cafile, ssl_certfile, ssl_keyfile).
- aiokafka and faust take an `ssl.SSLContext`, built here from the same files.
- faust takes SASL/TLS as `broker_credentials` (faust.SASLCredentials / SSLCredentials) and
  keeps the `kafka://` URL scheme: the credentials decide the protocol.

The password is read from sasl_password_file at build time (a rotated secret is picked up at
the next start) and remembered by pipeline.redact, so it is masked in every log line.

Long-running processes outlive the broker: `until_connected` builds a client while the broker
is away (kafka-python gives up after its bootstrap timeout and raises), and `STAY_CONNECTED`
bounds the client's reconnect backoff, so a process is back within seconds of the broker.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pipeline.config import KafkaSettings
from pipeline.errors import ConfigError, FleetPulseError
from pipeline.redact import load_secret
from pipeline.retry import Backoff

Library = Literal["kafka-python", "aiokafka", "faust"]
T = TypeVar("T")
log = logging.getLogger(__name__)

# kafka-python backs off reconnecting up to 30 s by default: after a broker restart a process
# would sit that long with the broker back. Every long-running client reconnects at least every
# 2 s instead, and one attempt to reach an absent broker at start lasts 5 s, not 30 (so a
# waiting process still stops promptly on SIGTERM). kafka-python keyword arguments.
STAY_CONNECTED: dict[str, Any] = {"reconnect_backoff_max_ms": 2000, "bootstrap_timeout_ms": 5000}
# the pause between two attempts to reach an absent broker (jittered, growing to the maximum)
WAIT_INITIAL_S, WAIT_MAX_S = 1.0, 5.0


def client_kwargs(kafka: KafkaSettings, library: Library = "kafka-python") -> dict[str, Any]:
    """Connection keyword arguments (bootstrap servers and security) for one client library."""
    if library == "faust":
        return {"broker": broker_urls(kafka.bootstrap), **_faust_security(kafka)}
    kwargs: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap}
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return kwargs  # the libraries' own default: nothing else to say
    kwargs["security_protocol"] = protocol
    if protocol.startswith("SASL_"):
        kwargs["sasl_mechanism"] = kafka.sasl_mechanism
        kwargs["sasl_plain_username"] = kafka.sasl_username
        kwargs["sasl_plain_password"] = sasl_password(kafka)
    if protocol in ("SSL", "SASL_SSL"):
        if library == "aiokafka":
            kwargs["ssl_context"] = ssl_context(kafka)
        else:
            _require_files(kafka)
            kwargs["ssl_check_hostname"] = kafka.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(kafka, name):
                    kwargs[name] = getattr(kafka, name)
    return kwargs


def producer_kwargs(kafka: KafkaSettings, library: Library = "kafka-python") -> dict[str, Any]:
    """A producer's connection arguments and its compression (kafka.compression): record
    batches are compressed by the producer, stored so by the broker and decompressed by each
    consumer, whatever its own settings say. Consumers and admin clients refuse the argument,
    so it is a producer's only."""
    kwargs = client_kwargs(kafka, library)
    codec = None if kafka.compression == "none" else kafka.compression
    if codec is not None:
        _require_codec(codec)
    kwargs["producer_compression_type" if library == "faust" else "compression_type"] = codec
    return kwargs


# the packages each client library needs for a codec (gzip is in the standard library)
_CODEC_PACKAGES = {"zstd": ("zstandard", "cramjam"), "lz4": ("lz4", "cramjam"),
                   "snappy": ("snappy", "cramjam")}  # fmt: skip


def missing_codec_packages(codec: str) -> list[str]:
    """The packages a codec needs that this Python lacks."""
    import importlib.util

    return [n for n in _CODEC_PACKAGES.get(codec, ()) if importlib.util.find_spec(n) is None]


def _require_codec(codec: str) -> None:
    """Fail at start, naming the setting and the package, rather than at the first send (or,
    worse, at a consumer that cannot read what this one wrote)."""
    missing = missing_codec_packages(codec)
    if missing:
        raise ConfigError(
            f"kafka.compression {codec!r} needs the Python package(s) {', '.join(missing)} "
            "(pip install them, or set kafka.compression to gzip or none)"
        )


def check_login(kafka: KafkaSettings, timeout_s: float = 15.0) -> None:
    """Fail fast, with a clear error, when the broker refuses our TLS or SASL login.

    The clients retry a refused login until their bootstrap timeout and then say only "unable
    to bootstrap"; one direct connection per bootstrap address says why at once. Returns when
    one address accepts the login; an address that does not answer at all is left to the
    clients (their errors already say "cannot reach"). Plaintext: nothing to check.
    """
    if kafka.security_protocol == "PLAINTEXT":
        return
    asyncio.run(_check_login(kafka, timeout_s))


async def _check_login(kafka: KafkaSettings, timeout_s: float) -> None:
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError as AioKafkaError

    kwargs = client_kwargs(kafka, "aiokafka")
    del kwargs["bootstrap_servers"]
    refused: FleetPulseError | None = None
    for address in (a.strip() for a in kafka.bootstrap.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host.strip("[]"), int(port), client_id=f"{kafka.client_id}-login",
                            request_timeout_ms=int(timeout_s * 1000), **kwargs),
                timeout_s,
            )
        except ssl.SSLError as exc:
            refused = FleetPulseError(
                f"Kafka TLS handshake with {describe(kafka, address)} failed: {exc.reason or exc}; "
                "check kafka.ssl_cafile (the CA that signed the broker certificate) and that "
                "the certificate names this host (kafka.ssl_check_hostname)"
            )
        except AioKafkaError as exc:
            if "auth" not in type(exc).__name__.lower():
                continue  # not a login refusal: the clients report it their way
            refused = FleetPulseError(
                f"Kafka refused the SASL login at {describe(kafka, address)}: {exc}; check "
                "kafka.sasl_username and kafka.sasl_password (or sasl_password_file)"
            )
        except (TimeoutError, OSError):
            continue  # not listening / not answering: the clients say "cannot reach"
        else:
            conn.close()
            return
    if refused is not None:
        raise refused


def until_connected(
    connect: Callable[[], T],
    kafka: KafkaSettings,
    what: str,
    stop: threading.Event | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> T | None:
    """`connect()` (which builds a kafka-python client), again and again while the broker
    cannot be reached; None when `stop` is set first. A process started while the broker is
    away waits for it instead of exiting. `on_wait(reason)` hears each failed attempt (for
    /readyz). Other errors (a refused login, bad settings) propagate at once."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    stop = stop or threading.Event()
    backoff = Backoff(WAIT_INITIAL_S, WAIT_MAX_S)
    while not stop.is_set():
        try:
            return connect()
        except (KafkaTimeoutError, KafkaConnectionError) as exc:
            delay = backoff.next_delay()
            reason = f"waiting for Kafka at {describe(kafka)}: {exc}"
            if on_wait is not None:
                on_wait(reason)
            log.warning("%s: %s; retrying in %.1f s", what, reason, delay)
            stop.wait(delay)
    return None


def partition_count(producer: Any) -> Callable[[str], int]:
    """How many partitions a topic has, as a kafka-python producer knows from the broker's
    metadata (it waits for it, as a send would): a batch of values is sent to the partition
    the producer's default partitioner gives each value's key (pipeline/wire/batches.py)."""
    counts: dict[str, int] = {}

    def count(topic: str) -> int:
        if topic not in counts:
            counts[topic] = len(producer.partitions_for(topic))
        return counts[topic]

    return count


def broker_urls(bootstrap: str) -> list[str]:
    """faust's broker list: `kafka://host:port` each (TLS/SASL come from the credentials)."""
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def describe(kafka: KafkaSettings, address: str = "") -> str:
    """How we connect, for error messages and start lines: listener, protocol, mechanism, user."""
    text = f"{address or kafka.bootstrap} ({kafka.security_protocol}"
    if kafka.security_protocol.startswith("SASL_"):
        text += f", {kafka.sasl_mechanism} as {kafka.sasl_username!r}"
    return text + ")"


def sasl_password(kafka: KafkaSettings) -> str:
    """The SASL password, from the setting or its file (trailing newline dropped)."""
    return load_secret(kafka.sasl_password, kafka.sasl_password_file, "kafka.sasl_password")


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: the CA file (or system CAs), optional client certificate,
    hostname verification as configured (on by default), certificates always verified."""
    _require_files(kafka)
    context = ssl.create_default_context(cafile=kafka.ssl_cafile or None)
    context.check_hostname = kafka.ssl_check_hostname
    if kafka.ssl_certfile:
        context.load_cert_chain(kafka.ssl_certfile, kafka.ssl_keyfile)
    return context


def _faust_security(kafka: KafkaSettings) -> dict[str, Any]:
    import faust  # only the worker needs faust; keep it out of the other commands' imports

    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return {}
    if protocol == "SSL":
        return {"broker_credentials": faust.SSLCredentials(ssl_context(kafka))}
    return {
        "broker_credentials": faust.SASLCredentials(
            username=kafka.sasl_username,
            password=sasl_password(kafka),
            mechanism=kafka.sasl_mechanism,
            # SASLCredentials says SASL_SSL exactly when it has a context
            ssl_context=ssl_context(kafka) if protocol == "SASL_SSL" else None,
        )
    }


def _require_files(kafka: KafkaSettings) -> None:
    # say which setting names a missing file, before a library says "No such file" or worse
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"kafka.{name} {path} does not exist or is not a file")
