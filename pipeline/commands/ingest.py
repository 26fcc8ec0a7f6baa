"""`fleetpulse ingest <source>`: one ingest adapter polling its endpoint into Kafka.

    fleetpulse ingest prometheus     DCGM metrics from Prometheus → fleet.telemetry.gpu
    fleetpulse ingest cloudmon       TPU chip metrics from Cloud Monitoring → fleet.telemetry.tpu,
                                     interruptions → fleet.events.capacity; which TPUs:
                                     FLEETPULSE_SOURCES__CLOUDMON_MODE = tpu-vm (tpu_worker,
                                     default; serve-sim --cloudmon-gke serves GKE too),
                                     gke (k8s_node/k8s_container accelerator metrics and
                                     node_pool/node interruption_count) or all; the worker
                                     inventory (sources.cloudmon_inventory) names the hosts
    fleetpulse ingest tpu-runtime    libtpu on this TPU host → fleet.telemetry.tpu / .ici
    fleetpulse ingest xid            NVRM Xid lines of the kernel log → fleet.events.xid
                                     (--log FILE, --journal-json FILE|-, or --kmsg [PATH]);
                                     a storm's repeats (same GPU, Xid and process within
                                     sources.xid_coalesce_s) go out as one record with their
                                     count; --once reads a --log file to its end
    fleetpulse ingest capacity       the cloud's capacity signals → fleet.events.capacity:
                                     GPU/TPU quota usage, limits, exceeded (Cloud Monitoring),
                                     TPU queued resources, stock-outs and node maintenance (TPU
                                     API), GPU instances' upcoming maintenance (Compute Engine),
                                     this host's maintenance-event / preempted (metadata
                                     server); TPU slices and GPU instances → fleet.inventory.
                                     Settings: the [capacity] section (feeds, project, zones,
                                     *_endpoint, metadata_url), e.g.
                                     FLEETPULSE_CAPACITY__FEEDS='["quota", "metadata"]'

Each poll reads from the last committed position (sources.state_dir/<source>.json), publishes
with acks=all, and only then commits; inputs that do not parse go to fleet.dlq. A failing
endpoint is retried with jittered exponential backoff (sources.backoff_*); with --once, a
poll that fails 3 times ends the command with an error. Settings: the [sources]
section, e.g. FLEETPULSE_SOURCES__PROMETHEUS_URL, FLEETPULSE_SOURCES__XID_LOG_PATH.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from pipeline.config import Settings
from pipeline.retry import Backoff
from pipeline.selfmetrics import Ready, serve_stats
from pipeline.sources.base import RETRYABLE, LoopStats, Publisher, Source, run_source

SOURCES = ("prometheus", "cloudmon", "tpu-runtime", "xid", "capacity")
# `--once` is a check run by a person or a script: a few tries, then an error and a non-zero
# exit, where the daemon retries for as long as the endpoint is down.
ONCE_ATTEMPTS = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="run an ingest adapter (prometheus, cloudmon, tpu-runtime, xid, capacity) into Kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", choices=SOURCES)
    parser.add_argument("--once", action="store_true", help="poll once, then exit")
    parser.add_argument("--max-polls", type=int, metavar="N", help="exit after N polls")
    parser.add_argument(
        "--stdout", action="store_true", help="print events as JSON lines instead of Kafka"
    )
    parser.add_argument("--log", type=Path, help="kernel log to tail (xid; default from config)")
    parser.add_argument(
        "--journal-json",
        metavar="FILE",
        help="xid: read `journalctl -k -o json [--follow]` records from FILE ('-' = stdin)",
    )
    parser.add_argument(
        "--kmsg",
        nargs="?",
        const="/dev/kmsg",
        metavar="PATH",
        help="xid: read kernel records from /dev/kmsg (or PATH)",
    )
    parser.set_defaults(handler=_run)


def build_source(
    name: str,
    settings: Settings,
    log_path: Path | None = None,
    *,
    journal_json: str | None = None,
    kmsg: str | None = None,
    once: bool = False,
) -> Source:
    config = settings.sources
    if name == "capacity":
        from pipeline.sources.capacity import CapacitySource

        return CapacitySource(settings.capacity, config, once=once)
    if name == "prometheus":
        from pipeline.sources.prometheus import PrometheusSource

        return PrometheusSource(config)
    if name == "cloudmon":
        from pipeline.sources.cloudmon import CloudMonitoringSource

        return CloudMonitoringSource(config)
    if name == "tpu-runtime":
        from pipeline.sources.tpu_runtime import TpuRuntimeSource

        return TpuRuntimeSource(config)
    if journal_json is not None:
        from pipeline.sources.xid_streams import JournalXidSource

        return JournalXidSource(config, path=journal_json, once=once)
    if kmsg is not None:
        from pipeline.sources.xid_streams import KmsgXidSource

        return KmsgXidSource(config, path=kmsg, once=once)
    from pipeline.sources.xid import XidSource

    return XidSource(config, path=log_path, once=once)


def _drain(source: Source, publisher: Publisher) -> None:
    """At a stop, send what the source still holds (the XID sources' storm windows). If that
    fails, nothing is lost: their checkpoint is before the held lines, read again at start."""
    drain = getattr(source, "drain", None)
    if drain is None:
        return
    batch = drain()
    if not batch.events:
        return  # nothing held: the checkpoint is where the last poll left it
    try:
        publisher.publish(source.name, batch.events, batch.bad)
    except RETRYABLE as exc:
        logging.getLogger(__name__).warning("%s: held records not sent (%s)", source.name, exc)
        return
    source.commit(batch.position)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    source = build_source(
        args.source,
        settings,
        args.log,
        journal_json=args.journal_json,
        kmsg=args.kmsg,
        once=args.once,
    )
    publisher: Publisher
    ready: Ready
    if args.stdout:
        from pipeline.sources.publish import StdoutPublisher

        publisher = StdoutPublisher()
        ready = lambda: (True, "writing to stdout")  # noqa: E731
    else:
        from pipeline.sources.publish import KafkaPublisher

        kafka = KafkaPublisher(settings.kafka, f"{settings.kafka.client_id}-{source.name}")
        publisher, ready = kafka, kafka.readiness
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = settings.sources
    stats = LoopStats()
    extra: list[object] = []
    if args.source == "capacity":  # its client libraries load only when it runs
        from pipeline.sources.capacity import CapacitySource

        extra += [source.stats] if isinstance(source, CapacitySource) else []
    serve_stats(f"ingest_{source.name}", stats, settings.metrics, ready, extra=extra)
    try:
        run_source(
            source,
            publisher,
            interval_s=(
                settings.capacity.poll_interval_s
                if args.source == "capacity"
                else config.poll_interval_s
            ),
            backoff=Backoff(config.backoff_initial_s, config.backoff_max_s),
            stop=stop,
            max_polls=1 if args.once else args.max_polls,
            stats=stats,
            max_failures=ONCE_ATTEMPTS if args.once else None,
        )
        _drain(source, publisher)
    finally:
        source.close()
        publisher.close()
    logging.getLogger(__name__).info(
        "%s: %d polls, %d events, %d dead letters, %d errors",
        source.name,
        stats.polls,
        stats.events,
        stats.bad,
        stats.errors,
    )
    return 0
