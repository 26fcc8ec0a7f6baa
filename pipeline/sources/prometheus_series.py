"""Reading Prometheus range-query results: series, points and the labels that name a node,
a GPU and its workload. Shared by the DCGM source (prometheus.py), node_exporter's fabric ports
(prometheus_fabric.py) and the jobs' step times (prometheus_step.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import DecodeError

# After the configured label (Identity.node_label): the fallbacks, in order (module docstring).
_NODE_LABELS = ("node", "Hostname", "hostname")
# Labels Prometheus renames to exported_* when the target has the same ones (honor_labels false):
# then the plain names are the exporter pod's, and the workload's are the exported_ ones.
_EXPORTED = ("exported_pod", "exported_namespace", "exported_container")
_POD_LABELS = ("pod", "pod_name")  # pod_name: dcgm-exporter 1.x (--use-old-namespace)
# Blank/not-supported sentinels that older dcgm-exporter releases printed (dcgm_structs.h):
# INT64 blanks start at 0x7ffffffffffffff0, FP64 blanks at 2**47 (four codes each).
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_FP64_BLANKS = frozenset(float(2**47 + code) for code in range(4))


@dataclass(frozen=True)
class Identity:
    """What the endpoint does not say itself: defaults for missing target labels."""

    cluster: str
    pool: str
    zone: str
    node_label: str = "node"  # sources.prometheus_node_label: tried first for the node name


def matrix_series(result: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[Any]]:
    """The labels and points of one series of a matrix result, or a DecodeError saying what
    a series looks like."""
    labels, values = result.get("metric"), result.get("values")
    if not isinstance(labels, Mapping) or not isinstance(values, list):
        raise DecodeError(
            field="result",
            expected='{"metric": {labels}, "values": [[ts, "value"], …]}',
            got=shown(result),
        )
    return labels, values


def node_name(labels: Mapping[str, Any], node_label: str) -> str:
    names = (node_label, *_NODE_LABELS) if node_label else _NODE_LABELS
    for key in names:
        if labels.get(key):
            return str(labels[key])
    instance = str(labels.get("instance", ""))
    host = instance.rsplit(":", 1)[0].strip("[]") if instance else ""
    if not host:
        raise DecodeError(
            field="labels",
            expected=f"a node name in {', '.join(dict.fromkeys(names))} or instance",
            got=shown(labels),
        )
    return host


def gpu_index(labels: Mapping[str, Any]) -> int:
    text = str(labels.get("gpu", ""))
    if not text.isdigit():
        raise DecodeError(field="labels.gpu", expected='a GPU index like "0"', got=repr(text))
    return int(text)


def points(values: list[Any], name: str) -> Iterable[tuple[int, float | None]]:
    for point in values:
        if not (isinstance(point, list | tuple) and len(point) == 2):
            raise DecodeError(
                field=f"{name}.values", expected="[timestamp, value]", got=shown(point)
            )
        try:
            ts_ms = round(float(point[0]) * 1000)
            value = float(point[1])  # Prometheus sends values as strings
        except (TypeError, ValueError):
            raise DecodeError(
                field=f"{name}.values", expected='[unix seconds, "number"]', got=shown(point)
            ) from None
        if not math.isfinite(value):
            raise DecodeError(field=f"{name}.value", expected="a finite number", got=repr(point[1]))
        yield ts_ms, (None if is_blank(value) else value)


def is_blank(value: float) -> bool:
    return value >= _INT64_BLANK or value in _FP64_BLANKS


def job_of(labels: Mapping[str, Any]) -> str | None:
    """The workload's pod. When Prometheus renamed the exporter's pod labels to exported_*
    (honor_labels false), the plain `pod` is the exporter's own pod: never the job."""
    if any(name in labels for name in _EXPORTED):
        pod = labels.get("exported_pod")
    else:
        pod = next((labels[name] for name in _POD_LABELS if labels.get(name)), None)
    return str(pod) if pod else None


def raw_json(result: object) -> bytes:
    try:
        return json.dumps(result, sort_keys=True, default=str).encode()
    except (TypeError, ValueError):
        return repr(result).encode()


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "…"
