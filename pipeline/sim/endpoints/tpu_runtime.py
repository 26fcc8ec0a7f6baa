"""A libtpu runtime-metrics stand-in: `tpu.monitoring.runtime.RuntimeMetricService` over gRPC.

One server per simulated TPU host, as libtpu serves its own chips on localhost:8431. It answers
`ListSupportedMetrics` (optionally filtered by a regular expression) and `GetRuntimeMetric`
from the latest TpuSample and IciSample of the host: chip metrics per device ordinal, ICI link
health (gauge) and flit/error counts (counters) per link. Metric names, attribute shapes and
their sources are in pipeline/sources/tpu_runtime.py, which reads them.
"""

from __future__ import annotations

import re
import threading
from concurrent import futures
from typing import Any

import grpc

from pipeline.model import IciSample, TpuSample
from pipeline.sources.libtpu_proto import runtime_protocol
from pipeline.sources.tpu_hosts import host_chips
from pipeline.sources.tpu_runtime import (
    CHIP_METRICS,
    DEVICE_KEY,
    EXTRA_CHIP_PREFIX,
    ICI_METRICS,
)

_CHIP_NAMES = {field: name for name, field in CHIP_METRICS.items()}
_INTEGER_CHIP_FIELDS = {"hbm_used_bytes", "hbm_total_bytes"}
_DESCRIPTIONS = {
    "tpu.runtime.tensorcore.dutycycle.percent": "Percent of time the TensorCores were busy.",
    "tpu.runtime.hbm.memory.usage.bytes": "HBM in use, bytes.",
    "tpu.runtime.hbm.memory.total.bytes": "HBM capacity, bytes.",
    "tpu.runtime.hbm.utilization.percent": "HBM bandwidth utilization, percent.",
    "tpu.runtime.tensorcore.utilization.percent": "TensorCore utilization, percent.",
    "tpu.runtime.ici.link.health": "ICI link health: 0 healthy, higher worse, 10 down.",
    "tpu.runtime.ici.flits.tx.count": "Flits sent on the ICI link.",
    "tpu.runtime.ici.flits.rx.count": "Flits received on the ICI link.",
    "tpu.runtime.ici.errors.count": "Errors seen on the ICI link.",
}


class TpuRuntimeStandIn:
    """Serves the latest chip and link readings of one TPU host."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._protocol = runtime_protocol()
        self._chips: TpuSample | None = None
        self._links: IciSample | None = None
        self._lock = threading.Lock()
        self.requests: list[str] = []
        messages = self._protocol.messages
        handler = grpc.method_handlers_generic_handler(
            f"{self._protocol.package}.{self._protocol.service}",
            {
                "GetRuntimeMetric": grpc.unary_unary_rpc_method_handler(
                    self._get_runtime_metric,
                    request_deserializer=messages["MetricRequest"].FromString,
                    response_serializer=messages["MetricResponse"].SerializeToString,
                ),
                "ListSupportedMetrics": grpc.unary_unary_rpc_method_handler(
                    self._list_supported_metrics,
                    request_deserializer=messages["ListSupportedMetricsRequest"].FromString,
                    response_serializer=messages["ListSupportedMetricsResponse"].SerializeToString,
                ),
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self) -> TpuRuntimeStandIn:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> TpuRuntimeStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def update_chips(self, sample: TpuSample) -> None:
        with self._lock:
            self._chips = sample

    def update_links(self, sample: IciSample) -> None:
        with self._lock:
            self._links = sample

    # -- the service -----------------------------------------------------------------------

    def metric_names(self) -> list[str]:
        with self._lock:
            chips, links = self._chips, self._links
        names: list[str] = []
        if chips is not None:
            fields = sorted({f for chip in chips.chips for f in chip.metrics})
            names += [_CHIP_NAMES.get(f, f"{EXTRA_CHIP_PREFIX}{f}") for f in fields]
        if links is not None:
            names += list(ICI_METRICS)
        return names

    def _list_supported_metrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append("ListSupportedMetrics")
        try:
            pattern = re.compile(request.filter) if request.filter else None
        except re.error as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"filter: {exc}")
        response = self._protocol.messages["ListSupportedMetricsResponse"]()
        for name in self.metric_names():
            if pattern is None or pattern.fullmatch(name):
                response.supported_metric.add(metric_name=name)
        return response

    def _get_runtime_metric(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request.metric_name)
        name = request.metric_name
        if name not in self.metric_names():
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {name!r} is not supported")
        response = self._protocol.messages["MetricResponse"]()
        response.metric.name = name
        response.metric.description = _DESCRIPTIONS.get(name, "Simulated chip metric.")
        with self._lock:
            chips, links = self._chips, self._links
        if name in ICI_METRICS and links is not None and chips is not None:
            self._fill_links(response.metric, name, links, chips)
        elif chips is not None:
            self._fill_chips(response.metric, name, chips)
        return response

    def _fill_chips(self, out: Any, name: str, sample: TpuSample) -> None:
        field = CHIP_METRICS.get(name) or name.removeprefix(EXTRA_CHIP_PREFIX)
        ordinals = _ordinals(sample)
        for chip in sample.chips:
            if field not in chip.metrics:
                continue
            metric = out.metrics.add()
            metric.attribute.key = DEVICE_KEY
            metric.attribute.value.int_attr = ordinals[chip.chip_id]
            _stamp(metric.timestamp, sample.ts)
            value = chip.metrics[field]
            if field in _INTEGER_CHIP_FIELDS:
                metric.gauge.as_int = int(value)
            else:
                metric.gauge.as_double = value

    def _fill_links(self, out: Any, name: str, sample: IciSample, chips: TpuSample) -> None:
        field = ICI_METRICS[name]
        ordinals = _ordinals(chips)
        for link in sample.links:
            value = getattr(link, field)
            if value is None or link.chip_id not in ordinals:
                continue
            metric = out.metrics.add()
            attrs = metric.attribute.value.kvlist_attr.attributes
            metric.attribute.key = "link"
            ordinal = ordinals[link.chip_id]
            attrs.add(key="device_ordinal").value.string_attr = str(ordinal)
            attrs.add(key="port").value.int_attr = link.port
            attrs.add(key="peer_chip_id").value.int_attr = link.peer_chip_id
            attrs.add(key="link").value.string_attr = f"tray1.chip{ordinal}.ici{link.port}.int"
            _stamp(metric.timestamp, sample.ts)
            if field == "health":
                metric.gauge.as_int = value
            else:
                metric.counter.as_int = value


def _ordinals(sample: TpuSample) -> dict[int, int]:
    """chip id → device ordinal on this host (the n-th chip of the host by chip id)."""
    layout = host_chips(sample.accelerator_type, sample.topology, sample.worker_id)
    return {chip_id: n for n, (chip_id, _) in enumerate(layout)}


def _stamp(out: Any, ms: int) -> None:
    out.seconds, millis = divmod(ms, 1000)
    out.nanos = millis * 1_000_000
