"""Event-time tumbling windows: GPU and TPU samples → one Utilization row per device per window.

State is per key (a node for GPU samples, a slice for TPU samples: a slice's hosts meet in one
partition). The key's watermark is the newest event time it has seen minus the grace period; a
window closes when the watermark passes its end, never by the wall clock. A sample that falls
into a window already closed is late: it is counted in `WindowState.late` and dropped, because
its window's row has gone out and rows are never amended.

Pure: no I/O, no clock. Like every stage's state (pipeline/stages/topology.py), the state is
updated in place: `aggregate` and `advance` change the state they are given and return it.
"""

from __future__ import annotations

import msgspec

from pipeline.config import AggregateSettings
from pipeline.model import GpuSample, TpuSample, Utilization

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_FB_FREE = "DCGM_FI_DEV_FB_FREE"
GPU_POWER = "DCGM_FI_DEV_POWER_USAGE"
TPU_UTIL = "duty_cycle_pct"
TPU_HBM_USED = "hbm_used_bytes"
TPU_HBM_TOTAL = "hbm_total_bytes"


class DeviceWindow(msgspec.Struct, kw_only=True, gc=False):
    """Running sums for one device in one open window (updated in place)."""

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
    step_sum: float = 0.0  # the job's per-rank step compute time (gpu_sample/3), summed
    step_n: int = 0


class WindowState(msgspec.Struct, kw_only=True):
    """Open windows of one key, its watermark and its counters.

    Invariant: every open window starts at or after `closed_before` (a sample for an earlier
    window is late, and closing removes every window before the new bound)."""

    window_s: int = 60  # the window length these windows were opened with
    newest_ts: int = 0  # newest event time seen; the watermark is this minus the grace period
    closed_before: int = 0  # every window starting before this has been emitted
    late: int = 0  # samples that arrived after their window closed (dropped)
    no_util: int = 0  # device readings without a utilization metric (nothing to average)
    open: dict[str, DeviceWindow] = {}


def aggregate(
    state: WindowState | None, sample: GpuSample | TpuSample, settings: AggregateSettings
) -> tuple[WindowState, list[Utilization]]:
    """Add one sample to its window (in place); return the state and the rows of windows it
    closed."""
    state = state or WindowState(window_s=settings.window_s)
    window_ms = settings.window_s * 1000
    start = sample.ts - sample.ts % window_ms
    if start < state.closed_before:
        state.late += 1
        return state, []
    # the window key is f"{start}/{node}/{device}"; the readings are summed without building
    # an object per reading (this runs for every device of every scrape)
    prefix = f"{start}/{sample.node}/"
    if isinstance(sample, GpuSample):
        no_util = _add_gpus(state.open, prefix, start, sample)
    else:
        no_util = _add_chips(state.open, prefix, start, sample)
    if sample.ts > state.newest_ts:
        state.newest_ts = sample.ts
    state.no_util += no_util
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
    if closed_before == state.closed_before:
        return state, []  # nothing open starts before it (the invariant of WindowState)
    opened = state.open
    done = [key for key, acc in opened.items() if acc.window_start < closed_before]
    rows = _rows([opened.pop(key) for key in done], settings.window_s)
    state.closed_before = closed_before
    return state, rows


def flush(state: WindowState) -> list[Utilization]:
    """End of stream: the rows of every window still open, in (window, node, device) order."""
    return _rows(list(state.open.values()), state.window_s)


def _add_gpus(opened: dict[str, DeviceWindow], prefix: str, start: int, sample: GpuSample) -> int:
    no_util = 0
    for gpu in sample.gpus:
        metrics = gpu.metrics
        util = metrics.get(GPU_UTIL)
        if util is None:
            no_util += 1
            continue
        used, free = metrics.get(GPU_FB_USED), metrics.get(GPU_FB_FREE)
        mem = _fraction(used, None if used is None or free is None else used + free)
        device = gpu.device
        key = prefix + device
        acc = opened.get(key)
        if acc is None:
            acc = opened[key] = _opened(start, sample, device, gpu.model, gpu.job, util, mem,
                                        metrics.get(GPU_POWER))
        else:
            _accumulate(acc, gpu.job, util, mem, metrics.get(GPU_POWER))
        step = gpu.step_compute_s
        if step is not None:
            acc.step_sum += step
            acc.step_n += 1
    return no_util


def _add_chips(
    opened: dict[str, DeviceWindow], prefix: str, start: int, sample: TpuSample
) -> int:
    no_util = 0
    for chip in sample.chips:
        metrics = chip.metrics
        util = metrics.get(TPU_UTIL)
        if util is None:
            no_util += 1
            continue
        mem = _fraction(metrics.get(TPU_HBM_USED), metrics.get(TPU_HBM_TOTAL))
        device = str(chip.chip_id)
        key = prefix + device
        acc = opened.get(key)
        if acc is None:
            opened[key] = _opened(start, sample, device, sample.accelerator_type, chip.job,
                                  util, mem, None)
        else:
            _accumulate(acc, chip.job, util, mem, None)
    return no_util


def _fraction(used: float | None, total: float | None) -> float | None:
    if used is None or total is None or total <= 0:
        return None
    return _clamp(used / total, 1.0)


def _clamp(value: float, top: float) -> float:
    """min(max(value, 0.0), top), as the builtins pick (ties keep `value`, so -0.0 stays)."""
    if value < 0.0:
        return 0.0
    return top if value > top else value


def _opened(
    start: int,
    sample: GpuSample | TpuSample,
    device: str,
    accelerator: str,
    job: str | None,
    util: float,
    mem: float | None,
    power: float | None,
) -> DeviceWindow:
    # Exporters have been seen to report 101 % and small negatives; the row's contract is 0-100.
    util = _clamp(util, 100.0)
    return DeviceWindow(
        window_start=start,
        cluster=sample.cluster,
        pool=sample.pool,
        zone=sample.zone,
        node=sample.node,
        slice=sample.slice if isinstance(sample, TpuSample) else None,
        device=device,
        accelerator=accelerator,
        job=job,
        allocated=job is not None,
        samples=1,
        util_sum=util,
        util_max=util,
        mem_sum=mem or 0.0,
        mem_n=int(mem is not None),
        power_sum=power or 0.0,
        power_n=int(power is not None),
    )


def _accumulate(
    acc: DeviceWindow, job: str | None, util: float, mem: float | None, power: float | None
) -> None:
    util = _clamp(util, 100.0)  # as in _opened
    # the latest job seen names the window; any job at all makes the device allocated
    if job is not None:
        acc.job = job
        acc.allocated = True
    acc.samples += 1
    acc.util_sum += util
    if util > acc.util_max:  # max(acc.util_max, util), without the call
        acc.util_max = util
    acc.mem_sum += mem or 0.0
    acc.mem_n += mem is not None
    acc.power_sum += power or 0.0
    acc.power_n += power is not None


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
        step_compute_s=acc.step_sum / acc.step_n if acc.step_n else None,
    )
