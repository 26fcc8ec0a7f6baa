"""libtpu runtime metrics (gRPC, on the TPU host) → TpuSample and IciSample for this host.

The service is `tpu.monitoring.runtime.RuntimeMetricService` on localhost:8431
(reference/data-shapes.md §3.3; messages from sources/libtpu_proto.py). Chip metrics carry the
device ordinal as `attribute{key: "device-id", value.int_attr}`, as libtpu's memory and duty
cycle metrics do; ICI link metrics carry a key-value list (`device_ordinal`, `port`,
`peer_chip_id`, `link`). The ICI names and their attributes are not public: libtpu's TPU
Monitoring Library exposes `ici_link_health` as per-link strings like `tray1.chip3.ici0.int`
and some builds `ici_flits_tx/rx`; the names below are FleetPulse's [I], served by the
stand-in and read here. Device ordinals map to slice chip ids through the host's place in the
slice (sources/tpu_hosts.py); a missing `peer_chip_id` is looked up in the ICI topology.

Position: the newest chip and link timestamps published; an unchanged reading is not
published twice.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from pipeline.catalog import ici_neighbours, slice_shape
from pipeline.config import SourcesSettings
from pipeline.errors import ConfigError, DecodeError, SourceError
from pipeline.model import Event, IciLink, IciSample, TpuSample
from pipeline.sources.base import (
    BadRecord,
    Batch,
    Parsed,
    load_checkpoint,
    save_checkpoint,
    validated,
)
from pipeline.sources.libtpu_proto import runtime_protocol
from pipeline.sources.tpu_hosts import TpuHost, host_chips, tpu_sample

# libtpu metric name → TpuChipReading metric (as tpu-info reads them, §3.3)
CHIP_METRICS: dict[str, str] = {
    "tpu.runtime.tensorcore.dutycycle.percent": "duty_cycle_pct",
    "tpu.runtime.hbm.memory.usage.bytes": "hbm_used_bytes",
    "tpu.runtime.hbm.memory.total.bytes": "hbm_total_bytes",
    "tpu.runtime.hbm.utilization.percent": "memory_bandwidth_util",  # HBM bandwidth
    "tpu.runtime.tensorcore.utilization.percent": "tensorcore_util",  # [I]
}
# Chip metrics the simulator has beyond those travel under this prefix (stand-in only).
EXTRA_CHIP_PREFIX = "tpu.runtime.chip."
# libtpu metric name → IciLink field [I]
ICI_METRICS: dict[str, str] = {
    "tpu.runtime.ici.link.health": "health",
    "tpu.runtime.ici.flits.tx.count": "flits_tx",
    "tpu.runtime.ici.flits.rx.count": "flits_rx",
    "tpu.runtime.ici.errors.count": "errors",
}
DEVICE_KEY = "device-id"


class RuntimePosition(msgspec.Struct, frozen=True):
    chips_ts_ms: int = 0
    links_ts_ms: int = 0


# --- the pure parser ------------------------------------------------------------------------


def parse_runtime_metrics(responses: Mapping[str, Any], host: TpuHost) -> Parsed:
    """{libtpu metric name: MetricResponse} → one TpuSample and one IciSample (when present)."""
    parsed = Parsed()
    chips: dict[int, dict[str, float]] = {}
    links: dict[tuple[int, int], dict[str, Any]] = {}
    chip_ts = link_ts = 0
    for name, response in responses.items():
        try:
            if name in ICI_METRICS:
                link_ts = max(link_ts, _add_links(links, name, response.metric.metrics))
            else:
                chip_ts = max(chip_ts, _add_chips(chips, name, response.metric.metrics))
        except DecodeError as exc:
            parsed.bad.append(BadRecord(response.SerializeToString(), exc))
    builds: list[Callable[[], Event]] = []
    if chips:
        builds.append(lambda: tpu_sample(host, chip_ts, chips))
    if links:
        builds.append(lambda: _ici_sample(host, link_ts, links))
    for build in builds:
        try:
            parsed.events.append(validated(build()))
        except DecodeError as exc:
            parsed.bad.append(BadRecord(repr((chips, links)).encode(), exc))
        except ValueError as exc:
            error = DecodeError(field=host.node, expected="valid TPU host metrics", got=str(exc))
            parsed.bad.append(BadRecord(repr((chips, links)).encode(), error))
    return parsed


def _add_chips(chips: dict[int, dict[str, float]], name: str, metrics: Iterable[Any]) -> int:
    field = CHIP_METRICS.get(name) or name.removeprefix(EXTRA_CHIP_PREFIX)
    newest = 0
    for metric in metrics:
        if (
            metric.attribute.key != DEVICE_KEY
            or metric.attribute.value.WhichOneof("attr") != "int_attr"
        ):
            raise DecodeError(
                field=f"{name}.attribute",
                expected=f'{{key: "{DEVICE_KEY}", value: {{int_attr: <ordinal>}}}}',
                got=repr(str(metric.attribute).strip()),
            )
        chips.setdefault(metric.attribute.value.int_attr, {})[field] = _number(name, metric)
        newest = max(newest, _ms(metric.timestamp))
    return newest


def _add_links(
    links: dict[tuple[int, int], dict[str, Any]], name: str, metrics: Iterable[Any]
) -> int:
    field = ICI_METRICS[name]
    newest = 0
    for metric in metrics:
        attrs = _kvlist(name, metric)
        try:
            ordinal, port = int(attrs["device_ordinal"]), int(attrs["port"])
        except (KeyError, ValueError):
            raise DecodeError(
                field=f"{name}.attribute",
                expected="a kvlist with device_ordinal and port",
                got=repr(attrs),
            ) from None
        link = links.setdefault((ordinal, port), {})
        link[field] = int(_number(name, metric))
        if "peer_chip_id" in attrs:
            link["peer_chip_id"] = int(attrs["peer_chip_id"])
        newest = max(newest, _ms(metric.timestamp))
    return newest


def _kvlist(name: str, metric: Any) -> dict[str, Any]:
    value = metric.attribute.value
    if value.WhichOneof("attr") != "kvlist_attr":
        raise DecodeError(field=f"{name}.attribute", expected="a kvlist_attr", got=repr(str(value)))
    attrs: dict[str, Any] = {}
    for attribute in value.kvlist_attr.attributes:
        kind = attribute.value.WhichOneof("attr")
        attrs[attribute.key] = getattr(attribute.value, kind) if kind else None
    return attrs


def _number(name: str, metric: Any) -> float:
    measure = metric.WhichOneof("measure")
    holder = getattr(metric, measure) if measure in ("gauge", "counter") else None
    kind = holder.WhichOneof("value") if holder is not None else None
    if holder is None or kind not in ("as_double", "as_int"):
        raise DecodeError(
            field=f"{name}.measure", expected="a gauge or counter number", got=repr(measure or kind)
        )
    return float(getattr(holder, kind))


def _ms(timestamp: Any) -> int:
    return int(timestamp.seconds) * 1000 + int(timestamp.nanos) // 1_000_000


def _ici_sample(
    host: TpuHost, ts: int, links: Mapping[tuple[int, int], dict[str, Any]]
) -> IciSample:
    layout = host_chips(host.accelerator_type, host.topology, host.worker_id)
    shape = slice_shape(host.accelerator_type, host.topology)
    out = []
    for (ordinal, port), fields in sorted(links.items()):
        if not 0 <= ordinal < len(layout):
            raise ValueError(f"device ordinal {ordinal}: the host has {len(layout)} chips")
        chip_id = layout[ordinal][0]
        peer = fields.get("peer_chip_id")
        if peer is None:
            peer = dict(ici_neighbours(shape, chip_id)).get(port)
        if peer is None:
            raise ValueError(f"chip {chip_id} has no ICI port {port} in {host.topology}")
        out.append(
            IciLink(
                chip_id=chip_id,
                port=port,
                peer_chip_id=peer,
                health=fields.get("health", 0),
                flits_tx=fields.get("flits_tx", 0),
                flits_rx=fields.get("flits_rx", 0),
                errors=fields.get("errors"),
            )
        )
    return IciSample(
        ts=ts,
        cluster=host.cluster,
        node=host.node,
        pool=host.pool,
        zone=host.zone,
        slice=host.slice,
        links=out,
    )


# --- the I/O side ---------------------------------------------------------------------------


def host_from_settings(settings: SourcesSettings) -> TpuHost:
    missing = [
        key
        for key in ("tpu_slice", "tpu_accelerator_type", "tpu_topology")
        if not getattr(settings, key)
    ]
    if missing:
        raise ConfigError(f"sources.{', sources.'.join(missing)} must be set for tpu_runtime")
    return TpuHost(
        cluster=settings.cluster,
        node=settings.node or socket.gethostname(),
        pool=settings.pool,
        zone=settings.zone,
        slice=settings.tpu_slice,
        accelerator_type=settings.tpu_accelerator_type,
        topology=settings.tpu_topology,
        worker_id=settings.tpu_worker_id,
    )


class TpuRuntimeSource:
    name = "tpu_runtime"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        host: TpuHost | None = None,
        checkpoint: Path | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        import grpc

        self._host = host or host_from_settings(settings)
        self._checkpoint = checkpoint or Path(settings.state_dir) / "tpu_runtime.json"
        self._timeout = timeout_s
        self._rpc_error = grpc.RpcError
        protocol = runtime_protocol()
        messages = protocol.messages
        self._channel = grpc.insecure_channel(settings.tpu_runtime_endpoint)
        self._get: Callable[..., Any] = self._channel.unary_unary(
            protocol.method("GetRuntimeMetric"),
            request_serializer=messages["MetricRequest"].SerializeToString,
            response_deserializer=messages["MetricResponse"].FromString,
        )
        self._list: Callable[..., Any] = self._channel.unary_unary(
            protocol.method("ListSupportedMetrics"),
            request_serializer=messages["ListSupportedMetricsRequest"].SerializeToString,
            response_deserializer=messages["ListSupportedMetricsResponse"].FromString,
        )
        self._messages = messages
        self.position = load_checkpoint(self._checkpoint, RuntimePosition) or RuntimePosition()

    def supported(self) -> list[str]:
        request = self._messages["ListSupportedMetricsRequest"]()
        response = self._call(self._list, request, "ListSupportedMetrics")
        return [m.metric_name for m in response.supported_metric]

    def poll(self) -> Batch:
        wanted = [
            name
            for name in self.supported()
            if name in CHIP_METRICS or name in ICI_METRICS or name.startswith(EXTRA_CHIP_PREFIX)
        ]
        responses = {
            name: self._call(self._get, self._messages["MetricRequest"](metric_name=name), name)
            for name in wanted
        }
        parsed = parse_runtime_metrics(responses, self._host)
        fresh: list[Event] = []
        chips_ts, links_ts = self.position.chips_ts_ms, self.position.links_ts_ms
        for event in parsed.events:
            if isinstance(event, TpuSample) and event.ts > self.position.chips_ts_ms:
                fresh.append(event)
                chips_ts = event.ts
            elif isinstance(event, IciSample) and event.ts > self.position.links_ts_ms:
                fresh.append(event)
                links_ts = event.ts
        return Batch(fresh, parsed.bad, RuntimePosition(chips_ts, links_ts))

    def _call(self, method: Callable[..., Any], request: Any, what: str) -> Any:
        try:
            return method(request, timeout=self._timeout)
        except self._rpc_error as exc:
            raise SourceError(f"libtpu runtime {what}: {exc}") from exc

    def commit(self, position: msgspec.Struct | None) -> None:
        if isinstance(position, RuntimePosition):
            save_checkpoint(self._checkpoint, position)
            self.position = position

    def close(self) -> None:
        self._channel.close()
