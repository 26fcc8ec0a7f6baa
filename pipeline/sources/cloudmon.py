"""TPU chip metrics and interruptions from Cloud Monitoring → TpuSample and CapacityEvent.

Two ways a TPU reports there (reference/data-shapes.md §3.1, §3.2), chosen by
`sources.cloudmon_mode`:

- `tpu-vm` (TPU VMs): `tpu.googleapis.com/accelerator/*` and `tpu/tensorcore/idle_duration` on
  `tpu_worker` (project, location, worker_id), and `tpu.googleapis.com/instance/interruption_count`.
- `gke` (TPUs in GKE node pools, which report only through Kubernetes metrics):
  `kubernetes.io/node/accelerator/*` on `k8s_node` (project_id, location, cluster_name,
  node_name), `kubernetes.io/container/accelerator/*` on `k8s_container` (+ namespace_name,
  pod_name, container_name), and `kubernetes.io/{node_pool,node}/interruption_count` on
  `k8s_node_pool` (+ node_pool_name) / `k8s_node`.
- `all`: both.

Every metric type is one request (a filter names exactly one) with the real
`MetricServiceClient.list_time_series` (the pager follows `next_page_token`). Points of one
TPU host at one end time make one TpuSample, whichever resource they came on; the chip is the
metric label `accelerator_id` = `<instance id>-<device ordinal>`. The worker inventory
(sources/tpu_hosts.py, `sources.cloudmon_inventory`) supplies node, slice and pool for a
`tpu_worker`, and the host behind a GKE node (by cluster and node name) or node pool. A chip
read on both its node and a container keeps the node's value: container series exist only
while a pod holds the chip and can double at pod handover; they fill in what the node lacks
(node metrics need GKE runtime metrics enabled). Cloud Monitoring says nothing of jobs, so
`job` stays None. An interruption point with a count > 0 is one CapacityEvent per TPU slice
concerned (a slice is interrupted and repaired as one unit), as the simulator writes them.

Position: the end of the last interval read. Each poll reads `(position, now - lag]`; the lag
covers Cloud Monitoring's delay (values appear up to ~3 minutes after they are measured).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import SourcesSettings
from pipeline.errors import DecodeError, SourceError
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent
from pipeline.sources.base import (
    BadRecord,
    Batch,
    Parsed,
    load_checkpoint,
    save_checkpoint,
    validated,
)
from pipeline.sources.tpu_hosts import TpuWorker, load_inventory, tpu_sample

Inventory = Mapping[tuple[str, str], TpuWorker]
RESOURCE_TYPE = "tpu_worker"
K8S_NODE, K8S_CONTAINER, K8S_NODE_POOL = "k8s_node", "k8s_container", "k8s_node_pool"
DOUBLE, INT64 = 3, 2  # google.api.MetricDescriptor.ValueType
# Cloud Monitoring metric type → (TpuChipReading metric, value type, unit); §3.1
TPU_METRICS: dict[str, tuple[str, int, str]] = {
    "tpu.googleapis.com/accelerator/duty_cycle": ("duty_cycle_pct", DOUBLE, "%"),
    "tpu.googleapis.com/accelerator/tensorcore_utilization": ("tensorcore_util", DOUBLE, "%"),
    "tpu.googleapis.com/accelerator/memory_bandwidth_utilization": (
        "memory_bandwidth_util",
        DOUBLE,
        "%",
    ),
    "tpu.googleapis.com/accelerator/memory_used": ("hbm_used_bytes", INT64, "By"),
    "tpu.googleapis.com/accelerator/memory_total": ("hbm_total_bytes", INT64, "By"),
    "tpu.googleapis.com/tpu/tensorcore/idle_duration": ("tensorcore_idle_s", INT64, "s"),
}


def _gke_metrics(scope: str) -> dict[str, tuple[str, int, str]]:
    # §3.2: duty_cycle is an integer percent (kubelet's AcceleratorStats.dutyCycle is uint64)
    prefix = f"kubernetes.io/{scope}/accelerator"
    return {
        f"{prefix}/duty_cycle": ("duty_cycle_pct", INT64, "%"),
        f"{prefix}/tensorcore_utilization": ("tensorcore_util", DOUBLE, "%"),
        f"{prefix}/memory_bandwidth_utilization": ("memory_bandwidth_util", DOUBLE, "%"),
        f"{prefix}/memory_used": ("hbm_used_bytes", INT64, "By"),
        f"{prefix}/memory_total": ("hbm_total_bytes", INT64, "By"),
    }


GKE_NODE_METRICS = _gke_metrics("node")
GKE_CONTAINER_METRICS = _gke_metrics("container")
CHIP_METRICS = {**TPU_METRICS, **GKE_NODE_METRICS, **GKE_CONTAINER_METRICS}
# Interruption counts: GAUGE INT64, interruptions in the sample period, labelled
# interruption_type (TerminationEvent, MaintenanceEvent, PreemptionEvent) and
# interruption_reason (HostError, Eviction, AutoRepair, ...).
TPU_INTERRUPTIONS = "tpu.googleapis.com/instance/interruption_count"
NODE_POOL_INTERRUPTIONS = "kubernetes.io/node_pool/interruption_count"
NODE_INTERRUPTIONS = "kubernetes.io/node/interruption_count"
INTERRUPTION_METRICS = (TPU_INTERRUPTIONS, NODE_POOL_INTERRUPTIONS, NODE_INTERRUPTIONS)
# metric type → the monitored resource it is written on
RESOURCE_OF: dict[str, str] = {
    **dict.fromkeys(TPU_METRICS, RESOURCE_TYPE),
    **dict.fromkeys(GKE_NODE_METRICS, K8S_NODE),
    **dict.fromkeys(GKE_CONTAINER_METRICS, K8S_CONTAINER),
    TPU_INTERRUPTIONS: RESOURCE_TYPE,
    NODE_POOL_INTERRUPTIONS: K8S_NODE_POOL,
    NODE_INTERRUPTIONS: K8S_NODE,
}
MODES: dict[str, tuple[str, ...]] = {
    "tpu-vm": (*TPU_METRICS, TPU_INTERRUPTIONS),
    "gke": (*GKE_NODE_METRICS, *GKE_CONTAINER_METRICS, NODE_POOL_INTERRUPTIONS, NODE_INTERRUPTIONS),
}
MODES["all"] = MODES["tpu-vm"] + MODES["gke"]
# interruption_type → (CapacityEvent kind, severity), as the simulator writes them
INTERRUPTION_KINDS: dict[str, tuple[str, str]] = {
    "PreemptionEvent": ("PREEMPTION", "warning"),
    "MaintenanceEvent": ("MAINTENANCE_STARTED", "warning"),
    "TerminationEvent": ("HOST_ERROR", "critical"),
}


class CloudmonPosition(msgspec.Struct, frozen=True):
    last_end_ms: int


# --- the pure parser ------------------------------------------------------------------------


class _Hosts:
    """The inventory looked up three ways: by tpu_worker, by GKE node, by GKE node pool."""

    def __init__(self, inventory: Inventory) -> None:
        self.by_worker = inventory
        self.by_node = {(w.cluster, w.node): w for w in inventory.values()}
        self.by_pool: dict[tuple[str, str], list[TpuWorker]] = {}
        for worker in inventory.values():
            self.by_pool.setdefault((worker.cluster, worker.pool), []).append(worker)

    def of_series(self, resource_type: str, labels: dict[str, str]) -> list[TpuWorker]:
        """The hosts a series is about (a node pool's are all of its hosts)."""
        if resource_type == RESOURCE_TYPE:
            key = (labels.get("location", ""), labels.get("worker_id", ""))
            found = self.by_worker.get(key)
            wanted = "a tpu_worker (location, worker_id) listed in the TPU inventory"
        elif resource_type in (K8S_NODE, K8S_CONTAINER):
            key = (labels.get("cluster_name", ""), labels.get("node_name", ""))
            found = self.by_node.get(key)
            wanted = "a GKE (cluster_name, node_name) listed in the TPU inventory"
        else:
            key = (labels.get("cluster_name", ""), labels.get("node_pool_name", ""))
            pool = self.by_pool.get(key, [])
            if pool:
                return pool
            found, wanted = None, "a GKE (cluster_name, node_pool_name) listed in the TPU inventory"
        if found is None:
            raise DecodeError(field="resource.labels", expected=wanted, got=repr(key))
        return [found]


_Groups = dict[tuple[tuple[str, str], int], dict[int, dict[str, float]]]


def parse_time_series(series: Iterable[Any], inventory: Inventory) -> Parsed:
    """TimeSeries (proto-plus or raw protobuf) → TpuSamples, oldest first, then CapacityEvents."""
    parsed = Parsed()
    hosts = _Hosts(inventory)
    groups: _Groups = {}
    interruptions: list[CapacityEvent] = []
    # Container series last: they only fill in what the node (or tpu_worker) did not say.
    for one in sorted(series, key=lambda s: s.resource.type == K8S_CONTAINER):
        try:
            if one.metric.type in INTERRUPTION_METRICS:
                interruptions.extend(_interruptions(one, hosts))
            else:
                _add(groups, one, hosts)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(_raw(one), exc))
    for (key, ts), chips in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        worker = inventory[key]
        try:
            parsed.events.append(validated(tpu_sample(worker, ts, chips)))
        except DecodeError as exc:
            raw = json.dumps({"worker": worker.instance_id, "ts": ts, "chips": chips}).encode()
            parsed.bad.append(BadRecord(raw, exc))
        except ValueError as exc:
            error = DecodeError(
                field=f"tpu_worker {worker.instance_id}",
                expected="values valid for tpu_sample/1",
                got=str(exc),
            )
            raw = json.dumps({"worker": worker.instance_id, "ts": ts, "chips": chips}).encode()
            parsed.bad.append(BadRecord(raw, error))
    # one event per (slice, time, kind): a pool's hosts and a slice's nodes say it once
    unique = {(e.target, e.ts, e.kind, e.source): e for e in interruptions}
    ordered: list[CapacityEvent] = sorted(unique.values(), key=lambda e: (e.ts, e.target or ""))
    parsed.events.extend(ordered)
    return parsed


def _checked(series: Any, known: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    metric_type = series.metric.type
    if metric_type not in known:
        raise DecodeError(
            field="metric.type", expected=f"one of {sorted(known)}", got=repr(metric_type)
        )
    if series.resource.type != RESOURCE_OF[metric_type]:
        raise DecodeError(
            field="resource.type",
            expected=repr(RESOURCE_OF[metric_type]),
            got=repr(series.resource.type),
        )
    return metric_type, dict(series.resource.labels)


def _add(groups: _Groups, series: Any, hosts: _Hosts) -> None:
    metric_type, resource = _checked(series, CHIP_METRICS)
    (worker,) = hosts.of_series(series.resource.type, resource)
    ordinal = _ordinal(dict(series.metric.labels).get("accelerator_id", ""), worker.instance_id)
    name = CHIP_METRICS[metric_type][0]
    fill_only = series.resource.type == K8S_CONTAINER
    key = (worker.zone, worker.instance_id)
    for point in series.points:
        ts = _end_ms(point.interval.end_time)
        value = _value(point.value, metric_type)
        readings = groups.setdefault((key, ts), {}).setdefault(ordinal, {})
        if fill_only:
            readings.setdefault(name, value)
        else:
            readings[name] = value


def _interruptions(series: Any, hosts: _Hosts) -> list[CapacityEvent]:
    metric_type, resource = _checked(series, dict.fromkeys(INTERRUPTION_METRICS))
    labels = dict(series.metric.labels)
    kind_of = labels.get("interruption_type", "")
    if kind_of not in INTERRUPTION_KINDS:
        raise DecodeError(
            field="metric.labels.interruption_type",
            expected=f"one of {sorted(INTERRUPTION_KINDS)}",
            got=repr(kind_of),
        )
    kind, severity = INTERRUPTION_KINDS[kind_of]
    reason = labels.get("interruption_reason", "")
    workers = hosts.of_series(series.resource.type, resource)
    source = (
        "gcp.tpu.node"
        if series.resource.type == RESOURCE_TYPE
        else "gke." + ("node_pool" if series.resource.type == K8S_NODE_POOL else "node")
    )
    events = []
    for point in series.points:
        count = _value(point.value, metric_type)
        if count <= 0:  # the gauge reads 0 in every quiet sample period
            continue
        ts = _end_ms(point.interval.end_time)
        for worker in {w.slice: w for w in workers}.values():
            what = f"{kind_of} ({reason})" if reason else kind_of
            events.append(
                CapacityEvent(
                    event_id=stable_id("cap", source, worker.cluster, worker.slice, kind, ts),
                    ts=ts,
                    provider="gcp",
                    source=source,
                    kind=kind,  # type: ignore[arg-type]
                    severity=severity,  # type: ignore[arg-type]
                    region=_region(worker.zone),
                    zone=worker.zone,
                    cluster=worker.cluster,
                    pool=worker.pool,
                    target_kind="slice",
                    target=worker.slice,
                    accelerator_type=worker.accelerator_type,
                    error_code=reason or None,
                    message=f"{metric_type}: {int(count)} x {what} on TPU slice {worker.slice}",
                )
            )
    return events


def _region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _ordinal(accelerator_id: str, instance: str) -> int:
    prefix, _, number = accelerator_id.rpartition("-")
    if prefix != instance or not number.isdigit():
        raise DecodeError(
            field="metric.labels.accelerator_id",
            expected=f'"{instance}-<device ordinal>"',
            got=repr(accelerator_id),
        )
    return int(number)


def _end_ms(end: Any) -> int:
    if isinstance(end, dt.datetime):  # proto-plus: DatetimeWithNanoseconds, tz-aware UTC
        return round(end.timestamp() * 1000)
    return int(end.seconds) * 1000 + int(end.nanos) // 1_000_000


def _value(value: Any, metric_type: str) -> float:
    raw = type(value).pb(value) if hasattr(type(value), "pb") else value
    kind = raw.WhichOneof("value")
    if kind == "double_value":
        return float(raw.double_value)
    if kind == "int64_value":
        return float(raw.int64_value)
    raise DecodeError(
        field=f"{metric_type}.points.value", expected="double_value or int64_value", got=repr(kind)
    )


def _raw(series: Any) -> bytes:
    raw = type(series).pb(series) if hasattr(type(series), "pb") else series
    try:
        from google.protobuf import json_format

        text: str = json_format.MessageToJson(raw)
        return text.encode()
    except (TypeError, AttributeError):
        return repr(series).encode()


# --- the I/O side ---------------------------------------------------------------------------


NO_CREDENTIALS = (
    "Cloud Monitoring needs Google Cloud credentials and found none (Application Default "
    "Credentials). Provide them with one of: `gcloud auth application-default login`; "
    "GOOGLE_APPLICATION_CREDENTIALS=/path/to/service-account-key.json; running on GCE/GKE "
    "with a service account that has roles/monitoring.viewer. To read a stand-in instead, set "
    "sources.cloudmon_endpoint (FLEETPULSE_SOURCES__CLOUDMON_ENDPOINT=host:port)."
)


def metric_service_client(endpoint: str) -> Any:
    """The real client: Application Default Credentials, or a plaintext stand-in at host:port."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import monitoring_v3

    if not endpoint:
        try:
            return monitoring_v3.MetricServiceClient()
        except DefaultCredentialsError as exc:
            raise SourceError(NO_CREDENTIALS) from exc
    import grpc
    from google.cloud.monitoring_v3.services.metric_service.transports import (
        MetricServiceGrpcTransport,
    )

    channel = grpc.insecure_channel(endpoint)
    return monitoring_v3.MetricServiceClient(transport=MetricServiceGrpcTransport(channel=channel))


class CloudMonitoringSource:
    name = "cloudmon"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        inventory: Inventory | None = None,
        checkpoint: Path | None = None,
        clock: Callable[[], float] = time.time,
        client: Any = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._checkpoint = checkpoint or Path(settings.state_dir) / "cloudmon.json"
        self._client = client or metric_service_client(settings.cloudmon_endpoint)
        self._inventory = inventory
        saved = load_checkpoint(self._checkpoint, CloudmonPosition)
        self.position = saved.last_end_ms if saved else None

    def _current_inventory(self) -> Inventory:
        if self._inventory is not None:
            return self._inventory
        if not self._settings.cloudmon_inventory:
            raise SourceError(
                "sources.cloudmon_inventory is not set: tpu_worker names no node, and GKE "
                "nodes need it to name their slice"
            )
        return load_inventory(Path(self._settings.cloudmon_inventory))

    def poll(self) -> Batch:
        end_ms = int((self._clock() - self._settings.cloudmon_lag_s) * 1000)
        oldest = end_ms - int(self._settings.cloudmon_max_lookback_s * 1000)
        start_ms = max(self.position if self.position is not None else oldest, oldest)
        if end_ms <= start_ms:
            return Batch([], [], CloudmonPosition(start_ms))
        inventory = self._current_inventory()  # re-read each poll: workers come and go
        types = MODES[self._settings.cloudmon_mode]
        series = [one for t in types for one in self._list(t, start_ms, end_ms)]
        parsed = parse_time_series(series, inventory)
        return Batch(parsed.events, parsed.bad, CloudmonPosition(end_ms))

    def _list(self, metric_type: str, start_ms: int, end_ms: int) -> list[Any]:
        from google.api_core import exceptions
        from google.cloud import monitoring_v3

        resource_type = RESOURCE_OF[metric_type]
        request = monitoring_v3.ListTimeSeriesRequest(
            name=f"projects/{self._settings.cloudmon_project}",
            filter=f'metric.type = "{metric_type}" AND resource.type = "{resource_type}"',
            interval=monitoring_v3.TimeInterval(
                start_time=_timestamp(start_ms), end_time=_timestamp(end_ms)
            ),
            view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
            page_size=self._settings.cloudmon_page_size,
        )
        try:
            return list(self._client.list_time_series(request=request, timeout=30.0))
        except exceptions.GoogleAPICallError as exc:
            raise SourceError(f"list_time_series {metric_type}: {exc}") from exc
        except exceptions.RetryError as exc:
            raise SourceError(f"list_time_series {metric_type}: gave up retrying: {exc}") from exc

    def commit(self, position: msgspec.Struct | None) -> None:
        if isinstance(position, CloudmonPosition):
            save_checkpoint(self._checkpoint, position)
            self.position = position.last_end_ms

    def close(self) -> None:
        transport = getattr(self._client, "transport", None)
        if transport is not None:
            transport.close()


def _timestamp(ms: int) -> dict[str, int]:
    seconds, millis = divmod(ms, 1000)
    return {"seconds": seconds, "nanos": millis * 1_000_000}
