"""`fleetpulse alerts`: fleet.alerts → Alertmanager and webhooks; offsets commit after 2xx.

The Kafka side is the edge runner (pipeline/edge.py). A batch of alert records is offered to
every configured sink. The offsets are committed once each sink has either answered 2xx or
refused the payload for good (4xx: the alerts go to fleet.dlq with the sink's answer). When a
sink is unreachable or answers 5xx after its retries, nothing is committed: the partitions are
paused and the same batch is offered again after a backoff of at most a few seconds, so an
outage delays alerts but never drops them. Records that do not decode go to
fleet.dlq with their reason; null values (tombstones) are counted and skipped. Repeats of the
same alert within a batch are sent once.
"""

from __future__ import annotations

import argparse
import logging
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests.auth

from pipeline import webhooks
from pipeline.codec import decode
from pipeline.config import AlertSettings, HttpClientSettings, Settings, WebhookTarget
from pipeline.edge import EdgeOptions, EdgeStats, Rejected, run_edge, stop_on_signals
from pipeline.errors import ConfigError, DecodeError, SinkError
from pipeline.model import Alert
from pipeline.redact import load_secret, redact, redact_logs, remember
from pipeline.runtime.topics import topic_name
from pipeline.selfmetrics import Readiness, serve_stats
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
class AlertStats:
    """The alert sink's own counters (the edge counts records, dead letters, flushes)."""

    alerts: int = 0  # delivered (or refused for good), repeats within a batch sent once
    tombstones: int = 0  # null values: nothing to deliver, not an error


@dataclass
class RunStats:
    """What one run did, for the summary line and for tests."""

    batches: int = 0
    alerts: int = 0
    dead_letters: int = 0
    tombstones: int = 0
    retries: int = 0


class AlertDelivery:
    """fleet.alerts as an EdgeSink: `add` decodes, `flush` offers the batch to every sink.

    A sink that is away (or answers 5xx after its retries) makes the flush fail: nothing is
    committed and the edge retries the same batch. A sink that refuses for good (4xx) makes
    its alerts dead letters, with its answer."""

    def __init__(self, settings: Settings, sinks: Sequence[AlertSink], stats: AlertStats) -> None:
        self.sinks, self.stats = sinks, stats
        self.limit = settings.kafka.max_value_bytes
        self._held: list[tuple[Any, Alert]] = []

    def add(self, record: Any) -> None:
        try:
            alert = decode(record.value, Alert, self.limit)
        except DecodeError as exc:
            if exc.reason != "tombstone":
                raise
            self.stats.tombstones += 1
            return
        self._held.append((record, alert))

    def flush(self) -> list[Rejected]:
        batch = unique_alerts([alert for _, alert in self._held])
        try:
            outcome = deliver_to_all(batch, self.sinks)
        except DeliveryError as exc:
            raise SinkError(f"alerts not delivered, will retry: {redact(str(exc))}",
                            reason="delivery") from exc
        rejected = []
        for name, error in outcome.refused:
            log.error("%s refused %d alerts: %s", name, len(batch), redact(str(error)))
            rejected += [Rejected(record, "refused", f"{name}: {error}")
                         for record, _ in self._held]
        self.stats.alerts += len(batch)
        self._held = []
        return rejected

    def discard(self) -> None:
        self._held = []


def run_alerts(
    settings: Settings,
    sinks: Sequence[AlertSink],
    *,
    stop: threading.Event | None = None,
    idle_exit_s: float | None = None,
    max_records: int = 500,
    stats: EdgeStats | None = None,
    alert_stats: AlertStats | None = None,
    readiness: Readiness | None = None,
) -> RunStats:
    """Consume fleet.alerts until `stop` is set (or nothing arrived for `idle_exit_s`)."""
    edge_stats = EdgeStats() if stats is None else stats
    alert_stats = AlertStats() if alert_stats is None else alert_stats
    # alerts go out as soon as they are read; a failed delivery is retried within seconds
    options = EdgeOptions(max_records=max_records, max_interval_s=0.0,
                          retry_initial_s=settings.alerts.backoff_initial_s,
                          retry_max_s=min(settings.alerts.backoff_max_s, 2.0),
                          session_timeout_s=settings.alerts.session_timeout_s,
                          idle_exit_s=idle_exit_s)

    def started(edge: Any) -> None:
        if readiness is not None:  # /readyz asks the edge from the HTTP thread
            readiness.check = edge.readiness

    run_edge(settings, name="alerts", topics=[topic_name(settings.kafka, "alerts")],
             group_id=settings.alerts.group_id, sink=AlertDelivery(settings, sinks, alert_stats),
             stop=stop or threading.Event(), options=options, stats=edge_stats,
             on_start=started)
    return RunStats(
        batches=edge_stats.flushes,
        alerts=alert_stats.alerts,
        dead_letters=edge_stats.dead_lettered,
        tombstones=alert_stats.tombstones,
        retries=sum(edge_stats.flush_errors.values()),
    )


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
    # as `sink lake` and `ingest`: say where /readyz is, and why the broker cannot be reached
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sinks = build_sinks(settings)
    edge_stats, alert_stats, readiness = EdgeStats(), AlertStats(), Readiness()
    serve_stats("alerts", edge_stats, settings.metrics, readiness, extra=[alert_stats])
    stop = threading.Event()
    stop_on_signals(stop)
    stats = run_alerts(settings, sinks, stop=stop, idle_exit_s=args.idle_exit, stats=edge_stats,
                       alert_stats=alert_stats, readiness=readiness)
    print(
        f"alerts: {stats.alerts} delivered in {stats.batches} batches, "
        f"{stats.dead_letters} dead letters, {stats.tombstones} tombstones skipped, "
        f"{stats.retries} retried batches"
    )
    return 0
