"""`fleetpulse alerts`: fleet.alerts → Alertmanager and webhooks; offsets commit after 2xx.

A batch of alert records is offered to every configured sink. The offsets are committed once
each sink has either answered 2xx or refused the payload for good (4xx: the alerts go to
fleet.dlq with the sink's answer). When a sink is unreachable or answers 5xx after its
retries, nothing is committed: the consumer seeks back to the batch and tries again after a
backoff, so an outage delays alerts but never drops them. Records that do not decode go to
fleet.dlq with their reason; null values (tombstones) are counted and skipped. Repeats of the
same alert within a batch are sent once.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests.auth

from pipeline import webhooks
from pipeline.codec import decode, encode
from pipeline.config import AlertSettings, HttpClientSettings, Settings, WebhookTarget
from pipeline.deadletter import dead_letter
from pipeline.errors import ConfigError, DecodeError
from pipeline.kafka_client import check_login, client_kwargs
from pipeline.model import Alert, DeadLetter
from pipeline.redact import load_secret, redact, redact_logs, remember
from pipeline.retry import Backoff
from pipeline.runtime.topics import topic_name
from pipeline.selfmetrics import Readiness, consumer_readiness, serve_stats
from pipeline.sinks.alertmanager import AlertmanagerSink
from pipeline.sinks.webhook import (
    BearerAuth,
    Delivered,
    DeliveryError,
    JsonPoster,
    Target,
    WebhookSink,
)

log = logging.getLogger(__name__)


class AlertSink(Protocol):
    name: str

    def deliver(self, alerts: Sequence[Alert]) -> Delivered: ...


@dataclass
class Outcome:
    """What became of one batch once every sink answered for good."""

    delivered: dict[str, int] = field(default_factory=dict)  # sink name -> alerts
    refused: list[tuple[str, DeliveryError]] = field(default_factory=list)


def unique_alerts(alerts: Sequence[Alert]) -> list[Alert]:
    """Drop repeats (a replayed record), keeping the first of each in order."""
    seen: set[tuple[str, str, str, str | None]] = set()
    out = []
    for alert in alerts:
        key = (alert.fingerprint, alert.status, alert.startsAt, alert.endsAt)
        if key not in seen:
            seen.add(key)
            out.append(alert)
    return out


def deliver_to_all(alerts: Sequence[Alert], sinks: Sequence[AlertSink]) -> Outcome:
    """Offer the alerts to every sink; raises DeliveryError when one may still succeed later."""
    outcome = Outcome()
    if not alerts:
        return outcome
    for sink in sinks:
        try:
            sink.deliver(alerts)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            outcome.refused.append((sink.name, exc))
        else:
            outcome.delivered[sink.name] = len(alerts)
    return outcome


def build_sinks(settings: Settings) -> list[AlertSink]:
    """The configured sinks, their credentials read (from the settings or their files) and
    remembered by pipeline.redact, so no log line or dead letter can show them."""
    alerts = settings.alerts
    redact_logs("urllib3.connectionpool")  # logs each request line, tokens and all, at DEBUG
    poster = JsonPoster(
        timeout_s=alerts.timeout_s,
        max_attempts=alerts.max_attempts,
        backoff_initial_s=alerts.backoff_initial_s,
        backoff_max_s=alerts.backoff_max_s,
    )
    sign = _signing(alerts)
    targets = [WebhookTarget(url=url) for url in alerts.webhook_urls] + list(alerts.webhooks)
    sinks: list[AlertSink] = [
        WebhookSink(_target(target.url, target, f"alerts.webhooks[{i}]"), poster, sign)
        for i, target in enumerate(targets)
    ]
    if alerts.alertmanager_url:
        am = _target(alerts.alertmanager_url, alerts.alertmanager_http, "alerts.alertmanager_http")
        sinks.append(AlertmanagerSink(am, poster))
    if not sinks:
        raise ConfigError("no alert sink: set alerts.alertmanager_url or alerts.webhook_urls")
    return sinks


def _signing(alerts: AlertSettings) -> Callable[[str, bytes], dict[str, str]] | None:
    secret = load_secret(
        alerts.webhook_secret, alerts.webhook_secret_file, "alerts.webhook_secret"
    )
    if not secret:
        log.warning("alerts: webhooks are not signed (set alerts.webhook_secret_file)")
        return None
    try:
        key = webhooks.signer(secret)
    except ValueError as exc:
        raise ConfigError(f"alerts.webhook_secret: {exc}") from None
    return lambda msg_id, body: webhooks.sign_headers(msg_id, body, key)


def _target(url: str, http: HttpClientSettings, setting: str) -> Target:
    auth: requests.auth.AuthBase | None = None
    token = load_secret(http.bearer_token, http.bearer_token_file, f"{setting}.bearer_token")
    password = load_secret(
        http.basic_password, http.basic_password_file, f"{setting}.basic_password"
    )
    if token:
        auth = BearerAuth(token)
    elif http.basic_username or password:
        auth = requests.auth.HTTPBasicAuth(http.basic_username, password)
    parts = urllib.parse.urlsplit(url)
    remember(*(value for value in (parts.password, parts.username) if value))
    verify: bool | str = http.tls_ca_file or True
    if http.tls_insecure_skip_verify:
        log.warning("alerts: TLS certificate of %s is not checked (%s)", redact(url), setting)
        verify = False
    return Target(url, auth=auth, verify=verify)


@dataclass
class RunStats:
    batches: int = 0
    alerts: int = 0
    dead_letters: int = 0
    tombstones: int = 0  # null values: nothing to deliver, not an error
    retries: int = 0


def run_alerts(
    settings: Settings,
    sinks: Sequence[AlertSink],
    *,
    stop: threading.Event | None = None,
    idle_exit_s: float | None = None,
    max_records: int = 500,
    sleep: Callable[[float], Any] | None = None,
    stats: RunStats | None = None,
    readiness: Readiness | None = None,
) -> RunStats:
    """Consume fleet.alerts until `stop` is set (or nothing arrived for `idle_exit_s`)."""
    from kafka import KafkaConsumer, KafkaProducer

    stop = stop or threading.Event()
    wait = sleep or stop.wait
    kafka = settings.kafka
    topic = topic_name(kafka, "alerts")
    check_login(kafka)  # a refused login fails here, clearly, not after a bootstrap timeout
    consumer = KafkaConsumer(
        topic,
        **client_kwargs(kafka),
        client_id=f"{kafka.client_id}-alerts",
        group_id=settings.alerts.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = KafkaProducer(**client_kwargs(kafka), acks="all")
    backoff = Backoff(settings.alerts.backoff_initial_s, settings.alerts.backoff_max_s)
    stats = RunStats() if stats is None else stats
    if readiness is not None:  # /readyz asks the consumer from the HTTP thread
        readiness.check = lambda: consumer_readiness(consumer, settings.alerts.group_id)
    idle_since = time.monotonic()
    try:
        while not stop.is_set():
            polled = consumer.poll(timeout_ms=500, max_records=max_records)
            records = [record for batch in polled.values() for record in batch]
            if not records:
                if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    break
                continue
            idle_since = time.monotonic()
            if _handle(records, sinks, producer, settings, stats):
                consumer.commit()
                backoff.reset()
                stats.batches += 1
            else:
                for partition, offset in _first_offsets(records).items():
                    consumer.seek(partition, offset)  # the whole batch comes again
                stats.retries += 1
                wait(backoff.next_delay())
    finally:
        consumer.close(autocommit=False)
        producer.close(timeout=10)
    return stats


def _handle(
    records: list[Any],
    sinks: Sequence[AlertSink],
    producer: Any,
    settings: Settings,
    stats: RunStats,
) -> bool:
    alerts: list[Alert] = []
    dead: list[DeadLetter] = []
    tombstones = 0
    now_ms = int(time.time() * 1000)
    limit = settings.kafka.max_value_bytes
    decoded: set[tuple[str, int, int]] = set()  # the records that are alerts
    for record in records:
        try:
            alerts.append(decode(record.value, Alert, limit))
        except DecodeError as exc:
            if exc.reason == "tombstone":
                tombstones += 1
            else:
                dead.append(_dead_letter(record, str(exc), exc.reason, now_ms))
        else:
            decoded.add((record.topic, record.partition, record.offset))
    batch = unique_alerts(alerts)
    try:
        outcome = deliver_to_all(batch, sinks)
    except DeliveryError as exc:
        log.warning("alerts not delivered, will retry: %s", redact(str(exc)))
        return False
    for name, error in outcome.refused:
        log.error("%s refused %d alerts: %s", name, len(batch), redact(str(error)))
        dead += [
            _dead_letter(r, f"{name}: {error}", "refused", now_ms)
            for r in records
            if (r.topic, r.partition, r.offset) in decoded
        ]
    dlq = topic_name(settings.kafka, "dlq")
    for letter in dead:
        producer.send(dlq, value=encode(letter)).get(timeout=30)
    stats.alerts += len(batch)
    stats.dead_letters += len(dead)
    stats.tombstones += tombstones
    return True


def _dead_letter(record: Any, error: str, reason: str, now_ms: int) -> DeadLetter:
    return dead_letter(
        ts_ms=now_ms,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        raw=record.value,
        error=error,
        reason=reason,
    )


def _first_offsets(records: list[Any]) -> dict[Any, int]:
    from kafka import TopicPartition

    firsts: dict[Any, int] = {}
    for record in records:
        partition = TopicPartition(record.topic, record.partition)
        firsts[partition] = min(firsts.get(partition, record.offset), record.offset)
    return firsts


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "alerts",
        help="deliver fleet.alerts to Alertmanager and webhooks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--idle-exit",
        type=float,
        metavar="SECONDS",
        help="stop after this long without a new alert (default: run until interrupted)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    sinks = build_sinks(settings)
    stats, readiness = RunStats(), Readiness()
    serve_stats("alerts", stats, settings.metrics, readiness)
    run_alerts(settings, sinks, idle_exit_s=args.idle_exit, stats=stats, readiness=readiness)
    print(
        f"alerts: {stats.alerts} delivered in {stats.batches} batches, "
        f"{stats.dead_letters} dead letters, {stats.tombstones} tombstones skipped, "
        f"{stats.retries} retried batches"
    )
    return 0
