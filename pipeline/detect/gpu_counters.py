"""Per-GPU counter rules: ECC, row remap, PCIe replays and link, NVLink errors, SBE noise,
the driver's recovery action, and thermal throttling as evidence for the gauge rules.

Counters stay raw in the samples; rates are derived here from deltas between scrapes, and a
counter that drops was reset (driver reload, GPU reset): it counts from zero again.
"""

from __future__ import annotations

import math

from pipeline.detect import catalog
from pipeline.detect import gpu_metrics as gm
from pipeline.detect.emit import Judgement, Said
from pipeline.detect.episodes import OPEN, counting, rule
from pipeline.detect.findings import evidence
from pipeline.detect.gpu_context import Ctx, GpuDevice, View, verdict
from pipeline.detect.stats import counter_delta

HOUR_MS = 3_600_000
DBE = catalog.GPU_ECC_DBE
SBE = catalog.GPU_ECC_SBE
REMAP_FAILURE = catalog.GPU_REMAP_FAILURE
REMAP_PENDING = catalog.GPU_REMAP_PENDING
PCIE_REPLAY = catalog.GPU_PCIE_REPLAY
PCIE_DOWNGRADE = catalog.GPU_PCIE_DOWNGRADE
NVLINK = catalog.GPU_NVLINK
RECOVERY = catalog.GPU_RECOVERY_ACTION
STEPPED_CHECKS = (REMAP_FAILURE, REMAP_PENDING, PCIE_DOWNGRADE, RECOVERY)
THROTTLE = catalog.GPU_CLOCK_THROTTLE  # gpu_gauges.CLOCK: the check the thermal evidence serves


class Signs:
    """What the counters say about the GPU, for the gauge rules."""

    __slots__ = ("pcie", "slowdown", "thermal")

    def __init__(self, thermal: bool, slowdown: bool, pcie: bool) -> None:
        self.thermal = thermal  # throttled by heat (violation counter or thermal reasons)
        self.slowdown = slowdown  # hardware slowdown reasons (HW thermal, power brake)
        self.pcie = pcie  # PCIe replays or a downgraded link


def counter_rules(ctx: Ctx, dev: GpuDevice, view: View, dt_ms: int) -> Signs:
    """Run every counter rule of one GPU for one scrape."""
    raw = gm.raw_fields(view.metrics)
    if (
        raw == dev.raw
        and dev.at_rest
        and view.busy == dev.was_busy
        and (not dev.wake_ts or ctx.ts < dev.wake_ts)
    ):
        return Signs(dev.thermal_reasons, dev.slowdown_reasons, False)  # nothing to do
    prev = dev.raw or gm.NO_RAW
    deltas = [0.0] * gm.N_COUNTERS
    for i in range(gm.N_COUNTERS):
        value = raw[i]
        if value is not None and value != prev[i]:
            deltas[i] = counter_delta(prev[i], value)
    # An absent field keeps its last value, so the next delta spans the gap.
    if None in raw:
        raw = tuple(p if v is None else v for v, p in zip(raw, prev, strict=True))
    dev.raw = raw
    device = view.device
    _dbe(ctx, dev, device, deltas[gm.I_DBE])
    _row_remap(ctx, dev, device, raw[gm.I_FAILURE], raw[gm.I_PENDING], deltas[gm.I_ROWS])
    pcie_bad = _pcie(ctx, dev, view, deltas[gm.I_PCIE], raw[gm.I_GEN], raw[gm.I_WIDTH])
    _nvlink(ctx, dev, device, sum(deltas[gm.I_NVLINK : gm.I_NVLINK + 4]))
    _sbe(ctx, dev, device, deltas[gm.I_SBE])
    _recovery(ctx, dev, device, raw[gm.I_RECOVERY])
    field = raw[gm.I_REASONS]
    reasons = 0 if field is None else int(field)
    dev.thermal_reasons = reasons & gm.THERMAL_EVIDENCE_MASK != 0
    dev.slowdown_reasons = reasons & gm.HARDWARE_SLOWDOWN_MASK != 0
    dev.was_busy = view.busy
    _settle(ctx, dev)
    fraction = deltas[gm.I_THERMAL] / (dt_ms * 1e6) if dt_ms > 0 else 0.0
    thermal = fraction >= ctx.settings.tuned(THROTTLE).violation_frac or dev.thermal_reasons
    return Signs(thermal, dev.slowdown_reasons, pcie_bad)


def _settle(ctx: Ctx, dev: GpuDevice) -> None:
    """Decide whether the next scrape with unchanged fields can skip the counter rules: no
    stepped check may be counting towards a transition, and `wake_ts` is the first time a
    window or quiet period ends (something then changes with no new data)."""
    s = ctx.settings
    dev.at_rest = not any(
        counting(dev.runs, check, rule(s, check)) for check in STEPPED_CHECKS
    )
    wakes = []
    if dev.nvlink_hits:
        wakes.append(dev.nvlink_hits[0] + s.tuned(NVLINK).nvlink_window_s * 1000)
    if dev.pcie_hits:
        wakes.append(dev.pcie_hits[0][0] + s.tuned(PCIE_REPLAY).pcie_window_s * 1000)
    for last, check in ((dev.last_dbe_ts, DBE), (dev.last_rows_ts, REMAP_PENDING)):
        if last:
            wakes.append(last + s.tuned(check).counter_quiet_s * 1000)
    limit = s.tuned(SBE).sbe_watch_per_hour
    if dev.sbe_hour >= limit / 2:
        halvings = math.log2(dev.sbe_hour / (limit / 2))
        wakes.append(dev.sbe_ts + int(halvings * HOUR_MS) + 1)
    dev.wake_ts = min(wakes) if wakes else 0


def _dbe(ctx: Ctx, dev: GpuDevice, device: str, new: float) -> None:
    # Uncorrectable ECC is a hard fault at the first count; it clears after a quiet spell
    # (the volatile counter also resets with the GPU reset that repairs it).
    bad: bool | None = None
    if new > 0:
        dev.last_dbe_ts, bad = ctx.ts, True
    elif dev.last_dbe_ts and ctx.ts - dev.last_dbe_ts >= quiet_ms(ctx, DBE):
        dev.last_dbe_ts, bad = 0, False

    def say(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"GPU {device}: {new:g} new double-bit (uncorrectable) ECC errors",
                evidence(gm.DBE, new, 0.0, None, 0),
            )
        return f"GPU {device}: no new DBE", None

    ctx.judge(dev, Judgement(DBE, device, bad, say))


def quiet_ms(ctx: Ctx, check: str) -> int:
    """How long a counter check's device must stay quiet before it clears."""
    return ctx.settings.tuned(check).counter_quiet_s * 1000


def _row_remap(
    ctx: Ctx,
    dev: GpuDevice,
    device: str,
    failure: float | None,
    flag: float | None,
    new_rows: float,
) -> None:
    if failure is not None:
        ctx.judge(dev, verdict(
            ctx, device, REMAP_FAILURE, failure >= 1, metric=gm.REMAP_FAILURE, value=failure,
            baseline=0.0, score=None,
            message=lambda: "row remapping failed: no spare rows left (RMA candidate)",
        ))  # fmt: skip
    if new_rows > 0:
        dev.last_rows_ts = ctx.ts
    quiet = quiet_ms(ctx, REMAP_PENDING)
    if flag is not None:
        pending = flag >= 1 or new_rows > 0
    else:  # without the pending field, a new uncorrectable remap means a reset is due
        pending = dev.last_rows_ts > 0 and ctx.ts - dev.last_rows_ts < quiet
    if not pending and dev.last_rows_ts and ctx.ts - dev.last_rows_ts >= quiet:
        dev.last_rows_ts = 0
    ctx.judge(dev, verdict(
        ctx, device, REMAP_PENDING, pending, metric=gm.REMAP_PENDING, value=flag, baseline=0.0,
        score=new_rows, message=lambda: "row remap pending: a GPU reset applies it",
    ))  # fmt: skip


def _pcie(
    ctx: Ctx,
    dev: GpuDevice,
    view: View,
    replays: float,
    gen: float | None,
    width: float | None,
) -> bool:
    """Replays counted over a window (a degrading link ramps up; one retry is nothing), and
    a link that trained down in width (or in generation while busy)."""
    s = ctx.settings.tuned(PCIE_REPLAY)
    hits = dev.pcie_hits
    if replays > 0:
        hits.append((ctx.ts, replays))
    if hits:
        window_ms = s.pcie_window_s * 1000
        while hits and hits[0][0] <= ctx.ts - window_ms:
            hits.pop(0)
    total = sum(count for _, count in hits)
    replaying = total >= s.pcie_replays
    device = view.device

    def say(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"GPU {device}: {total:g} PCIe replays in {s.pcie_window_s} s",
                evidence(gm.PCIE_REPLAY, total, s.pcie_replays, total / s.pcie_replays,
                         s.pcie_window_s),
            )  # fmt: skip
        return f"GPU {device}: no PCIe replays for {s.pcie_window_s} s", None

    # opens when the window's sum reaches the limit, clears when the window holds no replay
    ctx.judge(dev, Judgement(PCIE_REPLAY, device, True if replaying else None if hits else False,
                             say))  # fmt: skip
    if gen is None and width is None:
        return replaying
    # Links train down in gen when idle (power saving), never in width: judge gen only busy.
    downgraded = width is not None and width < dev.best_width
    downgraded |= view.busy and gen is not None and gen < dev.best_gen
    if width is not None and width > dev.best_width:
        dev.best_width = width
    if view.busy and gen is not None and gen > dev.best_gen:
        dev.best_gen = gen
    ctx.judge(dev, verdict(
        ctx, device, PCIE_DOWNGRADE, downgraded, metric=gm.PCIE_WIDTH, value=width,
        baseline=dev.best_width, score=gen,
        message=lambda: f"PCIe link below its best (gen {gen}, width {width})",
    ))  # fmt: skip
    return replaying or downgraded


def _recovery(ctx: Ctx, dev: GpuDevice, device: str, code: float | None) -> None:
    """The driver's own verdict (NVML recovery action, XID 154's payload): act on it."""
    if code is None:
        return
    name, action = gm.recovery(int(code))
    ctx.judge(dev, verdict(
        ctx, device, RECOVERY, code >= 1, action=action, metric=gm.RECOVERY_ACTION, value=code,
        baseline=0.0, score=None,
        message=lambda: f"the driver asks for {name} (recovery action {int(code)})",
    ))  # fmt: skip


def _nvlink(ctx: Ctx, dev: GpuDevice, device: str, errors: float) -> None:
    # A correctable burst (errors for a few seconds, CRC + retry) is noise; errors in several
    # scrapes spread over minutes are a link going bad.
    hits = dev.nvlink_hits
    if errors > 0:
        hits.append(ctx.ts)
    if not hits:
        return
    s = ctx.settings.tuned(NVLINK)
    window_ms = s.nvlink_window_s * 1000
    while hits and hits[0] <= ctx.ts - window_ms:
        hits.pop(0)
    spread = hits[-1] - hits[0] if hits else 0
    qualifies = len(hits) >= s.nvlink_error_scrapes and spread >= s.nvlink_span_s * 1000

    def say(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"GPU {device}: NVLink errors in {len(hits)} scrapes within "
                f"{s.nvlink_window_s} s",
                evidence("DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL", errors, 0.0, len(hits),
                         s.nvlink_window_s),
            )  # fmt: skip
        return f"GPU {device}: NVLink quiet", None

    # opens when the window's scrapes qualify, clears when the window holds none
    ctx.judge(dev, Judgement(NVLINK, device, True if qualifies else None if hits else False, say))


def _sbe(ctx: Ctx, dev: GpuDevice, device: str, new: float) -> None:
    # Single-bit errors come in huge harmless bursts on a few GPUs: at most a watch finding
    # (lemon-node scoring), never a cordon. A count that halves every hour ~ per-hour rate.
    if new <= 0 and dev.sbe_hour <= 0:
        return
    dev.sbe_hour = dev.sbe_hour * 0.5 ** ((ctx.ts - dev.sbe_ts) / HOUR_MS) + new
    dev.sbe_ts = ctx.ts
    limit = ctx.settings.tuned(SBE).sbe_watch_per_hour
    bad: bool | None = None
    if dev.sbe_hour >= limit:
        bad = True
    elif dev.sbe_hour < limit / 2:
        if dev.sbe_hour < 1:
            dev.sbe_hour = 0.0
        bad = False
    rate = dev.sbe_hour

    def say(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"GPU {device}: ~{rate:.0f} single-bit ECC errors in the last hour",
                evidence(gm.SBE, rate, limit, None, 3600),
            )
        return f"GPU {device}: SBE rate low", None

    ctx.judge(dev, Judgement(SBE, device, bad, say))
