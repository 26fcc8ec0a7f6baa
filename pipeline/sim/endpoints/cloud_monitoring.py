"""A Cloud Monitoring stand-in: `google.monitoring.v3.MetricService/ListTimeSeries` over gRPC.

The real `google.cloud.monitoring_v3.MetricServiceClient` talks to it over a plaintext channel
(reference/data-shapes.md §4, the verified recipe):

    MetricServiceClient(transport=MetricServiceGrpcTransport(
        channel=grpc.insecure_channel("127.0.0.1:PORT")))

What it serves, from simulated TpuSamples: the Cloud TPU VM metrics (§3.1)
`tpu.googleapis.com/accelerator/{duty_cycle, tensorcore_utilization,
memory_bandwidth_utilization}` (GAUGE DOUBLE, %) and
`…/{memory_used, memory_total}` (GAUGE INT64, bytes) on the monitored resource `tpu_worker`
(labels `resource_container` = project, `location` = zone, `worker_id`), one series per chip
told apart by the metric label `accelerator_id` = `<worker_id>-<device ordinal>`. `tpu_worker`
names no node, which is why the ingest side needs the worker inventory (sources/tpu_hosts.py).
With `gke=True` the same chips are also served as a GKE TPU node pool would report them (§3.2):
`kubernetes.io/node/accelerator/*` on `k8s_node` (project_id, location, cluster_name,
node_name) for every chip, and `kubernetes.io/container/accelerator/*` on `k8s_container`
(+ namespace_name, pod_name, container_name) for the chips a job holds; `duty_cycle` and the
memory metrics are INT64 there, as kubelet reports them. Metric labels: `accelerator_id`,
`make` = `cloud-tpu`, `model`, `tpu_topology`. The simulator's slice interruptions
(CapacityEvents PREEMPTION, MAINTENANCE_STARTED, HOST_ERROR on a slice) become points of
`tpu.googleapis.com/instance/interruption_count` on each `tpu_worker` of the slice and, with
`gke=True`, of `kubernetes.io/node_pool/interruption_count` on `k8s_node_pool`. The
simulator's quota readings (CapacityEvents from `gcp.monitoring.quota`) become the
`serviceruntime.googleapis.com/quota/allocation/usage` and `…/quota/limit` (GAUGE INT64) and
`…/quota/exceeded` (GAUGE BOOL, a point only when exceeded) series on `consumer_quota`
(project_id, service, location), metric labels `quota_metric` and, on limit and exceeded,
`limit_name` (§6.1), for `ingest capacity`.

What ListTimeSeries honours, as the real API does: `name` = `projects/<project>`; a filter of
`=`/`!=` comparisons joined by AND that names exactly one `metric.type`, over `metric.type`,
`resource.type`, `metric.label(s).<k>`, `resource.label(s).<k>`; the interval `(start, end]`
(no start: the points at exactly `end`); points newest first; `view` FULL or HEADERS; paging
with `page_size` (points in FULL, series in HEADERS) and an opaque `next_page_token`; a series
cut by a page boundary continues on the next page. Aggregation, `order_by` and the richer filter
functions (`starts_with`, `one_of`, regex) answer UNIMPLEMENTED / INVALID_ARGUMENT.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections import deque
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from google.cloud import monitoring_v3

from pipeline.model import CapacityEvent, TpuSample
from pipeline.sources.cloudmon import (
    CHIP_METRICS,
    GKE_CONTAINER_METRICS,
    GKE_NODE_METRICS,
    INT64,
    INTERRUPTION_KINDS,
    INTERRUPTION_METRICS,
    NODE_POOL_INTERRUPTIONS,
    RESOURCE_OF,
    TPU_INTERRUPTIONS,
    TPU_METRICS,
)
from pipeline.sources.quota import (
    CONSUMER_QUOTA,
    QUOTA_EXCEEDED,
    QUOTA_LIMIT,
    QUOTA_METRICS,
    QUOTA_USAGE,
    quota_service,
)
from pipeline.sources.tpu_hosts import TpuHost, TpuWorker, host_chips, worker_instance_id

SERVICE = "google.monitoring.v3.MetricService"
_GAUGE = 1  # google.api.MetricDescriptor.MetricKind
MAX_PAGE_SIZE = 100_000
_POINTS_KEPT = 4096
# metric type → (value type, unit) of everything served
_KINDS: dict[str, tuple[int, str]] = {
    **{t: (spec[1], spec[2]) for t, spec in CHIP_METRICS.items()},
    **dict.fromkeys(INTERRUPTION_METRICS, (INT64, "1")),
    **QUOTA_METRICS,
}
_RESOURCE_OF = {**RESOURCE_OF, **dict.fromkeys(QUOTA_METRICS, CONSUMER_QUOTA)}
_BOOL = 1  # google.api.MetricDescriptor.ValueType
# CapacityEvent kind → (interruption_type, interruption_reason) of the interruption metrics
_INTERRUPTION_OF = {
    "PREEMPTION": ("PreemptionEvent", "Preemption"),
    "MAINTENANCE_STARTED": ("MaintenanceEvent", "HW/SW Maintenance"),
    "HOST_ERROR": ("TerminationEvent", "HostError"),
}
assert {kind for kind, _ in INTERRUPTION_KINDS.values()} == set(_INTERRUPTION_OF)

_Request = monitoring_v3.ListTimeSeriesRequest.pb()
_Response = monitoring_v3.ListTimeSeriesResponse.pb()
_TimeSeries = monitoring_v3.TimeSeries.pb()


# --- filters --------------------------------------------------------------------------------


class FilterError(ValueError):
    """The filter is not something this stand-in (or the real API) accepts."""


@dataclass(frozen=True)
class Condition:
    selector: str  # metric.type | resource.type | metric.labels.<k> | resource.labels.<k>
    equal: bool
    value: str


_TERM = re.compile(
    r"\s*(?P<selector>[A-Za-z_][\w.]*)\s*(?P<op>!=|=)\s*\"(?P<value>(?:[^\"\\]|\\.)*)\"\s*"
)
_SELECTOR = re.compile(r"^(metric\.type|resource\.type|(?:metric|resource)\.labels?\.\w+)$")


def parse_filter(text: str) -> tuple[str, list[Condition]]:
    """`metric.type = "x" AND resource.labels.k = "v"` → ("x", conditions)."""
    conditions = [_condition(term) for term in re.split(r"\s+AND\s+", text.strip())]
    types = [c for c in conditions if c.selector == "metric.type"]
    if len(types) != 1 or not types[0].equal:
        raise FilterError(f'the filter must name exactly one metric.type = "…"; got {text!r}')
    return types[0].value, conditions


def _condition(term: str) -> Condition:
    match = _TERM.fullmatch(term)
    if match is None:
        raise FilterError(f'unsupported filter term {term!r}: expected <selector> = "<value>"')
    selector = match["selector"]
    if not _SELECTOR.match(selector):
        raise FilterError(f"unknown selector {selector!r} in filter term {term!r}")
    selector = re.sub(r"^(metric|resource)\.label\.", r"\1.labels.", selector)
    value = re.sub(r"\\(.)", r"\1", match["value"])
    return Condition(selector, match["op"] == "=", value)


def _matches(conditions: Sequence[Condition], series: _Series) -> bool:
    for condition in conditions:
        kind, _, rest = condition.selector.partition(".")
        labels = series.metric_labels if kind == "metric" else series.resource_labels
        if rest == "type":
            actual = series.metric_type if kind == "metric" else series.resource_type
        else:
            actual = labels.get(rest.removeprefix("labels."), "")
        if (actual == condition.value) != condition.equal:
            return False
    return True


# --- the store ------------------------------------------------------------------------------


@dataclass
class _Series:
    metric_type: str
    resource_type: str
    resource_labels: dict[str, str]
    metric_labels: dict[str, str]
    points: deque[tuple[int, float]]  # (end ms, value), oldest first

    def sort_key(self) -> tuple[str, ...]:
        return (*sorted(self.resource_labels.items()), *sorted(self.metric_labels.items()))  # type: ignore[arg-type]


class CloudMonitoringStandIn:
    """An in-memory metric store behind a real gRPC server."""

    def __init__(
        self,
        *,
        project: str = "fleetpulse-sim",
        host: str = "127.0.0.1",
        port: int = 0,
        gke: bool = False,
    ):
        self.project = project
        self.gke = gke  # also serve the chips as GKE nodes/containers (k8s_* resources)
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._workers: dict[tuple[str, str], TpuWorker] = {}
        self._lock = threading.Lock()
        self.requests: list[Any] = []  # every ListTimeSeriesRequest received, for tests
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                    self._list_time_series,
                    request_deserializer=_Request.FromString,
                    response_serializer=_Response.SerializeToString,
                )
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self) -> CloudMonitoringStandIn:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> CloudMonitoringStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- writing ----------------------------------------------------------------------------

    def record(self, sample: TpuSample) -> None:
        """Store one chip-metrics sample as points of the tpu_worker series."""
        host = TpuHost(
            cluster=sample.cluster,
            node=sample.node,
            pool=sample.pool,
            zone=sample.zone,
            slice=sample.slice,
            accelerator_type=sample.accelerator_type,
            topology=sample.topology,
            worker_id=sample.worker_id,
        )
        instance = worker_instance_id(host)
        ordinals = {
            chip: n
            for n, (chip, _) in enumerate(
                host_chips(sample.accelerator_type, sample.topology, sample.worker_id)
            )
        }
        resource = {
            "resource_container": self.project,
            "location": sample.zone,
            "worker_id": instance,
        }
        with self._lock:
            self._workers[(sample.zone, instance)] = TpuWorker(
                **{f: getattr(host, f) for f in host.__struct_fields__}, instance_id=instance
            )
            for chip in sample.chips:
                if chip.chip_id not in ordinals:
                    msg = (
                        f"chip {chip.chip_id} is not on worker {sample.worker_id} of {sample.slice}"
                    )
                    raise ValueError(msg)
                accelerator = {"accelerator_id": f"{instance}-{ordinals[chip.chip_id]}"}
                self._write(TPU_METRICS, resource, accelerator, sample.ts, chip.metrics)
                if not self.gke:
                    continue
                gke_labels = {
                    **accelerator,
                    "make": "cloud-tpu",
                    "model": _gke_model(sample.accelerator_type),
                    "tpu_topology": sample.topology,
                }
                node = {
                    "project_id": self.project,
                    "location": sample.zone,
                    "cluster_name": sample.cluster,
                    "node_name": sample.node,
                }
                self._write(GKE_NODE_METRICS, node, gke_labels, sample.ts, chip.metrics)
                if chip.job is not None:  # container series exist only while a pod holds it
                    container = {
                        **node,
                        "namespace_name": "default",
                        "pod_name": f"{chip.job}-{sample.worker_id}",
                        "container_name": "main",
                    }
                    self._write(
                        GKE_CONTAINER_METRICS, container, gke_labels, sample.ts, chip.metrics
                    )

    def _write(
        self,
        metrics: dict[str, tuple[str, int, str]],
        resource: dict[str, str],
        labels: dict[str, str],
        ts: int,
        values: dict[str, float],
    ) -> None:
        for metric_type, (name, _, _) in metrics.items():
            if name in values:
                self._series_for(metric_type, resource, labels).points.append((ts, values[name]))

    def record_capacity(self, event: CapacityEvent) -> None:
        """A slice's interruption as the interruption_count metrics show it, a quota reading
        as the quota metrics; others ignored."""
        if event.quota is not None and event.source == "gcp.monitoring.quota":
            self._record_quota(event)
            return
        if event.target_kind != "slice" or event.kind not in _INTERRUPTION_OF:
            return
        interruption_type, reason = _INTERRUPTION_OF[event.kind]
        labels = {"interruption_type": interruption_type, "interruption_reason": reason}
        with self._lock:
            hosts = [
                (key, w)
                for key, w in self._workers.items()
                if w.cluster == event.cluster and w.slice == event.target
            ]
            for (zone, instance), _ in hosts:
                worker = {
                    "resource_container": self.project,
                    "location": zone,
                    "worker_id": instance,
                }
                series = self._series_for(TPU_INTERRUPTIONS, worker, labels)
                series.points.append((event.ts, 1.0))
            if self.gke and hosts:
                first = hosts[0][1]
                pool = {
                    "project_id": self.project,
                    "location": first.zone,
                    "cluster_name": first.cluster,
                    "node_pool_name": first.pool,
                }
                series = self._series_for(NODE_POOL_INTERRUPTIONS, pool, labels)
                series.points.append((event.ts, 1.0))

    def _record_quota(self, event: CapacityEvent) -> None:
        assert event.quota is not None
        quota = event.quota
        resource = {
            "project_id": self.project,
            "service": quota_service(quota.metric),
            "location": event.zone,
        }
        limit_name = _limit_name(quota.metric, event.zone)
        metric = {"quota_metric": quota.metric}
        limited = {**metric, "limit_name": limit_name}
        with self._lock:
            if event.kind == "QUOTA_EXCEEDED":
                _put(self._series_for(QUOTA_EXCEEDED, resource, limited), event.ts, 1.0)
                return
            if event.kind == "QUOTA_USAGE":
                _put(self._series_for(QUOTA_USAGE, resource, metric), event.ts, quota.usage)
            _put(self._series_for(QUOTA_LIMIT, resource, limited), event.ts, quota.limit)

    def _series_for(
        self, metric_type: str, resource: dict[str, str], metric: dict[str, str]
    ) -> _Series:
        key = (
            metric_type,
            json.dumps(resource, sort_keys=True),
            json.dumps(metric, sort_keys=True),
        )
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(
                metric_type,
                _RESOURCE_OF[metric_type],
                dict(resource),
                dict(metric),
                deque(maxlen=_POINTS_KEPT),
            )
        return series

    def workers(self) -> list[TpuWorker]:
        """The inventory of every tpu_worker seen so far (what the TPU API would list)."""
        with self._lock:
            return sorted(self._workers.values(), key=lambda w: (w.cluster, w.slice, w.worker_id))

    # -- ListTimeSeries ---------------------------------------------------------------------

    def _list_time_series(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        try:
            return self._answer(request)
        except _RpcError as abort:
            context.abort(abort.code, abort.message)
            raise  # unreachable: abort raises

    def _answer(self, request: Any) -> Any:
        if request.name != f"projects/{self.project}":
            raise _RpcError(grpc.StatusCode.NOT_FOUND, f"project {request.name!r} does not exist")
        try:
            metric_type, conditions = parse_filter(request.filter)
        except FilterError as exc:
            raise _RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if request.HasField("aggregation") and request.aggregation.per_series_aligner != 0:
            raise _RpcError(grpc.StatusCode.UNIMPLEMENTED, "the stand-in does not aggregate")
        if request.order_by:
            raise _RpcError(grpc.StatusCode.INVALID_ARGUMENT, "order_by must be empty")
        if not request.interval.HasField("end_time"):
            raise _RpcError(grpc.StatusCode.INVALID_ARGUMENT, "interval.end_time is required")
        end = _ms(request.interval.end_time)
        start = (
            _ms(request.interval.start_time) if request.interval.HasField("start_time") else None
        )
        headers_only = request.view == 1
        with self._lock:
            selected = sorted(
                (
                    s
                    for s in self._series.values()
                    if s.metric_type == metric_type and _matches(conditions, s)
                ),
                key=_Series.sort_key,
            )
            windows = [
                (s, [p for p in reversed(s.points) if _inside(p[0], start, end)]) for s in selected
            ]
        windows = [(s, pts) for s, pts in windows if pts]
        return _page(request, windows, headers_only)


def _put(series: _Series, ts: int, value: float) -> None:
    # a gauge has one value per sample time: a limit raised in the same tick replaces it
    if series.points and series.points[-1][0] == ts:
        series.points.pop()
    series.points.append((ts, value))


def _limit_name(metric: str, location: str) -> str:
    # limit names as Cloud Monitoring shows them: NVIDIA-H100-80GB-GPUS-per-project-zone,
    # …-per-project-region, GPUS-ALL-REGIONS-per-project (location `global`)
    scope = "" if location == "global" else "-zone" if location[-1:].isalpha() else "-region"
    return metric.rsplit("/", 1)[-1].upper().replace("_", "-") + "-per-project" + scope


def _gke_model(accelerator_type: str) -> str:
    # GKE's `model` label names the node's accelerator, e.g. tpu-v5p-slice, tpu-v6e-slice
    generation = accelerator_type.split("-", 1)[0]
    return {"v5litepod": "tpu-v5-lite-podslice", "v4": "tpu-v4-podslice"}.get(
        generation, f"tpu-{generation}-slice"
    )


class _RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _inside(ts: int, start: int | None, end: int) -> bool:
    return ts == end if start is None else start < ts <= end


def _ms(timestamp: Any) -> int:
    return int(timestamp.seconds) * 1000 + int(timestamp.nanos) // 1_000_000


def _page(
    request: Any, windows: list[tuple[_Series, list[tuple[int, float]]]], headers_only: bool
) -> Any:
    """One page starting at the token's (series, point) offset; the token binds the query."""
    query = _query_id(request)
    series_at, point_at = _token_offset(request.page_token, query)
    budget = min(request.page_size or MAX_PAGE_SIZE, MAX_PAGE_SIZE)
    response = _Response()
    index = series_at
    while index < len(windows) and budget > 0:
        series, points = windows[index]
        out = _header(response.time_series.add(), series)
        if headers_only:
            budget -= 1
            index += 1
            continue
        taken = points[point_at : point_at + budget]
        for ts, value in taken:
            _point(out.points.add(), ts, value, _KINDS[series.metric_type][0])
        budget -= len(taken)
        point_at += len(taken)
        if point_at >= len(points):
            index, point_at = index + 1, 0
    if index < len(windows):
        response.next_page_token = _token(index, point_at, query)
    return response


def _query_id(request: Any) -> str:
    # A token is only valid for the query that made it (the page size may change).
    parts = (request.name, request.filter, request.interval.SerializeToString(), request.view)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _header(out: Any, series: _Series) -> Any:
    out.metric.type = series.metric_type
    out.metric.labels.update(series.metric_labels)
    out.resource.type = series.resource_type
    out.resource.labels.update(series.resource_labels)
    out.metric_kind = _GAUGE
    out.value_type, out.unit = _KINDS[series.metric_type]
    return out


def _point(out: Any, ts: int, value: float, value_type: int) -> None:
    out.interval.end_time.seconds, millis = divmod(ts, 1000)
    out.interval.end_time.nanos = millis * 1_000_000
    if value_type == _BOOL:
        out.value.bool_value = bool(value)
    elif value_type == INT64:
        out.value.int64_value = round(value)  # kubelet's integer duty cycle rounds
    else:
        out.value.double_value = float(value)


def _token(series_at: int, point_at: int, query: str) -> str:
    raw = json.dumps({"s": series_at, "p": point_at, "q": query}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _token_offset(token: str, query: str) -> tuple[int, int]:
    if not token:
        return 0, 0
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset = int(fields["s"]), int(fields["p"])
        same_query = fields["q"] == query
    except (ValueError, KeyError, TypeError):
        raise _RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid page_token {token!r}") from None
    if not same_query:
        raise _RpcError(grpc.StatusCode.INVALID_ARGUMENT, "page_token belongs to another query")
    return offset
