"""A training job's per-rank step compute time from Prometheus, joined into the GPU readings.

DCGM says how fast a GPU clocks and how busy it is, not how long its share of a step takes. A
job that publishes it does so per rank, as a gauge (sources.prometheus_step_metric, default
`job_step_compute_seconds`): the seconds the rank's last step spent computing, waits in
collectives left out, labelled with the node (the same labels as the DCGM series: `node`,
`Hostname`, … or the host of `instance`) and `gpu` (the GPU index the rank runs on, as in
dcgm-exporter). Only compute time tells a slow rank from the ranks that wait for it: in a
synchronous job every rank's whole step takes the same time.

The job's exporter is its own scrape target, so its timestamps are not the DCGM scrape's: a
reading takes the newest point of its node and GPU at or before its own timestamp, at most
`STEP_MAX_AGE_MS` older (Prometheus's own staleness is 5 minutes; a step figure a minute old
no longer describes the step the scrape saw), and of the reading's job when the series names
its pod (`pod`, or `exported_pod`, as for dcgm-exporter): a job that ran on the GPU before is
not this one. MIG instances get none: a rank runs on a GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from pipeline.config import selector_matchers
from pipeline.errors import DecodeError
from pipeline.model import Event, GpuReading, GpuSample
from pipeline.sources.base import BadRecord, Parsed
from pipeline.sources.prometheus_series import (
    Identity,
    gpu_index,
    job_of,
    matrix_series,
    node_name,
    points,
    raw_json,
    shown,
)

STEP_MAX_AGE_MS = 60_000
# (node, gpu) -> [(ts, seconds, the job's pod or "")], sorted
Points = dict[tuple[str, int], list[tuple[int, float, str]]]


def step_selector(metric: str, selector: str = "") -> str:
    """`job_step_compute_seconds{…configured matchers}`."""
    matchers = selector_matchers(selector)
    return f"{metric}{{{matchers}}}" if matchers else metric


def parse_step_series(
    results: Iterable[Mapping[str, Any]], identity: Identity
) -> tuple[Points, list[BadRecord]]:
    """Matrix results of the step metric → points per node and GPU; a malformed series is a
    BadRecord and the others still count."""
    points: Points = {}
    bad: list[BadRecord] = []
    for result in results:
        try:
            node, gpu, series = _series(result, identity)
        except DecodeError as exc:
            bad.append(BadRecord(raw_json(result), exc))
            continue
        points.setdefault((node, gpu), []).extend(series)
    for series in points.values():
        series.sort()
    return points, bad


def _series(
    result: Mapping[str, Any], identity: Identity
) -> tuple[str, int, list[tuple[int, float, str]]]:
    labels, values = matrix_series(result)
    name = str(labels.get("__name__", "step metric"))
    series = [(ts, value) for ts, value in points(values, name) if value is not None]
    if any(not 0 <= value <= 86_400 for _, value in series):
        raise DecodeError(
            field=f"{name}.value", expected="seconds between 0 and 86400", got=shown(values)
        )
    job = job_of(labels) or ""
    return node_name(labels, identity.node_label), gpu_index(labels), [(*p, job) for p in series]


def with_step_times(events: Sequence[Event], points: Points) -> list[Event]:
    """The GPU samples with each whole-GPU reading's step compute time filled in where its
    job published one recently enough; other events as they are."""
    if not points:
        return list(events)
    return [_joined(e, points) if isinstance(e, GpuSample) else e for e in events]


def _joined(sample: GpuSample, points: Points) -> GpuSample:
    gpus = [_reading(sample, gpu, points) for gpu in sample.gpus]
    return msgspec.structs.replace(sample, gpus=gpus)


def _reading(sample: GpuSample, gpu: GpuReading, points: Points) -> GpuReading:
    series = points.get((sample.node, gpu.index))
    if series is None or gpu.mig_instance is not None:
        return gpu
    at = bisect.bisect_right(series, (sample.ts, float("inf"), "")) - 1
    while at >= 0 and sample.ts - series[at][0] <= STEP_MAX_AGE_MS:
        _, seconds, job = series[at]
        if not job or job == gpu.job:  # not a job that ran on the GPU before this one
            return msgspec.structs.replace(gpu, step_compute_s=seconds)
        at -= 1
    return gpu


def joined(parsed: Parsed, results: Iterable[Mapping[str, Any]], identity: Identity) -> Parsed:
    """`parsed` (the DCGM samples of a poll) with the step series of the same window joined."""
    points, bad = parse_step_series(results, identity)
    return Parsed(events=with_step_times(parsed.events, points), bad=[*parsed.bad, *bad])
