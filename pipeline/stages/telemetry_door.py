"""The telemetry stage's door: a record's time, identity and window checked before any detector.

Its time against the partition's robust clock (and the wall clock, where the driver has one),
its identity against the inventory, its window against the key's closed ones. A host whose
clock goes off gets a watch-only `clock_skew` finding, and one when it comes back.
"""

from __future__ import annotations

import msgspec

from pipeline.config import Settings
from pipeline.detect.skew import skew_finding
from pipeline.model import (
    FabricSample,
    Finding,
    GpuSample,
    Inventory,
    Target,
    TpuSample,
    XidEvent,
)
from pipeline.stages.base import Refusal
from pipeline.stages.clock import RobustClock
from pipeline.stages.keys import record_key
from pipeline.stages.telemetry_state import (
    CLOCK_MOVERS,
    Telemetry,
    TelemetryState,
    host_offset,
)


def door(
    state: TelemetryState | None,
    event: Telemetry,
    clock: RobustClock,
    settings: Settings,
    wall_ms: int | None = None,
) -> tuple[TelemetryState, Telemetry | None, Refusal | None, list[Finding]]:
    """Check a record at the door. Returns the state, the event to process (None when
    refused; with the inventory's identity when mismatches are only flagged), the refusal,
    and a watch-only clock_skew finding when the host's clock goes off or comes back."""
    state = state or TelemetryState()
    key = record_key(event)
    verdict = clock.check(event.ts, wall_ms, key)
    reference = clock.reference()
    if verdict is not None:
        if verdict.reason == "ahead":
            clock.claim(key, event.ts)  # a quorum of such claims moves the clock (clock.py)
        state.heard_ms = reference if reference is not None else state.heard_ms
        skew = _skew_finding(state, event, reference, verdict.skew_ms, settings)
        return state, None, Refusal(verdict.reason, verdict.message), skew
    findings = _skew_finding(state, event, reference, clock.skew(event.ts), settings)
    if isinstance(event, GpuSample) and reference is not None:
        # liveness from arrival (on_time): how far behind the clock it stamps. Never ahead: a
        # record past the clock is a stream resuming (the clock follows), or a host ahead,
        # whose records already look fresh
        state.offset_ms = max(0, reference - event.ts)
    elif isinstance(event, TpuSample) and reference is not None:
        # the same per host, ahead too: the hosts of a slice are judged against each other
        # (detect/tpu.check_stale_tpu), so one ahead must not make its siblings look silent
        state.host_offsets[event.node] = reference - event.ts
    refusal = _identity(state.inventory, event)
    if refusal is not None:
        if settings.inventory.on_mismatch == "dead_letter":
            return state, None, refusal, findings
        assert state.inventory is not None  # a mismatch needs an inventory record
        event = msgspec.structs.replace(
            event, pool=state.inventory.pool, zone=state.inventory.zone
        )
    window = state.window
    # a TPU host stamping behind is judged in its own time base: the slice's windows are closed
    # by its other hosts (telemetry_state.on_telemetry moves its samples into them)
    ts = event.ts + (host_offset(state, event.node) if isinstance(event, TpuSample) else 0)
    if isinstance(event, CLOCK_MOVERS) and window is not None and ts < window.closed_before:
        late = Refusal(
            "late",
            f"$.ts: expected an event time at or after {window.closed_before} (the windows "
            f"before it are closed and written), got {event.ts}",
        )
        return state, None, late, findings
    return state, event, None, findings


def _identity(inventory: Inventory | None, event: Telemetry) -> Refusal | None:
    if inventory is None:
        return None
    for field, expected in (("pool", inventory.pool), ("zone", inventory.zone)):
        got = getattr(event, field)
        if got != expected:
            return Refusal(
                "inventory_mismatch",
                f"$.{field}: expected {expected!r} (the inventory's {field} of "
                f"{record_key(inventory)}), got {got!r}",
            )
    return None


def _skew_finding(
    state: TelemetryState,
    event: Telemetry,
    reference: int | None,
    off_ms: int | None,
    settings: Settings,
) -> list[Finding]:
    """Open a clock_skew episode when a host's clock is off, close it when it is back."""
    if reference is None:
        return []
    is_off = off_ms is not None and abs(off_ms) > settings.clock.skew_finding_s * 1000
    if is_off == (state.skew_since is not None):
        return []
    since = state.skew_since if state.skew_since is not None else reference
    state.skew_since = reference if is_off else None
    return [skew_finding(_target_of(event), since, reference, off_ms, is_off)]


def _target_of(event: Telemetry) -> Target:
    if isinstance(event, GpuSample | XidEvent | FabricSample):
        return Target(
            cluster=event.cluster, kind="node", name=event.node, pool=event.pool, zone=event.zone
        )
    return Target(
        cluster=event.cluster, kind="slice", name=event.slice, pool=event.pool, zone=event.zone
    )
