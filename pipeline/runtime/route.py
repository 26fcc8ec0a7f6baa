"""Per-key dispatch shared by both runtimes: which pure function a record goes to, under what key.

The embedded runtime (pipeline/runtime/embedded.py) and the faust app (streams/) call only
these functions, so a test of one runtime is a test of the logic of both. Each `on_*`
function takes the key's state (or None for a new key) and returns the new state and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from pipeline import aggregate, detect, health, policy
from pipeline.config import Settings
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    NodeState,
    Proposal,
    Target,
    TpuSample,
    Utilization,
    XidEvent,
)
from pipeline.runtime.topics import record_key, scoped

# Staleness is checked each time event time crosses a TICK_MS boundary; both runtimes use
# the boundary itself as "now", so replays and the two runtimes agree on finding ids.
TICK_MS = 10_000
REPUBLISH_MS = 5 * 60_000
Telemetry = GpuSample | XidEvent | TpuSample | IciSample
HealthSignal = Finding | NodeEvent | Action
PolicySignal = Proposal | NodeState | CapacityEvent
S = TypeVar("S")


class TelemetryState(msgspec.Struct, kw_only=True):
    """Everything the telemetry stage keeps for one node (GPU + XID) or one slice (TPU + ICI)."""

    gpu: detect.GpuNodeState | None = None
    xid: detect.XidState | None = None
    tpu: detect.TpuSliceState | None = None
    ici: detect.IciSliceState | None = None
    window: aggregate.WindowState | None = None


def tick_boundary(ts: int) -> int:
    return ts - ts % TICK_MS


def telemetry_key(event: Telemetry) -> str:
    return record_key(event)


def on_telemetry(
    state: TelemetryState | None, event: Telemetry, settings: Settings
) -> tuple[TelemetryState, list[Finding], list[Utilization]]:
    state = state or TelemetryState()
    rows: list[Utilization] = []
    if isinstance(event, GpuSample):
        state.gpu, findings = detect.detect_gpu(state.gpu, event, settings.detect)
        state.window, rows = aggregate.aggregate(state.window, event, settings.aggregate)
    elif isinstance(event, XidEvent):
        state.xid, findings = detect.detect_xid(state.xid, event, settings.detect)
    elif isinstance(event, TpuSample):
        state.tpu, findings = detect.detect_tpu(state.tpu, event, settings.detect)
        state.window, rows = aggregate.aggregate(state.window, event, settings.aggregate)
    else:
        state.ici, findings = detect.detect_ici(state.ici, event, settings.detect)
    return state, findings, rows


def on_time(
    state: TelemetryState, now_ms: int, settings: Settings
) -> tuple[TelemetryState, list[Finding]]:
    """Event time moved on in this partition: a node or host that stopped reporting is news."""
    findings: list[Finding] = []
    if state.gpu is not None:
        state.gpu, stale = detect.check_stale_gpu(state.gpu, now_ms, settings.detect)
        findings += stale
    if state.xid is not None:
        state.xid, closed = detect.expire_xid(state.xid, now_ms, settings.detect)
        findings += closed
    if state.tpu is not None:
        state.tpu, stale = detect.check_stale_tpu(state.tpu, now_ms, settings.detect)
        findings += stale
    return state, findings


def close_silent_windows(
    state: TelemetryState, now_ms: int, settings: Settings
) -> tuple[TelemetryState, list[Utilization]]:
    """A key silent for two windows has its open windows closed on the partition's time, so a
    node that died still has its last minutes in the lake. Keys that report close their own
    windows as their data moves on, which keeps late-arrival rules per key."""
    window = state.window
    if window is None or not window.open:
        return state, []
    if now_ms - window.newest_ts < 2 * settings.aggregate.window_s * 1000:
        return state, []
    state.window, rows = aggregate.advance(window, now_ms, settings.aggregate)
    return state, rows


def on_announcement(
    state: TelemetryState | None, event: NodeEvent | CapacityEvent
) -> TelemetryState:
    """Someone says this node or slice goes away on purpose (drained, deleted, maintenance,
    preemption): silence after that is expected, not a failure. Keyed by the event's target,
    which is the telemetry key of that node or slice."""
    state = state or TelemetryState()
    if state.gpu is not None:
        state.gpu = detect.note_event(state.gpu, event)
    if state.tpu is not None:
        state.tpu = detect.note_event(state.tpu, event)
    return state


def announcement_key(event: NodeEvent | CapacityEvent) -> str | None:
    if event.target is None or event.cluster is None:
        return None  # a zone-wide capacity event names no node or slice
    return scoped(event.cluster, event.target)


def flush_windows(state: TelemetryState) -> list[Utilization]:
    """End of stream: close the windows still open (embedded runtime, backtests)."""
    return aggregate.flush(state.window) if state.window is not None else []


def health_key(signal: HealthSignal) -> str:
    if isinstance(signal, Finding):
        return target_name(signal.entity.target)
    if isinstance(signal, Action):
        return target_name(signal.target)
    return scoped(signal.cluster, signal.target)


def target_name(target: Target) -> str:
    """The key of everything about one node or slice: `cluster/name`."""
    return scoped(target.cluster, target.name)


def on_health(
    state: health.HealthState | None, signal: HealthSignal, settings: Settings
) -> tuple[health.HealthState, list[Proposal], NodeState | None]:
    """Returns the node state to publish when it changed (or on first sight), else None."""
    before = None if state is None else health.to_node_state(state)
    state, proposals = health.transition(state, signal, settings.health)
    after = health.to_node_state(state)
    changed = before is None or _state_changed(before, after)
    return state, proposals, after if changed else None


def _state_changed(before: NodeState, after: NodeState) -> bool:
    # `ts` moves with every heartbeat; a change of what the state says is news, and so is the
    # first signal of each REPUBLISH_MS of event time: the policy has no clock but its inputs,
    # and maintenance lead times or throttled proposals must not wait for the next failure.
    if before.ts // REPUBLISH_MS != after.ts // REPUBLISH_MS:
        return True
    return msgspec.structs.replace(before, ts=after.ts) != after


def pool_key(target: Target) -> str:
    """The policy's key: pool names repeat across clusters (GKE's "default-pool"), budgets
    must not, so a pool is named within its cluster."""
    return f"{target.cluster}/{target.pool}"


def policy_key(signal: Proposal | NodeState) -> str:
    return pool_key(signal.target)


def capacity_pools(event: CapacityEvent, pools_by_zone: Mapping[str, Iterable[str]]) -> list[str]:
    """Capacity events are keyed by zone; the policy is per pool. An event naming its pool goes
    to that pool, a zone-wide one (quota, stock-out) to every pool known in the zone."""
    known = sorted(pools_by_zone.get(event.zone, ()))
    if event.pool is not None and event.cluster is not None:
        return [f"{event.cluster}/{event.pool}"]
    if event.pool is not None:
        return [key for key in known if key.partition("/")[2] == event.pool]
    return known


def on_policy(
    state: policy.PolicyState | None, signal: PolicySignal, settings: Settings
) -> tuple[policy.PolicyState, list[Action], list[Alert]]:
    return policy.decide(state, signal, settings.policy)


_ENCODER = msgspec.msgpack.Encoder()


def encode_state(state: Any) -> bytes:
    """States go into faust tables as msgpack (compact, and msgspec Structs round-trip)."""
    return _ENCODER.encode(state)


def decode_state(raw: bytes, cls: type[S]) -> S:
    return msgspec.msgpack.decode(raw, type=cls)
