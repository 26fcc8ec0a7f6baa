"""Run the faust app as a long-lived worker: check topics, serve /metrics, run until SIGTERM.

faust's Worker (mode) installs the SIGTERM/SIGINT handlers: the agents stop, the last acked
offsets are committed, the producer is flushed and the consumer leaves its group, so another
worker takes the partitions over without waiting for a session timeout.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, TextIO, cast

import faust
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from pipeline.config import Settings
from pipeline.errors import FleetPulseError
from pipeline.kafka_client import check_login, client_kwargs
from pipeline.runtime.topics import TOPICS, topic_name
from streams.agents import HEALTH_TOPICS, INVENTORY, TELEMETRY_TOPICS
from streams.app import app_id, create_app
from streams.context import CATCHING_UP, INTERNAL_TOPICS, POLICY_INPUT, Context
from streams.metrics import WorkerMetrics, serve

log = logging.getLogger("fleetpulse.worker")
INPUTS = (*TELEMETRY_TOPICS, *HEALTH_TOPICS, "events.capacity", INVENTORY, "events.policy")


def prepare_topics(settings: Settings) -> list[str]:
    """Fail early when a FleetPulse topic is missing or its partition count is not the
    configured one (co-partitioned topics must agree); create the app's internal topics."""
    k = settings.kafka
    check_login(k)  # a refused TLS / SASL login: a clear error now, not a timeout
    try:
        admin = KafkaAdminClient(
            **client_kwargs(k), client_id=f"{k.client_id}-worker-admin"
        )
    except KafkaError as exc:
        raise FleetPulseError(f"cannot reach Kafka at {k.bootstrap}: {exc}") from exc
    try:
        counts = {t["name"]: len(t["partitions"]) for t in admin.describe_topics()}
        problems = []
        for spec in TOPICS:
            name = topic_name(k, spec.suffix)
            if name not in counts:
                problems.append(f"{name} does not exist")
            elif counts[name] != spec.partitions(k) and spec.suffix in INPUTS:
                problems.append(
                    f"{name} has {counts[name]} partitions, wants {spec.partitions(k)}"
                )
        if problems:
            raise FleetPulseError(
                "topics not ready: " + "; ".join(problems) + " (run `fleetpulse topics create`)"
            )
        wanted = {
            f"{app_id(settings)}-{name}": 1 if name == POLICY_INPUT else k.partitions
            for name in INTERNAL_TOPICS
        }
        missing = [name for name in wanted if name not in counts]
        wrong = [f"{n} has {counts[n]} partitions, wants {p}" for n, p in wanted.items()
                 if n in counts and counts[n] != p]
        if wrong:
            raise FleetPulseError(
                "internal topics of an older release: " + "; ".join(wrong)
                + " (delete them, or set worker.group_id to start a new group)"
            )
        if missing:
            # another worker of the group may have been first
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(name, wanted[name], k.replication) for name in missing]
                )
        return list(wanted)
    finally:
        admin.close()


def describe_assignment(app: faust.App, sources: set[str]) -> str:
    """`topic=0,2 topic=1` over the source topics (changelogs left out): one line that says
    which partitions — which nodes, slices, pools and zones — this worker now owns."""
    owned: dict[str, list[int]] = {}
    for tp in app.consumer.assignment():
        if tp.topic in sources:
            owned.setdefault(tp.topic, []).append(tp.partition)
    if not owned:
        return "nothing"
    return " ".join(f"{t}={','.join(map(str, sorted(p)))}" for t, p in sorted(owned.items()))


class WorkerReadiness:
    """/readyz of the worker: the group assigned its partitions (possibly none, when there are
    more workers than partitions) and the lag timer, measuring after that, finds no source
    partition more than CATCHING_UP records behind. A rebalance makes it not ready again
    until the new assignment is caught up. Read from the HTTP thread; written by the app's
    event loop, which only ever replaces the values."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.assigned_at: float | None = None

    def __call__(self) -> tuple[bool, str]:
        assigned_at, ctx = self.assigned_at, self.ctx
        if assigned_at is None:
            return False, "waiting for the group to assign partitions"
        if ctx.backlog_at < assigned_at:
            return False, "measuring the lag of the new assignment"
        behind = sorted((tp, n) for tp, n in ctx.backlog.items() if n > CATCHING_UP)
        if behind:
            shown = " ".join(f"{t}[{p}]={n}" for (t, p), n in behind[:5])
            return False, f"catching up: {shown}"
        return True, f"assigned {len(ctx.backlog)} source partitions, caught up"


def run(settings: Settings, loglevel: str = "warning", out: TextIO = sys.stdout) -> int:
    internal = prepare_topics(settings)
    metrics = WorkerMetrics()
    ctx = create_app(settings, metrics)
    readiness = WorkerReadiness(ctx)
    host, port = serve(metrics, settings.metrics, readiness)
    inputs = ", ".join(topic_name(settings.kafka, suffix) for suffix in INPUTS)
    print(
        f"fleetpulse worker: broker={settings.kafka.bootstrap} group={app_id(settings)} "
        f"partitions={settings.kafka.partitions} store={settings.worker.store} "
        f"metrics=http://{host}:{port}/metrics\n"
        f"  inputs: {inputs}\n  internal: {', '.join(internal)}",
        file=out,
        flush=True,
    )

    async def on_assigned(app: faust.App, **kwargs: object) -> None:
        readiness.assigned_at = time.monotonic()
        print(
            f"fleetpulse worker: assigned {describe_assignment(app, sources)}", file=out, flush=True
        )

    async def on_revoked(app: faust.App, *args: object, **kwargs: object) -> None:
        readiness.assigned_at = None  # a rebalance: not ready until reassigned and caught up

    ctx.app.on_rebalance_complete.connect(cast(Any, on_assigned))
    ctx.app.on_partitions_revoked.connect(cast(Any, on_revoked))

    sources = {ctx.name(suffix) for suffix in INPUTS} | set(internal)
    worker = faust.Worker(ctx.app, loglevel=loglevel.upper(), quiet=True, stdout=out)
    worker.spinner = None  # terminal escapes would garble logs and our one-line reports
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    print(f"fleetpulse worker: stopped (exit {code})", file=out, flush=True)
    return code
