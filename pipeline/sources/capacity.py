"""`fleetpulse ingest capacity`: the cloud's own capacity signals → fleet.events.capacity, and
the fleet's members as the cloud lists them → fleet.inventory.

Feeds (capacity.feeds), each through the real client library:

- `quota`    Cloud Monitoring (`google-cloud-monitoring`): GPU/TPU quota usage, limit,
             exceeded on consumer_quota (sources/quota.py)
- `tpu`      Cloud TPU API (`google-cloud-tpu` v2alpha1): nodes' upcoming maintenance and
             preemption, queued-resource states and stock-outs (sources/tpu_api.py)
- `compute`  Compute Engine API (`google-cloud-compute`, REST): GPU instances' upcoming
             maintenance (sources/compute_api.py)
- `metadata` this host's metadata server: maintenance-event, preempted (sources/metadata.py)
- `reservations`  Compute Engine reservations (specific and aggregate, `google-cloud-compute`
             REST) and Cloud TPU reservations (`google-cloud-tpu` v2alpha1): devices reserved
             and in use, on each change (sources/reservations.py)

With capacity.inventory, the `tpu` and `compute` feeds also publish every labelled TPU slice
and GPU instance as an inventory/1 record (source `gcp.tpu` / `gcp.compute`), when it is new or
changed since the last poll: the compacted topic keeps the latest per cluster/name.

One checkpoint (sources.state_dir/capacity.json) holds what the feeds need to turn state into
changes: the end of the last quota interval and the last limits, the maintenance and
queued-resource states seen, the metadata values, and a digest per inventory record. A poll
works on a copy; only a published batch's copy is committed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import CapacitySettings, SourcesSettings
from pipeline.errors import DecodeError
from pipeline.model import Inventory
from pipeline.sources import compute_api, metadata, quota, reservations, tpu_api
from pipeline.sources.base import (
    BadRecord,
    Batch,
    Parsed,
    load_checkpoint,
    save_checkpoint,
    validated,
)
from pipeline.sources.maintenance import Member, maintenance_events
from pipeline.wire.codec import encode


class CapacityPosition(msgspec.Struct, kw_only=True):
    quota_end_ms: int | None = None
    quota_limits: dict[str, float] = {}
    compute_maintenance: dict[str, str] = {}
    compute_states: dict[str, str] = {}
    tpu_maintenance: dict[str, str] = {}
    tpu_states: dict[str, str] = {}
    queued: dict[str, str] = {}
    metadata: dict[str, str] = {}
    inventory: dict[str, str] = {}
    reservations: dict[str, str] = {}  # reservation name -> digest of what it said last


def _copy(position: CapacityPosition) -> CapacityPosition:
    return msgspec.json.decode(msgspec.json.encode(position), type=CapacityPosition)



@dataclass
class CapacityStats:
    """On /metrics: series of quotas that are not accelerators' (CPUs, disks, addresses…),
    skipped quietly, counted per quota metric
    (fleetpulse_ingest_capacity_quota_skipped_total{quota_metric="…"})."""

    quota_skipped: dict[str, int] = field(default_factory=dict, metadata={"label": "quota_metric"})

class CapacitySource:
    name = "capacity"

    def __init__(
        self,
        settings: CapacitySettings,
        sources: SourcesSettings,
        *,
        once: bool = False,
        checkpoint: Path | None = None,
        clock: Callable[[], float] = time.time,
        clients: dict[str, Any] | None = None,
    ) -> None:
        self._settings = settings
        self._sources = sources
        self._once = once
        self._clock = clock
        self._checkpoint = checkpoint or Path(sources.state_dir) / "capacity.json"
        self.position = load_checkpoint(self._checkpoint, CapacityPosition) or CapacityPosition()
        self._clients = dict(clients or {})
        self._identity: metadata.Identity | None = None
        self.stats = CapacityStats()
        for feed in settings.feeds:  # missing credentials fail here, at once, not per poll
            self._client(feed)
        if "reservations" in settings.feeds:  # Cloud TPU reservations: the TPU API's client
            self._client("tpu")

    def _client(self, feed: str) -> Any:
        if feed not in self._clients:
            from pipeline.sources import gcp_clients

            config = self._settings
            makers: dict[str, Callable[[], Any]] = {
                "quota": lambda: gcp_clients.monitoring_client(config.monitoring_endpoint),
                "tpu": lambda: gcp_clients.tpu_client(config.tpu_endpoint),
                "compute": lambda: gcp_clients.instances_client(config.compute_endpoint),
                "reservations": lambda: reservations.reservations_client(
                    config.compute_endpoint
                ),
                "metadata": lambda: metadata.MetadataClient(
                    metadata.metadata_base(config.metadata_url), config.timeout_s
                ),
            }
            self._clients[feed] = makers[feed]()
        return self._clients[feed]

    def poll(self) -> Batch:
        position = _copy(self.position)
        parsed = Parsed()
        for feed in self._settings.feeds:
            parsed.extend(getattr(self, f"_poll_{feed}")(position))
        return Batch(parsed.events, parsed.bad, position)

    # -- feeds ---------------------------------------------------------------------------

    def _poll_quota(self, position: CapacityPosition) -> Parsed:
        config = self._settings
        end_ms = int((self._clock() - config.quota_lag_s) * 1000)
        oldest = end_ms - int(config.quota_lookback_s * 1000)
        start_ms = max(position.quota_end_ms or oldest, oldest)
        if end_ms <= start_ms:
            return Parsed()
        series = quota.list_quota_series(
            self._client("quota"), config.project, start_ms, end_ms, config.page_size,
            config.timeout_s,
        )
        parsed = quota.parse_quota_series(series, position.quota_limits, config.zones)
        skipped = self.stats.quota_skipped
        for metric, count in parsed.skipped.items():
            skipped[metric] = skipped.get(metric, 0) + count
        position.quota_end_ms = end_ms
        return parsed

    def _poll_tpu(self, position: CapacityPosition) -> Parsed:
        config, client = self._settings, self._client("tpu")
        now_ms = int(self._clock() * 1000)
        nodes, queued = [], []
        for parent in tpu_api.parents(config.project, config.zones):
            nodes += tpu_api.list_nodes(client, parent, config.page_size, config.timeout_s)
            queued += tpu_api.list_queued(client, parent, config.page_size, config.timeout_s)
        members = [(tpu_api.node_member(node), node) for node in nodes]
        known = [(member, node) for member, node in members if member is not None]
        parsed = maintenance_events(
            position.tpu_maintenance,
            [(member, tpu_api.node_upcoming(node)) for member, node in known],
            now_ms,
            tpu_api.NODE_SOURCE,
        )
        parsed.extend(
            tpu_api.preemptions(
                position.tpu_states, [(m, node.state.name) for m, node in known], now_ms
            )
        )
        parsed.extend(tpu_api.queued_resource_events(position.queued, queued, now_ms))
        parsed.extend(self._inventory(position, [m for m, _ in known], now_ms, "gcp.tpu"))
        return parsed

    def _poll_compute(self, position: CapacityPosition) -> Parsed:
        config = self._settings
        now_ms = int(self._clock() * 1000)
        instances = compute_api.list_instances(
            self._client("compute"), config.project, config.zones, config.page_size,
            config.timeout_s,
        )
        members = [(compute_api.instance_member(i), i) for i in instances]
        known = [(member, i) for member, i in members if member is not None]
        parsed = maintenance_events(
            position.compute_maintenance,
            [(member, compute_api.instance_upcoming(i)) for member, i in known],
            now_ms,
            compute_api.SOURCE,
        )
        parsed.extend(
            tpu_api.preemptions(
                position.compute_states,
                [(member, compute_api.instance_state(i)) for member, i in known],
                now_ms,
                compute_api.PREEMPTION_SOURCE,
            )
        )
        parsed.extend(self._inventory(position, [m for m, _ in known], now_ms, "gcp.compute"))
        return parsed

    def _poll_reservations(self, position: CapacityPosition) -> Parsed:
        config = self._settings
        held = reservations.list_compute(
            self._client("reservations"), config.project, config.zones, config.page_size,
            config.timeout_s,
        )
        held += reservations.list_tpu(
            self._client("tpu"), tpu_api.parents(config.project, config.zones),
            config.page_size, config.timeout_s,
        )
        now_ms = int(self._clock() * 1000)
        return reservations.reservation_events(position.reservations, held, now_ms)

    def _poll_metadata(self, position: CapacityPosition) -> Parsed:
        client: metadata.MetadataClient = self._client("metadata")
        if self._identity is None:
            self._identity = metadata.read_identity(
                client, self._sources.cluster, self._sources.pool
            )
        # Without an ETag the server would wait for the next change: read the value first.
        etag = position.metadata.get("maintenance-event-etag", "")
        wait = 0.0 if self._once or not etag else self._settings.metadata_wait_s
        event = client.get("instance/maintenance-event", wait_s=wait, last_etag=etag)
        preempted = client.get("instance/preempted")
        now_ms = int(self._clock() * 1000)
        if event is not None:
            position.metadata["maintenance-event-etag"] = event.etag
        return metadata.notice_events(
            position.metadata,
            self._identity,
            event.value if event is not None else "NONE",
            preempted.value if preempted is not None else "FALSE",
            now_ms,
        )

    def _inventory(
        self, position: CapacityPosition, members: list[Member], now_ms: int, source: str
    ) -> Parsed:
        parsed = Parsed()
        if not self._settings.inventory:
            return parsed
        for member in members:
            try:
                record = validated(inventory_record(member, now_ms, source))
            except DecodeError as exc:
                parsed.bad.append(BadRecord(repr(member).encode(), exc))
                continue
            digest = _digest(record)
            if position.inventory.get(member.key) != digest:
                position.inventory[member.key] = digest
                parsed.events.append(record)
        return parsed

    # -- checkpoint ------------------------------------------------------------------------

    def commit(self, position: msgspec.Struct | None) -> None:
        if isinstance(position, CapacityPosition):
            save_checkpoint(self._checkpoint, position)
            self.position = position

    def close(self) -> None:
        for client in self._clients.values():
            transport = getattr(client, "transport", None)
            if transport is not None:
                transport.close()


def inventory_record(member: Member, ts: int, source: str) -> Inventory:
    return Inventory(
        ts=ts,
        cluster=member.cluster,
        kind=member.kind,  # type: ignore[arg-type]
        name=member.name,
        pool=member.pool,
        zone=member.zone,
        accelerator=member.accelerator,
        capacity=member.capacity,
        labels=dict(sorted(member.labels.items())),
        source=source,
    )


def _digest(record: Inventory) -> str:
    # what the record says, not when: a re-listed unchanged member is not republished
    return hashlib.sha256(encode(msgspec.structs.replace(record, ts=0))).hexdigest()[:16]
