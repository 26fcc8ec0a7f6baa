"""Cloud TPU chip metrics from Cloud Monitoring → TpuSample, one per TPU host per timestamp.

Reads the five `tpu.googleapis.com/accelerator/*` metrics on `tpu_worker` with the real
`MetricServiceClient.list_time_series` (the pager follows `next_page_token`), one request per
metric type because a filter names exactly one. Points of one worker at one end time make one
TpuSample; `accelerator_id` = `<worker_id>-<device ordinal>` picks the chip, and the worker
inventory (sources/tpu_hosts.py) supplies node, slice and pool, which `tpu_worker` lacks.
Cloud Monitoring says nothing of jobs, so `job` stays None.

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
}


class CloudmonPosition(msgspec.Struct, frozen=True):
    last_end_ms: int


# --- the pure parser ------------------------------------------------------------------------


def parse_time_series(series: Iterable[Any], inventory: Inventory) -> Parsed:
    """TimeSeries (proto-plus or raw protobuf) of the TPU metrics → TpuSamples, oldest first."""
    parsed = Parsed()
    groups: dict[tuple[str, str, int], dict[int, dict[str, float]]] = {}
    for one in series:
        try:
            _add(groups, one, inventory)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(_raw(one), exc))
    for (zone, instance, ts), chips in sorted(groups.items(), key=lambda g: (g[0][2], g[0][:2])):
        worker = inventory[(zone, instance)]
        try:
            parsed.events.append(validated(tpu_sample(worker, ts, chips)))
        except DecodeError as exc:
            raw = json.dumps({"worker": instance, "ts": ts, "chips": chips}).encode()
            parsed.bad.append(BadRecord(raw, exc))
        except ValueError as exc:
            error = DecodeError(
                field=f"tpu_worker {instance}",
                expected="values valid for tpu_sample/1",
                got=str(exc),
            )
            raw = json.dumps({"worker": instance, "ts": ts, "chips": chips}).encode()
            parsed.bad.append(BadRecord(raw, error))
    return parsed


def _add(
    groups: dict[tuple[str, str, int], dict[int, dict[str, float]]],
    series: Any,
    inventory: Inventory,
) -> None:
    metric_type = series.metric.type
    if metric_type not in TPU_METRICS:
        raise DecodeError(
            field="metric.type", expected=f"one of {sorted(TPU_METRICS)}", got=repr(metric_type)
        )
    if series.resource.type != RESOURCE_TYPE:
        raise DecodeError(
            field="resource.type", expected=repr(RESOURCE_TYPE), got=repr(series.resource.type)
        )
    resource = dict(series.resource.labels)
    zone, instance = resource.get("location", ""), resource.get("worker_id", "")
    if (zone, instance) not in inventory:
        raise DecodeError(
            field="resource.labels",
            expected="a tpu_worker (location, worker_id) listed in the TPU inventory",
            got=repr((zone, instance)),
        )
    ordinal = _ordinal(dict(series.metric.labels).get("accelerator_id", ""), instance)
    name = TPU_METRICS[metric_type][0]
    for point in series.points:
        ts = _end_ms(point.interval.end_time)
        value = _value(point.value, metric_type)
        groups.setdefault((zone, instance, ts), {}).setdefault(ordinal, {})[name] = value


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
            raise SourceError("sources.cloudmon_inventory is not set: tpu_worker names no node")
        return load_inventory(Path(self._settings.cloudmon_inventory))

    def poll(self) -> Batch:
        end_ms = int((self._clock() - self._settings.cloudmon_lag_s) * 1000)
        oldest = end_ms - int(self._settings.cloudmon_max_lookback_s * 1000)
        start_ms = max(self.position if self.position is not None else oldest, oldest)
        if end_ms <= start_ms:
            return Batch([], [], CloudmonPosition(start_ms))
        inventory = self._current_inventory()  # re-read each poll: workers come and go
        series = [one for t in TPU_METRICS for one in self._list(t, start_ms, end_ms)]
        parsed = parse_time_series(series, inventory)
        return Batch(parsed.events, parsed.bad, CloudmonPosition(end_ms))

    def _list(self, metric_type: str, start_ms: int, end_ms: int) -> list[Any]:
        from google.api_core import exceptions
        from google.cloud import monitoring_v3

        request = monitoring_v3.ListTimeSeriesRequest(
            name=f"projects/{self._settings.cloudmon_project}",
            filter=f'metric.type = "{metric_type}" AND resource.type = "{RESOURCE_TYPE}"',
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
