"""The faust App, built from Settings: topics, tables, agents and the worker's timers.

- Every topic is read and written as raw bytes; pipeline.wire.codec decodes, so bad input is ours.
- Tables are keyed by bytes and hold msgpack state (stages.base.encode_state), one per stage:
  telemetry (node or slice), health (target), zones (zone), policy (pool). Each is backed by a
  compacted changelog topic `<app id>-<table>-changelog` with the source topics' partition
  count, and `standby_replicas` warm copies on other workers. The changelogs are created
  before the app starts (pipeline/wire/group_topics.py), not by faust.
- at_least_once; no Kafka transactions (faust's exactly-once has open bugs). Offsets are
  committed every `commit_interval_s`, and only past records whose outputs were acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any, cast

import faust
from aiokafka.errors import KafkaError as AioKafkaError

from pipeline.config import Settings
from pipeline.wire import batches
from pipeline.wire.group_topics import group_name, table_partitions
from pipeline.wire.internal import TABLES
from pipeline.wire.kafka import producer_kwargs
from streams import agents
from streams.acks import Settler
from streams.clock import Family, PartitionClocks
from streams.context import Context, declare_topics
from streams.metrics import WorkerMetrics
from streams.tables import FencedTable

log = logging.getLogger("fleetpulse.worker")
LAG_INTERVAL_S = 2.0  # consumer lag gauge, and quiet partitions catching up with event time


def app_id(settings: Settings) -> str:
    return group_name(settings.kafka, settings.worker.group_id)


def create_app(settings: Settings, metrics: WorkerMetrics | None = None) -> Context:
    w, k = settings.worker, settings.kafka
    Path(w.datadir).mkdir(parents=True, exist_ok=True)  # faust makes only the last level
    app = faust.App(
        app_id(settings),
        # broker URLs, broker_credentials (TLS / SASL) and the producer's compression
        **producer_kwargs(k, "faust"),
        broker_client_id=f"{k.client_id}-worker",
        store=w.store,
        datadir=str(Path(w.datadir) / app_id(settings)),
        topic_partitions=k.partitions,
        topic_replication_factor=k.replication,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=w.commit_interval_s,
        broker_session_timeout=w.session_timeout_s,
        broker_heartbeat_interval=w.heartbeat_interval_s,
        broker_rebalance_timeout=max(30.0, 3 * w.session_timeout_s),
        producer_acks=-1,
        producer_request_timeout=w.send_give_up_s,
        # the settler waits for whole batches anyway: let them fill. A node's state is ~10 kB
        # and faust's default 16 kB batch would make every changelog write its own request.
        producer_linger_ms=5,
        producer_max_batch_size=1024 * 1024,
        table_standby_replicas=w.standby_replicas,
        web_enabled=False,
    )
    # faust warns at every record once 100 sends wait in its buffer; the settler awaits each
    # batch, which bounds the buffer at about ack_batch records' outputs anyway
    app.producer.buffer.max_messages = max(1000, 4 * w.ack_batch)
    metrics = metrics or WorkerMetrics()
    settler = Settler(metrics, w.ack_batch)
    ctx = Context(settings=settings, app=app, metrics=metrics, settler=settler)
    ctx.clocks = PartitionClocks(settings.clock)
    settler.flush = ctx.flush
    ctx.topics, ctx.value_types = declare_topics(app, settings)
    ctx.producer_batched = frozenset(ctx.name(t) for t in batches.PRODUCER_BATCHED)
    for name in TABLES:
        # fenced by the group's generation: a worker cut off past its session cannot fork a
        # key's state with its late writes (tables.py)
        ctx.tables[name] = app.tables.add(FencedTable(
            app,
            name=name,
            default=None,
            beacon=app.tables.beacon,
            key_type=bytes,  # faust picks the changelog's serializers from these: raw
            value_type=bytes,
            # the policy stage is one partition: every removal in the fleet in one order
            partitions=table_partitions(k, name),
            on_changelog_event=_recovered_key(ctx) if name == "telemetry" else None,
            help=f"FleetPulse {name} state per key (msgpack)",
        ))
    agents.register(ctx)
    _add_timers(ctx)
    return ctx


def _recovered_key(ctx: Context) -> Any:
    async def on_changelog_event(event: faust.EventT[Any]) -> None:
        # the staleness clock must know the keys a worker recovers, not only those it sees
        if event.message.value is not None and event.message.key is not None:
            ctx.clocks.add_key(event.message.partition, event.message.key, None)

    return on_changelog_event


def _add_timers(ctx: Context) -> None:
    app = ctx.app

    def release_held() -> None:
        for stage in ctx.stages:
            stage.release()

    async def start_settling() -> None:
        ctx.settler.start(ctx.settings.worker.ack_interval_ms / 1000, release_held)

    async def stop_settling(app: faust.App, **kwargs: Any) -> None:
        await ctx.settler.close()

    async def lag() -> None:
        try:
            backlog = await _backlog(ctx)
        except (AioKafkaError, TimeoutError) as exc:
            # the broker is away: measure again next time. Raised out of a faust timer, this
            # crashed the whole app when an outage outlasted the consumer's request timeout
            log.warning("lag not measured, the broker does not answer: %r", exc)
            return
        ctx.backlog, ctx.backlog_at = backlog, time.monotonic()
        for (topic, partition), behind in backlog.items():
            ctx.metrics.lag.labels(topic, str(partition)).set(behind)
        _memory_gauges(ctx)
        _catch_up_quiet_partitions(ctx, backlog)

    async def forget_states(app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        ctx.forget_written()  # the tables are about to be recovered from their changelogs

    async def on_revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        # nothing computed before the rebalance may be written after it: held records and
        # unwritten states are dropped (their records are not acked, so they come again)
        for stage in ctx.stages:
            if stage.aligner is not None:
                stage.aligner.forget()
        ctx.forget_unsettled()
        telemetry = {ctx.name(suffix) for suffix in agents.TELEMETRY_TOPICS}
        ctx.clocks.forget({tp.partition for tp in revoked if tp.topic in telemetry})
        for tp in revoked:
            ctx.next_offset.pop((tp.topic, tp.partition), None)
            with contextlib.suppress(KeyError):  # never measured here
                ctx.metrics.lag.remove(tp.topic, str(tp.partition))

    app.task(start_settling)
    app.on_before_shutdown.connect(cast(Any, stop_settling))
    app.timer(LAG_INTERVAL_S, name="lag")(lag)
    app.on_partitions_revoked.connect(cast(Any, on_revoked))
    app.on_partitions_assigned.connect(cast(Any, forget_states))


def _memory_gauges(ctx: Context) -> None:
    """What a backlog could make grow: held records, cached states, unsettled batches."""
    for stage in ctx.stages:
        if stage.aligner is not None:
            ctx.metrics.held.labels(stage.name).set(stage.aligner.held)
    ctx.metrics.cached_states.set(len(ctx.cache))
    ctx.metrics.unsettled.set(ctx.settler.unsettled())


async def _backlog(ctx: Context) -> dict[tuple[str, int], int]:
    """Records not yet processed, per assigned source partition."""
    consumer = ctx.app.consumer
    sources = {topic.get_topic_name() for topic in ctx.topics.values()}
    assigned = [tp for tp in consumer.assignment() if tp.topic in sources]
    if not assigned:
        return {}
    ends = await consumer.highwaters(*assigned)
    backlog = {}
    for tp in assigned:
        done = ctx.next_offset.get((tp.topic, tp.partition))
        if done is None:
            done = await consumer.position(tp)
        if ends.get(tp) is not None and done is not None:
            backlog[(tp.topic, tp.partition)] = max(0, ends[tp] - done)
    return backlog


def _catch_up_quiet_partitions(ctx: Context, backlog: dict[tuple[str, int], int]) -> None:
    """A partition with nothing left to read follows the worker's newest event time (less a
    grace, see clock.py), so a node alone in its partition is found stale when it dies."""
    clock_topics: dict[str, Family] = {
        ctx.name("telemetry.gpu"): "gpu",
        ctx.name("telemetry.tpu"): "tpu",
    }
    now = time.monotonic()
    for (topic, partition), behind in sorted(backlog.items()):
        family = clock_topics.get(topic)
        if family is None or behind:
            continue
        boundaries = ctx.clocks.catch_up(family, partition, now)
        if boundaries:
            ctx.settler.add(None, agents.tick(ctx, family, partition, boundaries))
