"""Per-GPU rules: counter rates (ECC, row remap, PCIe, NVLink, throttling) and gauges judged
against the GPU's peers on the node (temperature, SM clock, power).

Peer comparison is what cancels fleet-wide effects (diurnal temperature, a hot afternoon): a
GPU is compared with the other GPUs of its node on the same job at the same instant, and the
difference is then compared with that GPU's *usual* difference, so a GPU that always runs a few
degrees warmer because of where it sits in the chassis is not a fault.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.detect import gpu_metrics as gm
from pipeline.detect.findings import clear_check, evidence, is_open, open_check
from pipeline.detect.stats import MAD_TO_SIGMA, advance, counter_delta, cusum, learn, scale_of
from pipeline.model import Finding, RecommendedAction, Severity

if TYPE_CHECKING:
    from pipeline.config import DetectSettings
    from pipeline.detect.findings import Book
    from pipeline.detect.gpu import GpuDevice

# Scale floors: below these a difference is sensor quantisation, not signal.
TEMP_FLOOR_C = 0.5
CLOCK_FLOOR = 0.005
POWER_FLOOR = 0.02
CUSUM_CAP = 4.0
OPEN, CLEAR = 1, -1
HOUR_MS = 3_600_000

DBE = "gpu.ecc.dbe"
SBE = "gpu.ecc.sbe_rate"
REMAP_FAILURE = "gpu.row_remap.failure"
REMAP_PENDING = "gpu.row_remap.pending"
PCIE_REPLAY = "gpu.pcie.replay_rate"
PCIE_DOWNGRADE = "gpu.pcie.link_downgrade"
NVLINK = "gpu.nvlink.crc_rate"
TEMP = "gpu.temp.peer"
CLOCK = "gpu.clock.throttle"
POWER = "gpu.power.peer"
COUNTER_CHECKS = (REMAP_FAILURE, REMAP_PENDING, PCIE_REPLAY, PCIE_DOWNGRADE)


class Ctx:
    """What every rule of one scrape needs (one per detect_gpu call)."""

    __slots__ = ("alpha", "book", "interval_s", "out", "settings", "ts")

    def __init__(
        self, book: Book, ts: int, settings: DetectSettings, alpha: float, interval_s: float
    ) -> None:
        self.book, self.ts, self.settings = book, ts, settings
        self.alpha, self.interval_s = alpha, interval_s
        self.out: list[Finding] = []

    def emit(self, finding: Finding | None) -> None:
        if finding is not None:
            self.out.append(finding)


class Peers:
    """Median (and MAD) of a peer group's gauges at one instant."""

    __slots__ = ("clock", "n", "n_busy", "power", "temp", "temp_mad")

    def __init__(self) -> None:
        self.n = self.n_busy = 0
        self.temp = self.temp_mad = self.clock = self.power = 0.0


class View:
    """One GPU's reading in one scrape, with the gauges already extracted."""

    __slots__ = ("busy", "clock", "device", "group", "job", "metrics", "power", "temp", "uuid")

    def __init__(
        self, device: str, uuid: str, job: str | None, metrics: dict[str, float], busy_pct: float
    ) -> None:
        self.device, self.uuid, self.job, self.metrics = device, uuid, job, metrics
        # Readings are finite by contract (GpuReading rejects NaN/inf); absent is None.
        self.temp = metrics.get(gm.TEMP)
        self.clock = metrics.get(gm.SM_CLOCK)
        self.power = metrics.get(gm.POWER)
        util = metrics.get(gm.UTIL)
        if util is None:
            util = gm.utilisation(metrics)
        self.busy = util is not None and util >= busy_pct
        # Peers are the GPUs on the same job; without a job label, the ones equally busy.
        self.group = job or ("busy" if self.busy else "idle")

    @property
    def reporting(self) -> bool:
        """A GPU listed with none of its core gauges is as good as gone (NVML returns blanks)."""
        return self.temp is not None or self.clock is not None or self.power is not None


# --- episode tracking --------------------------------------------------------------------


def step(ctx: Ctx, dev: GpuDevice, check: str, bad: bool, persist: int) -> int:
    """Count consecutive bad / good samples of a check on a device.

    Returns OPEN when the bad run reaches `persist`, CLEAR when the good run reaches the clear
    limit, else 0; the caller builds the finding only then (messages cost time).
    """
    streak = dev.streaks.get(check, 0)
    if not bad and streak <= -ctx.settings.clear_persist_samples:
        return 0  # the common case: healthy for a while already
    streak = advance(streak, bad)
    dev.streaks[check] = streak
    if streak == persist:
        return OPEN
    if streak == -ctx.settings.clear_persist_samples:
        return CLEAR
    return 0


def edge(
    ctx: Ctx,
    transition: int,
    device: str,
    check: str,
    persist: int,
    *,
    severity: Severity,
    action: RecommendedAction,
    metric: str,
    value: float | None,
    baseline: float | None,
    score: float | None,
    message: str,
    fatal: bool = False,
) -> None:
    """Emit the finding of an OPEN or CLEAR transition returned by `step`."""
    proof = evidence(metric, value, baseline, score, persist * ctx.interval_s)
    if transition == OPEN:
        ctx.emit(
            open_check(
                ctx.book,
                ctx.ts,
                check=check,
                device=device,
                kind="gpu",
                severity=severity,
                action=action,
                fatal=fatal,
                message=f"GPU {device}: {message}",
                evidence=proof,
            )
        )
    elif transition == CLEAR:
        ctx.emit(
            clear_check(
                ctx.book, ctx.ts, check, device, f"GPU {device}: {check} back to normal", proof
            )
        )


# --- counters ------------------------------------------------------------------------------


def counter_rules(ctx: Ctx, dev: GpuDevice, view: View, dt_ms: int) -> tuple[bool, bool]:
    """ECC, row remap, PCIe, NVLink and throttle counters of one GPU.

    Returns (hardware throttling seen, PCIe trouble seen) as evidence for the gauge rules.
    """
    raw = gm.raw_fields(view.metrics)
    if raw == dev.raw and dev.at_rest and view.busy == dev.was_busy:
        return dev.hardware_reasons, False  # nothing moved and nothing is pending
    prev = dev.raw or gm.NO_RAW
    deltas = [
        0.0 if value is None else counter_delta(prev[i], value)
        for i, value in enumerate(raw[: gm.N_COUNTERS])
    ]
    # An absent field keeps its last value, so the next delta spans the gap.
    dev.raw = tuple(p if v is None else v for v, p in zip(raw, prev, strict=True))
    device = view.device
    _dbe(ctx, dev, device, deltas[gm.I_DBE])
    _row_remap(ctx, dev, device, raw[gm.I_FAILURE], raw[gm.I_PENDING], deltas[gm.I_ROWS])
    pcie_bad = _pcie(ctx, dev, view, deltas[gm.I_PCIE], dt_ms, raw[gm.I_GEN], raw[gm.I_WIDTH])
    _nvlink(ctx, dev, device, sum(deltas[gm.I_NVLINK : gm.I_NVLINK + 4]))
    _sbe(ctx, dev, device, deltas[gm.I_SBE], dt_ms)
    fraction = deltas[gm.I_THERMAL] / (dt_ms * 1e6) if dt_ms > 0 else 0.0
    reasons = raw[gm.I_REASONS]
    dev.hardware_reasons = reasons is not None and int(reasons) & gm.HARDWARE_THROTTLE_MASK != 0
    dev.was_busy = view.busy
    dev.at_rest = _at_rest(dev, ctx.settings.clear_persist_samples)
    return fraction >= ctx.settings.violation_frac or dev.hardware_reasons, pcie_bad


def _at_rest(dev: GpuDevice, clear: int) -> bool:
    """No counter check is open, pending or counting down: unchanged fields need no work."""
    if dev.nvlink_hits or dev.sbe_hour or dev.last_dbe_ts or dev.last_rows_ts:
        return False
    streaks = dev.streaks
    return all(streaks.get(check, -clear) <= -clear for check in COUNTER_CHECKS)


def _dbe(ctx: Ctx, dev: GpuDevice, device: str, new: float) -> None:
    # Uncorrectable ECC is a hard fault at the first count; it clears after a quiet spell
    # (the volatile counter also resets with the GPU reset that repairs it).
    if new > 0:
        dev.last_dbe_ts = ctx.ts
        if not is_open(ctx.book, DBE, device):
            ctx.emit(
                open_check(
                    ctx.book,
                    ctx.ts,
                    check=DBE,
                    device=device,
                    kind="gpu",
                    severity="critical",
                    action="reset_gpu",
                    fatal=True,
                    evidence=evidence(gm.DBE, new, 0.0, None, 0),
                    message=f"GPU {device}: {new:g} new double-bit (uncorrectable) ECC errors",
                )
            )
    elif dev.last_dbe_ts and ctx.ts - dev.last_dbe_ts >= ctx.settings.counter_quiet_s * 1000:
        dev.last_dbe_ts = 0
        ctx.emit(clear_check(ctx.book, ctx.ts, DBE, device, f"GPU {device}: no new DBE"))


def _row_remap(
    ctx: Ctx,
    dev: GpuDevice,
    device: str,
    failure: float | None,
    flag: float | None,
    new_rows: float,
) -> None:
    s = ctx.settings
    if failure is not None:
        transition = step(ctx, dev, REMAP_FAILURE, failure >= 1, 1)
        if transition:
            edge(
                ctx,
                transition,
                device,
                REMAP_FAILURE,
                1,
                severity="critical",
                action="replace",
                fatal=True,
                metric=gm.REMAP_FAILURE,
                value=failure,
                baseline=0.0,
                score=None,
                message="row remapping failed: no spare rows left (RMA candidate)",
            )
    if new_rows > 0:
        dev.last_rows_ts = ctx.ts
    quiet_ms = s.counter_quiet_s * 1000
    if flag is not None:
        pending = flag >= 1 or new_rows > 0
    else:  # without the pending field, a new uncorrectable remap means a reset is due
        pending = dev.last_rows_ts > 0 and ctx.ts - dev.last_rows_ts < quiet_ms
    if not pending and dev.last_rows_ts and ctx.ts - dev.last_rows_ts >= quiet_ms:
        dev.last_rows_ts = 0
    transition = step(ctx, dev, REMAP_PENDING, pending, 1)
    if transition:
        edge(
            ctx,
            transition,
            device,
            REMAP_PENDING,
            1,
            severity="warning",
            action="reset_gpu",
            metric=gm.REMAP_PENDING,
            value=flag,
            baseline=0.0,
            score=new_rows,
            message="row remap pending: a GPU reset applies it",
        )


def _pcie(
    ctx: Ctx,
    dev: GpuDevice,
    view: View,
    replays: float,
    dt_ms: int,
    gen: float | None,
    width: float | None,
) -> bool:
    s = ctx.settings
    persist = s.counter_persist_samples
    per_min = replays * 60_000 / dt_ms if dt_ms > 0 else 0.0
    replaying = per_min >= s.pcie_replay_per_min
    transition = step(ctx, dev, PCIE_REPLAY, replaying, persist)
    if transition:
        edge(
            ctx,
            transition,
            view.device,
            PCIE_REPLAY,
            persist,
            severity="warning",
            action="cordon",
            metric=gm.PCIE_REPLAY,
            value=per_min,
            baseline=s.pcie_replay_per_min,
            score=per_min / s.pcie_replay_per_min,
            message=f"PCIe replays at {per_min:.1f}/min",
        )
    if gen is None and width is None:
        return replaying
    # Links train down in gen when idle (power saving), never in width: judge gen only busy.
    downgraded = width is not None and width < dev.best_width
    downgraded |= view.busy and gen is not None and gen < dev.best_gen
    if width is not None and width > dev.best_width:
        dev.best_width = width
    if view.busy and gen is not None and gen > dev.best_gen:
        dev.best_gen = gen
    transition = step(ctx, dev, PCIE_DOWNGRADE, downgraded, persist)
    if transition:
        edge(
            ctx,
            transition,
            view.device,
            PCIE_DOWNGRADE,
            persist,
            severity="warning",
            action="cordon",
            metric=gm.PCIE_WIDTH,
            value=width,
            baseline=dev.best_width,
            score=gen,
            message=f"PCIe link below its best (gen {gen}, width {width})",
        )
    return replaying or downgraded


def _nvlink(ctx: Ctx, dev: GpuDevice, device: str, errors: float) -> None:
    # A correctable burst (one scrape) is retried by the link and is noise; errors in several
    # scrapes within the window are a link going bad.
    hits = dev.nvlink_hits
    if errors > 0:
        hits.append(ctx.ts)
    if not hits:
        return
    window_ms = ctx.settings.nvlink_window_s * 1000
    while hits and hits[0] <= ctx.ts - window_ms:
        hits.pop(0)
    if len(hits) >= ctx.settings.nvlink_error_scrapes:
        if not is_open(ctx.book, NVLINK, device):
            ctx.emit(
                open_check(
                    ctx.book,
                    ctx.ts,
                    check=NVLINK,
                    device=device,
                    kind="gpu",
                    severity="warning",
                    action="cordon",
                    evidence=evidence(
                        "DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL",
                        errors,
                        0.0,
                        len(hits),
                        ctx.settings.nvlink_window_s,
                    ),
                    message=f"GPU {device}: NVLink errors in {len(hits)} scrapes within "
                    f"{ctx.settings.nvlink_window_s} s",
                )
            )
    elif not hits:
        ctx.emit(clear_check(ctx.book, ctx.ts, NVLINK, device, f"GPU {device}: NVLink quiet"))


def _sbe(ctx: Ctx, dev: GpuDevice, device: str, new: float, dt_ms: int) -> None:
    # Single-bit errors come in huge harmless bursts on a few GPUs: at most a watch finding
    # (lemon-node scoring), never a cordon. A count that halves every hour ~ per-hour rate.
    if new <= 0 and dev.sbe_hour <= 0:
        return
    dev.sbe_hour = dev.sbe_hour * 0.5 ** (dt_ms / HOUR_MS) + new
    limit = ctx.settings.sbe_watch_per_hour
    if dev.sbe_hour >= limit and not is_open(ctx.book, SBE, device):
        ctx.emit(
            open_check(
                ctx.book,
                ctx.ts,
                check=SBE,
                device=device,
                kind="gpu",
                severity="info",
                action="watch",
                evidence=evidence(gm.SBE, dev.sbe_hour, limit, None, 3600),
                message=f"GPU {device}: ~{dev.sbe_hour:.0f} single-bit ECC errors in the last hour",
            )
        )
    elif dev.sbe_hour < limit / 2:
        if dev.sbe_hour < 1:
            dev.sbe_hour = 0.0
        ctx.emit(clear_check(ctx.book, ctx.ts, SBE, device, f"GPU {device}: SBE rate low"))


# --- gauges against peers -------------------------------------------------------------------


def gauge_rules(
    ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, hardware: bool, pcie_bad: bool
) -> None:
    hot = _temperature(ctx, dev, view, peers)
    slow = _clock(ctx, dev, view, peers, hardware)
    _power(ctx, dev, view, peers, hot or slow or hardware or pcie_bad)


def _temperature(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None) -> bool:
    s = ctx.settings
    persist = s.gray_persist_samples
    temp = view.temp
    if temp is None or peers is None or peers.n < s.peer_min:
        unjudged(ctx, dev, view.device, TEMP)
        return False
    offset = temp - peers.temp
    base = dev.temp_offset
    alone = offset >= max(s.temp_alone_delta_c, s.peer_mad_k * MAD_TO_SIGMA * peers.temp_mad)
    z = 0.0
    hot = creeping = False
    if base.n >= s.warmup_samples:
        resid = offset - base.mean
        scale = scale_of(base, TEMP_FLOOR_C)
        z = resid / scale
        drift = cusum(base, z, s.cusum_k, CUSUM_CAP)
        hot = resid >= max(s.temp_peer_delta_c, s.peer_mad_k * scale)
        creeping = drift >= s.cusum_h and resid >= s.temp_drift_min_c
    bad = alone or hot or creeping
    learn(
        base,
        offset,
        ctx.alpha,
        s.warmup_samples,
        s.clip_z,
        TEMP_FLOOR_C,
        s.anomaly_adapt if bad else 1.0,
    )
    transition = step(ctx, dev, TEMP, bad, persist)
    if transition:
        edge(
            ctx,
            transition,
            view.device,
            TEMP,
            persist,
            severity="warning",
            action="cordon",
            metric=gm.TEMP,
            value=temp,
            baseline=peers.temp + base.mean,
            score=z or offset,
            message=f"{temp:.0f} C, {offset:+.1f} C against its peers (usually {base.mean:+.1f})",
        )
    return bad


def _clock(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, hardware: bool) -> bool:
    s = ctx.settings
    persist = s.gray_persist_samples
    clock = view.clock
    if clock is None or not view.busy:
        unjudged(ctx, dev, view.device, CLOCK)
        return False
    gap = 0.0
    slow_peer = slow_own = False
    if peers is not None and peers.n_busy >= s.peer_min and peers.clock > 0:
        gap = (peers.clock - clock) / peers.clock
        base = dev.clock_gap
        slow_peer = gap >= s.clock_alone_frac
        if base.n >= s.warmup_samples:
            limit = max(s.clock_drop_frac, s.peer_mad_k * scale_of(base, CLOCK_FLOOR))
            slow_peer |= gap - base.mean >= limit
        learn(
            base,
            gap,
            ctx.alpha,
            s.warmup_samples,
            s.clip_z,
            CLOCK_FLOOR,
            s.anomaly_adapt if slow_peer else 1.0,
        )
    # A whole node throttled together (power brake) has no slower peer: compare the GPU with
    # its own history, but only with hardware throttling as evidence (jobs change clocks too).
    own = dev.clock_own
    drop = (own.mean - clock) / own.mean if own.n >= s.warmup_samples and own.mean > 0 else 0.0
    slow_own = hardware and drop >= s.clock_drop_frac
    learn(
        own,
        clock,
        ctx.alpha,
        s.warmup_samples,
        s.clip_z,
        1.0,
        s.anomaly_adapt if slow_own or slow_peer else 1.0,
    )
    bad = slow_peer or slow_own
    transition = step(ctx, dev, CLOCK, bad, persist)
    if transition:
        reference = peers.clock if slow_peer and peers is not None else own.mean
        edge(
            ctx,
            transition,
            view.device,
            CLOCK,
            persist,
            severity="warning",
            action="cordon",
            metric=gm.SM_CLOCK,
            value=clock,
            baseline=reference,
            score=gap if slow_peer else drop,
            message=f"SM clock {clock:.0f} MHz against {reference:.0f} MHz"
            + (" with hardware throttling" if hardware else ""),
        )
    return bad


def _power(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, corroborated: bool) -> None:
    """Straggler: busy but drawing clearly less power than same-job peers.

    A workload straggler (a rank with more work or a slow data loader) looks the same, so
    this opens only with hardware-like evidence or when the GPU stays slow across jobs.
    """
    s = ctx.settings
    persist = s.gray_persist_samples
    power = view.power
    if power is None or not view.busy or peers is None or peers.n_busy < s.peer_min:
        unjudged(ctx, dev, view.device, POWER)
        return
    if peers.power <= 0:
        unjudged(ctx, dev, view.device, POWER)
        return
    gap = (peers.power - power) / peers.power
    base = dev.power_gap
    low = False
    if base.n >= s.warmup_samples:
        low = gap - base.mean >= max(s.power_drop_frac, s.peer_mad_k * scale_of(base, POWER_FLOOR))
    learn(
        base,
        gap,
        ctx.alpha,
        s.warmup_samples,
        s.clip_z,
        POWER_FLOOR,
        s.anomaly_adapt if low else 1.0,
    )
    jobs = dev.slow_jobs
    if low:
        dev.normal_busy = 0
        job = view.job or ""
        if job not in jobs:
            jobs.append(job)
            del jobs[:-8]
    elif jobs:
        dev.normal_busy += 1
        if dev.normal_busy >= s.clear_persist_samples:
            jobs.clear()
    bad = low and (corroborated or len(jobs) >= s.straggler_min_jobs)
    transition = step(ctx, dev, POWER, bad, persist)
    if transition:
        edge(
            ctx,
            transition,
            view.device,
            POWER,
            persist,
            severity="warning",
            action="cordon",
            metric=gm.POWER,
            value=power,
            baseline=peers.power,
            score=gap,
            message=f"straggler: {power:.0f} W against {peers.power:.0f} W on its peers "
            f"(jobs {', '.join(j or '?' for j in jobs)})",
        )


def unjudged(ctx: Ctx, dev: GpuDevice, device: str, check: str) -> None:
    # Nothing to judge (idle, no peers, no value) counts towards clearing, so a repaired GPU
    # that sits idle on a cordoned node does not keep its old finding open forever.
    if step(ctx, dev, check, False, 1) == CLEAR:
        ctx.emit(clear_check(ctx.book, ctx.ts, check, device, f"GPU {device}: {check} cleared"))
