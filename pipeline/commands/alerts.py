"""`fleetpulse alerts`: fleet.alerts → Alertmanager and webhooks; offsets commit after 2xx.

The Kafka side is the edge runner (pipeline/wire/edge.py); the delivery is pipeline/sinks/
alert_targets.py: every configured target has its own queue and thread, so one that is slow,
away or answering 5xx never delays the others, and each POST ends by its deadline
(alerts.timeout_s, the whole request, however slowly a receiver answers). A target that fails
is retried with backoff until it delivers; one that refuses for good (4xx, 3xx) makes its
alerts dead letters on fleet.dlq, with its answer. Offsets commit up to the oldest alert some
target still holds, so a restart replays what any target had not delivered (the others get
repeats, with the same fingerprints and webhook-id); past alerts.target_queue_max waiting
alerts a stalled target's oldest go to fleet.dlq (reason target_stalled) and the commit moves
on. /readyz is not ready while a target is stalled (its oldest alert waiting longer than
alerts.stalled_after_s), naming it; /metrics has fleetpulse_alerts_target_stalled{target}.
Records that do not decode go to fleet.dlq with their reason; null values (tombstones) are
counted and skipped. Repeats of the same alert within a batch are sent once.
"""

from __future__ import annotations

import argparse
import logging
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import requests.auth

from pipeline.config import HttpClientSettings, Settings, WebhookTarget
from pipeline.errors import ConfigError
from pipeline.redact import load_secret, redact, redact_logs, remember
from pipeline.selfmetrics import Readiness, serve_stats
from pipeline.sinks import signing as webhooks
from pipeline.sinks.alert_targets import AlertDelivery, AlertSink, AlertStats
from pipeline.sinks.alertmanager import AlertmanagerSink
from pipeline.sinks.webhook import BearerAuth, JsonPoster, Target, WebhookSink
from pipeline.wire.edge import EdgeOptions, EdgeStats, run_edge, stop_on_signals
from pipeline.wire.topics import topic_name

log = logging.getLogger(__name__)

Signer = Callable[[str, bytes], dict[str, str]]


def build_sinks(settings: Settings) -> list[AlertSink]:
    """The configured sinks, their credentials read (from the settings or their files) and
    remembered by pipeline.redact, so no log line or dead letter can show them. Each has a
    poster (and HTTP session) of its own: each is delivered from its own thread."""
    alerts = settings.alerts
    redact_logs("urllib3.connectionpool")  # logs each request line, tokens and all, at DEBUG

    def poster() -> JsonPoster:
        return JsonPoster(timeout_s=alerts.timeout_s, max_attempts=alerts.max_attempts,
                          backoff_initial_s=alerts.backoff_initial_s,
                          backoff_max_s=alerts.backoff_max_s)

    shared = _signing(alerts.webhook_secret, alerts.webhook_secret_file, "alerts.webhook_secret")
    targets = [WebhookTarget(url=url) for url in alerts.webhook_urls] + list(alerts.webhooks)
    sinks: list[AlertSink] = []
    for i, target in enumerate(targets):
        setting = f"alerts.webhooks[{i}]"
        own = _signing("", target.secret_file, f"{setting}.secret") if target.secret_file else None
        sinks.append(WebhookSink(_target(target.url, target, setting), poster(), own or shared))
    if not (shared or all(t.secret_file for t in targets)):
        log.warning("alerts: webhooks are not signed (set alerts.webhook_secret_file)")
    if alerts.alertmanager_url:
        am = _target(alerts.alertmanager_url, alerts.alertmanager_http, "alerts.alertmanager_http")
        sinks.append(AlertmanagerSink(am, poster()))
    if not sinks:
        raise ConfigError("no alert sink: set alerts.alertmanager_url or alerts.webhook_urls")
    return sinks


def _signing(value: str, path: str, setting: str) -> Signer | None:
    """The webhook-* headers of one key (from `value` or the file `path`); None without."""
    secret = load_secret(value, path, setting)
    if not secret:
        return None
    try:
        key = webhooks.signer(secret)
    except ValueError as exc:
        raise ConfigError(f"{setting}{'_file ' + path if path else ''}: {exc}") from None
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
    """What one run did, for the summary line and for tests."""

    batches: int = 0  # offset commits
    alerts: int = 0  # records settled at every target
    dead_letters: int = 0
    tombstones: int = 0
    retries: int = 0  # deliveries that failed and were tried again


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

    delivery = AlertDelivery(settings.alerts, settings.kafka.max_value_bytes, sinks,
                             alert_stats)

    def started(edge: Any) -> None:
        if readiness is not None:  # /readyz asks the edge and the targets from the HTTP thread
            readiness.check = lambda: _both(edge.readiness(), delivery.readiness())

    try:
        run_edge(settings, name="alerts", topics=[topic_name(settings.kafka, "alerts")],
                 group_id=settings.alerts.group_id, sink=delivery,
                 stop=stop or threading.Event(), options=options, stats=edge_stats,
                 on_start=started)
    finally:
        delivery.close()
    return RunStats(
        batches=edge_stats.flushes,
        alerts=alert_stats.alerts,
        dead_letters=edge_stats.dead_lettered,
        tombstones=alert_stats.tombstones,
        retries=sum(alert_stats.target_failures.values()),
    )


def _both(edge: tuple[bool, str], targets: tuple[bool, str]) -> tuple[bool, str]:
    """Ready when the edge and every target are; the reasons of what is not."""
    failing = [why for ok, why in (edge, targets) if not ok]
    return (False, "; ".join(failing)) if failing else (True, f"{edge[1]}; {targets[1]}")


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
