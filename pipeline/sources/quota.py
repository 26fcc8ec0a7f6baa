"""GPU and TPU quota from Cloud Monitoring → CapacityEvents QUOTA_USAGE / QUOTA_CHANGED /
QUOTA_EXCEEDED (reference/data-shapes.md §6.1).

Quota usage is not in the Cloud Quotas API; Cloud Monitoring has it on the monitored resource
`consumer_quota` (labels `project_id`, `service`, `location`):

- `serviceruntime.googleapis.com/quota/allocation/usage` GAUGE INT64, label `quota_metric`
- `serviceruntime.googleapis.com/quota/limit` GAUGE INT64, labels `quota_metric`, `limit_name`
- `serviceruntime.googleapis.com/quota/exceeded` GAUGE BOOL, labels `quota_metric`, `limit_name`

Only accelerator quotas are read (`is_accelerator_quota`): a `quota_metric` of
`compute.googleapis.com` or `tpu.googleapis.com` whose name has a word starting `gpu` or `tpu`
(per-type `nvidia_h100_80gb_gpus`, `preemptible_…`/`committed_…` ones, the project-wide
`gpus_all_regions`, Compute Engine's TPU quotas such as `tpu_v5p_slice` or `Tpus`) or
`reserv` (reservations), and any `tpu.googleapis.com` quota but its API request rates (e.g.
`tpu.googleapis.com/v5p_chips`). The services' other quotas (CPUs, addresses, disks…) come
back from the same filter: they are skipped quietly and counted per quota metric
(`QuotaParsed.skipped`), never dead-lettered, since every poll would send them again.

A usage point and the limit in force at its time make one QUOTA_USAGE; a limit that differs
from the last one seen (kept in the checkpoint) one QUOTA_CHANGED; an exceeded point that
reads true one QUOTA_EXCEEDED.
`location` is a zone, a region or `global`: the event is keyed by zone, so a regional or global
quota is said once per configured zone it covers (`capacity.zones`), as each of them is short.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import DecodeError
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent, QuotaInfo
from pipeline.sources.base import BadRecord, Parsed, validated
from pipeline.sources.gcp_clients import api_call

CONSUMER_QUOTA = "consumer_quota"
QUOTA_USAGE = "serviceruntime.googleapis.com/quota/allocation/usage"
QUOTA_LIMIT = "serviceruntime.googleapis.com/quota/limit"
QUOTA_EXCEEDED = "serviceruntime.googleapis.com/quota/exceeded"
_INT64, _BOOL = 2, 1  # google.api.MetricDescriptor.ValueType
# metric type → (value type, unit), as the stand-in serves them
QUOTA_METRICS: dict[str, tuple[int, str]] = {
    QUOTA_USAGE: (_INT64, "1"),
    QUOTA_LIMIT: (_INT64, "1"),
    QUOTA_EXCEEDED: (_BOOL, "1"),
}
ACCELERATOR_SERVICES = ("compute.googleapis.com", "tpu.googleapis.com")
SOURCE = "gcp.monitoring.quota"
_ACCELERATOR_WORDS = ("gpu", "tpu", "reserv")
# a word: capitalised or lower-case letters, an upper-case run (TPU in TPUV4Pod), or digits
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


@dataclass
class QuotaParsed(Parsed):
    """Parsed, plus the series skipped as not an accelerator quota: quota metric → count."""

    skipped: dict[str, int] = field(default_factory=dict)


def quota_service(quota_metric: str) -> str:
    """`compute.googleapis.com/nvidia_h100_gpus` → `compute.googleapis.com`."""
    return quota_metric.split("/", 1)[0]


def quota_words(quota_metric: str) -> list[str]:
    """The lower-cased words of a quota metric's name: snake_case, kebab-case and CamelCase
    (`compute.googleapis.com/PreemptibleTpus` → ["preemptible", "tpus"])."""
    name = quota_metric.split("/", 1)[-1]
    return [word.lower() for word in _WORD.findall(name)]


def is_accelerator_quota(quota_metric: str) -> bool:
    """Whether a quota metric counts GPUs, TPUs or reservations (see the module's docstring);
    words, not substrings, so that e.g. `outputs` is not read as a TPU."""
    service = quota_service(quota_metric)
    if service not in ACCELERATOR_SERVICES:
        return False
    words = quota_words(quota_metric)
    if any(word.startswith(_ACCELERATOR_WORDS) for word in words):
        return True
    return service == "tpu.googleapis.com" and not any(w.startswith("request") for w in words)


def quota_key(location: str, quota_metric: str) -> str:
    return f"{location}|{quota_metric}"


def zones_of(location: str, zones: Sequence[str]) -> list[str]:
    """The zones a quota location covers: itself, the configured zones of its region, or all
    configured zones for `global`."""
    if location == "global":
        return list(zones)
    if location.count("-") >= 2 and location.rsplit("-", 1)[1].isalpha():
        return [location]  # a zone, e.g. us-central1-a
    return [zone for zone in zones if zone.rsplit("-", 1)[0] == location]


# --- the pure parser ------------------------------------------------------------------------


def parse_quota_series(
    series: Iterable[Any], limits: dict[str, float], zones: Sequence[str]
) -> QuotaParsed:
    """TimeSeries of the three quota metrics → events, oldest first. `limits` (quota key →
    last limit seen) is updated in place: it is the checkpoint's memory of limits. A series of
    a quota that is not an accelerator's is counted in `skipped`, not dead-lettered."""
    parsed = QuotaParsed()
    usage: dict[tuple[str, str, int], float] = {}
    limit_points: dict[tuple[str, str], list[tuple[int, float, str]]] = {}
    exceeded: list[tuple[str, str, int, str]] = []
    for one in series:
        other = _not_accelerator(one)
        if other is not None:
            parsed.skipped[other] = parsed.skipped.get(other, 0) + 1
            continue
        try:
            location, metric, labels = _identity(one)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(_raw(one), exc))
            continue
        for point in one.points:
            ts, value = _end_ms(point.interval.end_time), _value(point.value)
            if one.metric.type == QUOTA_USAGE:
                usage[(location, metric, ts)] = value
            elif one.metric.type == QUOTA_LIMIT:
                limit_points.setdefault((location, metric), []).append(
                    (ts, value, labels.get("limit_name", ""))
                )
            elif value:
                exceeded.append((location, metric, ts, labels.get("limit_name", "")))
    events: list[CapacityEvent] = []
    for key in sorted(limit_points):
        limit_points[key].sort()
    for (location, metric), points in sorted(limit_points.items()):
        for ts, limit, limit_name in points:
            previous = limits.get(quota_key(location, metric))
            if previous is not None and previous != limit:
                events += _events(
                    parsed, "QUOTA_CHANGED", location, metric, ts, limit, None, limit_name, zones,
                    f"Quota '{limit_name or metric}' changed from {previous:g} to {limit:g}",
                )
            limits[quota_key(location, metric)] = limit
    for (location, metric, ts), used in sorted(usage.items()):
        limit_at = _limit_at(limit_points.get((location, metric), []), ts)
        in_force = limit_at if limit_at is not None else limits.get(quota_key(location, metric))
        if in_force is None:
            error = DecodeError(
                field=f"{QUOTA_LIMIT} for {metric} in {location}",
                expected="a limit point at or before the usage point (or one seen before)",
                got="none",
            )
            parsed.bad.append(BadRecord(f"{location} {metric} {ts} {used}".encode(), error))
            continue
        events += _events(
            parsed, "QUOTA_USAGE", location, metric, ts, in_force, used, "", zones,
            f"{metric}: {used:g} of {in_force:g} in use",
        )
    for location, metric, ts, limit_name in sorted(exceeded):
        limit = limits.get(quota_key(location, metric), 0.0)
        used = usage.get((location, metric, ts), limit)
        events += _events(
            parsed, "QUOTA_EXCEEDED", location, metric, ts, limit, used, limit_name, zones,
            f"Quota '{limit_name or metric}' exceeded. Limit: {limit:.1f} in {location}.",
        )
    for event in sorted(events, key=lambda e: (e.ts, e.zone, e.kind)):
        try:
            parsed.events.append(validated(event))
        except DecodeError as exc:
            parsed.bad.append(BadRecord(event.message.encode(), exc))
    return parsed


def _not_accelerator(series: Any) -> str | None:
    """The quota metric of a well-formed quota series that is not an accelerator's, else None
    (a series that is not well-formed is for `_identity` to refuse)."""
    if series.metric.type not in QUOTA_METRICS or series.resource.type != CONSUMER_QUOTA:
        return None
    metric = dict(series.metric.labels).get("quota_metric", "")
    return metric if metric and not is_accelerator_quota(metric) else None


def _identity(series: Any) -> tuple[str, str, dict[str, str]]:
    if series.metric.type not in QUOTA_METRICS:
        raise DecodeError(
            field="metric.type", expected=f"one of {sorted(QUOTA_METRICS)}",
            got=repr(series.metric.type),
        )
    if series.resource.type != CONSUMER_QUOTA:
        raise DecodeError(
            field="resource.type", expected=repr(CONSUMER_QUOTA), got=repr(series.resource.type)
        )
    labels = dict(series.metric.labels)
    metric = labels.get("quota_metric", "")
    if not is_accelerator_quota(metric):
        raise DecodeError(
            field="metric.labels.quota_metric",
            expected="a quota_metric (a GPU, TPU or reservations quota)",
            got=repr(metric),
        )
    location = dict(series.resource.labels).get("location", "")
    if not location:
        raise DecodeError(field="resource.labels.location", expected="a location", got="''")
    return location, metric, labels


def _limit_at(points: list[tuple[int, float, str]], ts: int) -> float | None:
    # the limit in force at `ts`: the newest limit point at or before it
    at = [limit for when, limit, _ in points if when <= ts]
    return at[-1] if at else None


def _events(
    parsed: Parsed,
    kind: str,
    location: str,
    metric: str,
    ts: int,
    limit: float,
    used: float | None,
    limit_name: str,
    zones: Sequence[str],
    message: str,
) -> list[CapacityEvent]:
    """The event of `kind` for each zone `location` covers; one that cannot be built (a zone
    name that is not one) is a BadRecord in `parsed`."""
    out = []
    for zone in zones_of(location, zones):
        try:
            out.append(_event(kind, zone, metric, ts, limit, used, limit_name, message))
        except DecodeError as exc:
            parsed.bad.append(BadRecord(f"{location} {metric} {ts} {zone}".encode(), exc))
    return out


def _event(
    kind: str, zone: str, metric: str, ts: int, limit: float, used: float | None,
    limit_name: str, message: str,
) -> CapacityEvent:
    return CapacityEvent(
            event_id=stable_id("cap", SOURCE, zone, metric, kind, ts),
            ts=ts,
            provider="gcp",
            source=SOURCE,
            kind=kind,  # type: ignore[arg-type]
            severity="warning" if kind == "QUOTA_EXCEEDED" else "info",
            region=zone.rsplit("-", 1)[0],
            zone=zone,
            quota=QuotaInfo(
                metric=metric, limit=limit, usage=used if used is not None else 0.0
            ),
            error_code="QUOTA_EXCEEDED" if kind == "QUOTA_EXCEEDED" else None,
            message=message if kind == "QUOTA_EXCEEDED" or not limit_name
            else f"{message} ({limit_name})",
        )


def _end_ms(end: Any) -> int:
    if isinstance(end, dt.datetime):  # proto-plus: DatetimeWithNanoseconds, tz-aware UTC
        return round(end.timestamp() * 1000)
    return int(end.seconds) * 1000 + int(end.nanos) // 1_000_000


def _value(value: Any) -> float:
    raw = type(value).pb(value) if hasattr(type(value), "pb") else value
    kind = raw.WhichOneof("value")
    if kind == "bool_value":
        return 1.0 if raw.bool_value else 0.0
    if kind == "int64_value":
        return float(raw.int64_value)
    if kind == "double_value":
        return float(raw.double_value)
    raise DecodeError(field="points.value", expected="int64, double or bool", got=repr(kind))


def _raw(series: Any) -> bytes:
    raw = type(series).pb(series) if hasattr(type(series), "pb") else series
    from google.protobuf import json_format

    try:
        return str(json_format.MessageToJson(raw)).encode()
    except (TypeError, AttributeError):
        return repr(series).encode()


# --- the I/O side ---------------------------------------------------------------------------


def list_quota_series(
    client: Any, project: str, start_ms: int, end_ms: int, page_size: int, timeout_s: float
) -> list[Any]:
    """Every accelerator-service series of the three quota metrics in `(start, end]`."""
    from google.cloud import monitoring_v3

    found = []
    for metric_type in QUOTA_METRICS:
        for service in ACCELERATOR_SERVICES:
            request = monitoring_v3.ListTimeSeriesRequest(
                name=f"projects/{project}",
                filter=(
                    f'metric.type = "{metric_type}" AND resource.type = "{CONSUMER_QUOTA}" '
                    f'AND resource.labels.service = "{service}"'
                ),
                interval=monitoring_v3.TimeInterval(
                    start_time=_timestamp(start_ms), end_time=_timestamp(end_ms)
                ),
                view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
                page_size=page_size,
            )
            found += api_call(
                f"list_time_series {metric_type} ({service})",
                _lister(client, request, timeout_s),
            )
    return found


def _lister(client: Any, request: Any, timeout_s: float) -> Callable[[], list[Any]]:
    return lambda: list(client.list_time_series(request=request, timeout=timeout_s))


def _timestamp(ms: int) -> dict[str, int]:
    seconds, millis = divmod(ms, 1000)
    return {"seconds": seconds, "nanos": millis * 1_000_000}
