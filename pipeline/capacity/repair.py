"""Time back in service: from a fault found to the target serving again, stage by stage.

Read from the node states the worker already publishes (fleet.node-state), per node or slice:

    found      the first state out of healthy (suspect, degraded, or straight to cordoned)
    cordoned   the first cordoned (or later) state: out of service from here
    drained    draining over: the first repairing state, or a repair asked (no drain needed)
    requested  the first state whose last action is a repair (repair, repair_slice, replace,
               reboot, reset_gpu), or repairing
    back       back in service: probation or healthy after being out of service (Ready and
               uncordoned, or the slice healthy). "Repaired" means this, not "requested".

A trouble that clears before any cordon never took the target out of service and is not an
outage. An outage still open past `out_of_service_alert_s` is overdue (an alert). Durations
are per stage (found→cordoned, cordoned→drained, drained→requested, requested→back) and end
to end (found→back), p50/p95 per pool and accelerator type. Pure: times come with the states.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from pipeline.model import NodeState

STAGES = ("found", "cordoned", "drained", "requested", "back")
SEGMENTS = (
    ("to_cordon", "found", "cordoned"),
    ("to_drain", "cordoned", "drained"),
    ("to_request", "drained", "requested"),
    ("to_back", "requested", "back"),
    ("end_to_end", "found", "back"),
)
REPAIRS = ("repair", "repair_slice", "replace", "reboot", "reset_gpu")
OUT = ("cordoned", "draining", "repairing")
IN_SERVICE = ("probation", "healthy")
DONE_KEPT = 4096  # finished outages kept for the percentiles, newest


class Outage(msgspec.Struct, kw_only=True):
    target: str  # cluster/name
    pool: str
    zone: str
    accelerator_type: str
    stamps: dict[str, int] = {}  # stage -> event time, ms


class RepairState(msgspec.Struct, kw_only=True):
    open: dict[str, Outage] = {}  # cluster/name -> the outage or trouble in progress
    done: list[Outage] = []  # finished outages, oldest first (at most DONE_KEPT)


def on_node_state(state: RepairState, record: NodeState, accelerator_type: str) -> Outage | None:
    """Take one node state; the outage it finished, if any."""
    target = record.target
    key = f"{target.cluster}/{target.name}"
    current = state.open.get(key)
    if record.state == "healthy" and (current is None or "cordoned" not in current.stamps):
        state.open.pop(key, None)  # a trouble that never took it out of service
        return None
    if current is None:
        if record.state in IN_SERVICE:
            return None
        current = Outage(
            target=key, pool=target.pool, zone=target.zone, accelerator_type=accelerator_type
        )
        state.open[key] = current
    _stamp(current, record)
    if "back" in current.stamps:
        del state.open[key]
        state.done = [*state.done, current][-DONE_KEPT:]
        return current
    return None


def _stamp(outage: Outage, record: NodeState) -> None:
    stamps, ts, name = outage.stamps, record.ts, record.state
    stamps.setdefault("found", ts)
    if name in OUT:
        stamps.setdefault("cordoned", ts)
    requested = record.last_action in REPAIRS or name == "repairing"
    if requested and "cordoned" in stamps:
        stamps.setdefault("drained", ts)
        stamps.setdefault("requested", ts)
    if name in IN_SERVICE and "cordoned" in stamps:
        for stage in ("drained", "requested"):  # released without a repair: zero-length stages
            stamps.setdefault(stage, ts)
        stamps.setdefault("back", ts)


def overdue(state: RepairState, now_ms: int, limit_s: int) -> list[Outage]:
    """Targets out of service longer than `limit_s`, longest first."""
    late = [
        o for o in state.open.values()
        if "cordoned" in o.stamps and now_ms - o.stamps["cordoned"] > limit_s * 1000
    ]
    return sorted(late, key=lambda o: (o.stamps["cordoned"], o.target))


@dataclass(frozen=True)
class SegmentStats:
    pool: str
    accelerator_type: str
    segment: str
    count: int
    p50_s: float
    p95_s: float


def stats(outages: Iterable[Outage]) -> list[SegmentStats]:
    """p50/p95 seconds per pool, type and segment, over finished outages."""
    spans: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for outage in outages:
        for segment, start, end in SEGMENTS:
            if start in outage.stamps and end in outage.stamps:
                seconds = (outage.stamps[end] - outage.stamps[start]) / 1000
                spans[(outage.pool, outage.accelerator_type, segment)].append(seconds)
    return [
        SegmentStats(pool, accelerator, segment, len(v), percentile(v, 50), percentile(v, 95))
        for (pool, accelerator, segment), v in sorted(spans.items())
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
