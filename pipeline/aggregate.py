"""Event-time tumbling windows: GPU and TPU samples → one Utilization row per device per window.

State is per key (a node for GPU samples, a slice for TPU samples: a slice's hosts meet in one
partition). The key's watermark is the newest event time it has seen minus the grace period; a
window closes when the watermark passes its end, never by the wall clock. A sample that falls
into a window already closed is late: it is counted in `WindowState.late` and dropped, because
its window's row has gone out and rows are never amended.

Pure: no I/O, no clock. `aggregate` returns a new state and leaves the one passed in untouched.
"""

from __future__ import annotations

import msgspec

from pipeline.config import AggregateSettings
from pipeline.model import GpuReading, GpuSample, TpuChipReading, TpuSample, Utilization

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_FB_FREE = "DCGM_FI_DEV_FB_FREE"
GPU_POWER = "DCGM_FI_DEV_POWER_USAGE"
TPU_UTIL = "duty_cycle_pct"
TPU_HBM_USED = "hbm_used_bytes"
TPU_HBM_TOTAL = "hbm_total_bytes"


class DeviceWindow(msgspec.Struct, kw_only=True, frozen=True):
    """Running sums for one device in one open window."""

    window_start: int
    cluster: str
    pool: str
    zone: str
    node: str
    slice: str | None
    device: str
    accelerator: str
    job: str | None
    allocated: bool
    samples: int
    util_sum: float
    util_max: float
    mem_sum: float
    mem_n: int
    power_sum: float
    power_n: int


class WindowState(msgspec.Struct, kw_only=True, frozen=True):
    """Open windows of one key, its watermark and its counters."""

    window_s: int = 60  # the window length these windows were opened with
    newest_ts: int = 0  # newest event time seen; the watermark is this minus the grace period
    closed_before: int = 0  # every window starting before this has been emitted
    late: int = 0  # samples that arrived after their window closed (dropped)
    no_util: int = 0  # device readings without a utilization metric (nothing to average)
    open: dict[str, DeviceWindow] = {}


class _Reading(msgspec.Struct, frozen=True):
    """One device's values in one sample, already mapped from GPU or TPU metric names."""

    device: str
    accelerator: str
    job: str | None
    util: float
    mem_frac: float | None
    power: float | None


def aggregate(
    state: WindowState | None, sample: GpuSample | TpuSample, settings: AggregateSettings
) -> tuple[WindowState, list[Utilization]]:
    """Add one sample to its window; return the new state and the rows of windows it closed."""
    state = state or WindowState(window_s=settings.window_s)
    window_ms = settings.window_s * 1000
    start = sample.ts - sample.ts % window_ms
    if start < state.closed_before:
        return msgspec.structs.replace(state, late=state.late + 1), []
    readings, no_util = _readings(sample)
    opened = dict(state.open)
    for reading in readings:
        key = _window_key(start, sample.node, reading.device)
        opened[key] = _accumulate(opened.get(key), start, sample, reading)
    state = msgspec.structs.replace(
        state, newest_ts=max(state.newest_ts, sample.ts), no_util=state.no_util + no_util,
        open=opened,
    )
    return advance(state, state.newest_ts, settings)


def advance(
    state: WindowState, event_time_ms: int, settings: AggregateSettings
) -> tuple[WindowState, list[Utilization]]:
    """Close the windows that event time `event_time_ms` (minus the grace period) has passed.

    `aggregate` calls this with the key's own newest time; a runtime may also call it with the
    time of its whole partition, so a node that stopped reporting still gets its last rows.
    """
    window_ms = settings.window_s * 1000
    watermark = event_time_ms - settings.grace_s * 1000
    closed_before = max(state.closed_before, watermark - watermark % window_ms)
    done = [key for key, acc in state.open.items() if acc.window_start < closed_before]
    if not done and closed_before == state.closed_before:
        return state, []
    opened = {key: acc for key, acc in state.open.items() if acc.window_start >= closed_before}
    rows = _rows([state.open[key] for key in done], settings.window_s)
    return msgspec.structs.replace(state, closed_before=closed_before, open=opened), rows


def flush(state: WindowState) -> list[Utilization]:
    """End of stream: the rows of every window still open, in (window, node, device) order."""
    return _rows(list(state.open.values()), state.window_s)


def _window_key(start: int, node: str, device: str) -> str:
    return f"{start}/{node}/{device}"


def _readings(sample: GpuSample | TpuSample) -> tuple[list[_Reading], int]:
    if isinstance(sample, GpuSample):
        found = [_gpu_reading(gpu) for gpu in sample.gpus]
    else:
        found = [_tpu_reading(chip, sample.accelerator_type) for chip in sample.chips]
    readings = [reading for reading in found if reading is not None]
    return readings, len(found) - len(readings)


def _gpu_reading(gpu: GpuReading) -> _Reading | None:
    metrics = gpu.metrics
    util = metrics.get(GPU_UTIL)
    if util is None:
        return None
    used, free = metrics.get(GPU_FB_USED), metrics.get(GPU_FB_FREE)
    return _Reading(
        device=gpu.device,
        accelerator=gpu.model,
        job=gpu.job,
        util=util,
        mem_frac=_fraction(used, None if used is None or free is None else used + free),
        power=metrics.get(GPU_POWER),
    )


def _tpu_reading(chip: TpuChipReading, accelerator_type: str) -> _Reading | None:
    metrics = chip.metrics
    util = metrics.get(TPU_UTIL)
    if util is None:
        return None
    return _Reading(
        device=str(chip.chip_id),
        accelerator=accelerator_type,
        job=chip.job,
        util=util,
        mem_frac=_fraction(metrics.get(TPU_HBM_USED), metrics.get(TPU_HBM_TOTAL)),
        power=None,
    )


def _fraction(used: float | None, total: float | None) -> float | None:
    if used is None or total is None or total <= 0:
        return None
    return min(max(used / total, 0.0), 1.0)


def _accumulate(
    acc: DeviceWindow | None, start: int, sample: GpuSample | TpuSample, reading: _Reading
) -> DeviceWindow:
    # Exporters have been seen to report 101 % and small negatives; the row's contract is 0-100.
    util = min(max(reading.util, 0.0), 100.0)
    mem, power = reading.mem_frac, reading.power
    if acc is None:
        return DeviceWindow(
            window_start=start,
            cluster=sample.cluster,
            pool=sample.pool,
            zone=sample.zone,
            node=sample.node,
            slice=sample.slice if isinstance(sample, TpuSample) else None,
            device=reading.device,
            accelerator=reading.accelerator,
            job=reading.job,
            allocated=reading.job is not None,
            samples=1,
            util_sum=util,
            util_max=util,
            mem_sum=mem or 0.0,
            mem_n=int(mem is not None),
            power_sum=power or 0.0,
            power_n=int(power is not None),
        )
    return msgspec.structs.replace(
        acc,
        # the latest job seen names the window; any job at all makes the device allocated
        job=reading.job if reading.job is not None else acc.job,
        allocated=acc.allocated or reading.job is not None,
        samples=acc.samples + 1,
        util_sum=acc.util_sum + util,
        util_max=max(acc.util_max, util),
        mem_sum=acc.mem_sum + (mem or 0.0),
        mem_n=acc.mem_n + int(mem is not None),
        power_sum=acc.power_sum + (power or 0.0),
        power_n=acc.power_n + int(power is not None),
    )


def _rows(windows: list[DeviceWindow], window_s: int) -> list[Utilization]:
    windows.sort(key=lambda acc: (acc.window_start, acc.node, len(acc.device), acc.device))
    return [_row(acc, window_s) for acc in windows]


def _row(acc: DeviceWindow, window_s: int) -> Utilization:
    return Utilization(
        window_start=acc.window_start,
        window_s=window_s,
        cluster=acc.cluster,
        pool=acc.pool,
        zone=acc.zone,
        node=acc.node,
        slice=acc.slice,
        device=acc.device,
        accelerator=acc.accelerator,
        job=acc.job,
        allocated=acc.allocated,
        util_mean=min(acc.util_sum / acc.samples, 100.0),
        util_max=acc.util_max,
        # no memory metric in the window reads as 0.0: the v1 row has no way to say "unknown"
        mem_used_frac=acc.mem_sum / acc.mem_n if acc.mem_n else 0.0,
        power_w_mean=acc.power_sum / acc.power_n if acc.power_n else None,
        samples=acc.samples,
    )
