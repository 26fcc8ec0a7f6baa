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
from collections.abc import Callable
from typing import Any, TextIO, cast

import faust
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from pipeline.config import Settings
from pipeline.errors import FleetPulseError
from pipeline.wire.group_topics import group_topics
from pipeline.wire.kafka import STAY_CONNECTED, check_login, client_kwargs, until_connected
from pipeline.wire.topics import TOPICS, topic_name
from streams.agents import HEALTH_TOPICS, INVENTORY, TELEMETRY_TOPICS
from streams.app import LAG_INTERVAL_S, app_id, create_app
from streams.context import CATCHING_UP, INTERNAL_TOPICS, Context
from streams.metrics import WorkerMetrics, serve

log = logging.getLogger("fleetpulse.worker")
LAG_SILENT_S = 5 * LAG_INTERVAL_S  # no lag measure this long: not ready
TOPIC_METADATA_S = 30.0  # new topics without a leader this long after creation: an error
INPUTS = (*TELEMETRY_TOPICS, *HEALTH_TOPICS, "events.capacity", INVENTORY, "events.policy")


def prepare_topics(
    settings: Settings, on_wait: Callable[[str], None] | None = None
) -> list[str]:
    """Fail early when a FleetPulse topic is missing or its partition count is not the
    configured one (co-partitioned topics must agree); create the app's internal topics and
    its tables' changelogs where `fleetpulse topics create` has not.
    A broker that is away is waited for (`on_wait` hears why), not an exit."""
    k = settings.kafka
    check_login(k)  # a refused TLS / SASL login: a clear error now, not a timeout
    try:
        admin = until_connected(
            lambda: KafkaAdminClient(
                **client_kwargs(k), **STAY_CONNECTED, client_id=f"{k.client_id}-worker-admin"
            ),
            k, "worker", on_wait=on_wait,
        )
    except KafkaError as exc:
        raise FleetPulseError(f"cannot reach Kafka at {k.bootstrap}: {exc}") from exc
    assert admin is not None  # without a stop event it returns only once connected
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
        # the group's internal topics and table changelogs: made here, before faust starts,
        # so that they are in every member's first metadata (faust would declare the
        # changelogs itself, racing the group's first assignment: group_topics.py)
        group = group_topics(k, app_id(settings))
        wrong = [f"{t.name} has {counts[t.name]} partitions, wants {t.partitions}"
                 for t in group if t.name in counts and counts[t.name] != t.partitions]
        if wrong:
            raise FleetPulseError(
                "internal topics of an older release: " + "; ".join(wrong)
                + " (delete them, or set worker.group_id to start a new group)"
            )
        missing = [t for t in group if t.name not in counts]
        if missing:
            # another worker of the group may have been first
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(t.name, t.partitions, k.replication, topic_configs=t.configs)
                     for t in missing]
                )
            _wait_led(admin, {t.name: t.partitions for t in missing})
        return [f"{app_id(settings)}-{name}" for name in INTERNAL_TOPICS]
    finally:
        admin.close()


def _wait_led(admin: KafkaAdminClient, wanted: dict[str, int]) -> None:
    """Until the broker's metadata has every topic of `wanted` with a leader for each of its
    partitions: the controller accepts a topic before the brokers serve it, and a faust
    client whose first metadata lacks a topic is where the race began."""
    deadline = time.monotonic() + TOPIC_METADATA_S
    while True:
        described = admin.describe_topics(list(wanted))
        led = {
            t["name"] for t in described
            if t["error_code"] == 0 and len(t["partitions"]) == wanted[t["name"]]
            and all(p["leader_id"] >= 0 for p in t["partitions"])
        }
        if led == set(wanted):
            return
        if time.monotonic() > deadline:
            raise FleetPulseError(
                f"topics created but not served after {TOPIC_METADATA_S:g} s: "
                + ", ".join(sorted(set(wanted) - led))
            )
        time.sleep(0.2)


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
        self.waiting = "waiting for the group to assign partitions"

    def wait(self, reason: str) -> None:
        """Say why we are not ready yet (the broker is away at start)."""
        self.waiting = reason

    def __call__(self) -> tuple[bool, str]:
        assigned_at, ctx = self.assigned_at, self.ctx
        if assigned_at is None:
            return False, self.waiting
        if ctx.backlog_at < assigned_at:
            return False, "measuring the lag of the new assignment"
        silent = time.monotonic() - ctx.backlog_at
        if silent > LAG_SILENT_S:
            # the lag timer asks the broker every LAG_INTERVAL_S: an old measure means the
            # broker does not answer (the group stays "assigned" through a long outage)
            return False, f"lag not measured for {silent:.0f} s: Kafka does not answer"
        behind = sorted((tp, n) for tp, n in ctx.backlog.items() if n > CATCHING_UP)
        if behind:
            shown = " ".join(f"{t}[{p}]={n}" for (t, p), n in behind[:5])
            return False, f"catching up: {shown}"
        return True, f"assigned {len(ctx.backlog)} source partitions, caught up"


def run(settings: Settings, loglevel: str = "warning", out: TextIO = sys.stdout) -> int:
    metrics = WorkerMetrics()
    ctx = create_app(settings, metrics)
    readiness = WorkerReadiness(ctx)
    # /readyz first: while the broker is away at start it says so (not ready)
    host, port = serve(metrics, settings.metrics, readiness)
    inputs = ", ".join(topic_name(settings.kafka, suffix) for suffix in INPUTS)
    print(
        f"fleetpulse worker: broker={settings.kafka.bootstrap} group={app_id(settings)} "
        f"partitions={settings.kafka.partitions} store={settings.worker.store} "
        f"metrics=http://{host}:{port}/metrics\n"
        f"  inputs: {inputs}",
        file=out,
        flush=True,
    )
    internal = prepare_topics(settings, readiness.wait)
    readiness.wait("waiting for the group to assign partitions")
    print(f"  internal: {', '.join(internal)}", file=out, flush=True)

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
