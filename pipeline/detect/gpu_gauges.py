"""Per-GPU gauge rules: temperature, SM clock, power and PCIe traffic against peers and history.

Peer comparison is what cancels fleet-wide effects (diurnal temperature, a hot afternoon): a
GPU is compared with the other GPUs of its node on the same job at the same instant, and the
difference is then compared with that GPU's *usual* difference, so a GPU that always runs a few
degrees warmer because of where it sits in the chassis is not a fault. A whole node slowing
down together has no slower peer; it is judged against its own history on the same job.
"""

from __future__ import annotations

from pipeline.detect import catalog
from pipeline.detect import gpu_metrics as gm
from pipeline.detect.episodes import forget_mark, step, timer, watched
from pipeline.detect.gpu_context import (
    Ctx,
    GpuDevice,
    Peers,
    View,
    deepen,
    unjudged,
    verdict,
)
from pipeline.detect.gpu_counters import Signs
from pipeline.detect.stats import MAD_TO_SIGMA, Baseline, cusum, learn, scale_of

# Scale floors: below these a difference is sensor quantisation, not signal.
TEMP_FLOOR_C = 0.5
CLOCK_FLOOR = 0.005
POWER_FLOOR = 0.02
CUSUM_CAP = 4.0

TEMP = catalog.GPU_TEMP
CLOCK = catalog.GPU_CLOCK_THROTTLE
SLOW = catalog.GPU_CLOCK_SLOW
POWER = catalog.GPU_POWER
PCIE_TRAFFIC = catalog.GPU_PCIE_TRAFFIC
LASTING = f"{CLOCK}|lasting"  # the run of a plain slowdown (catalog.SLOW_LASTING)
LEVEL = f"{POWER}|level"  # the run of busy scrapes at its peers' power (catalog.POWER_LEVEL)


def gauge_rules(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, signs: Signs) -> None:
    hot = _temperature(ctx, dev, view, peers)
    slow = _clock(ctx, dev, view, peers, signs)
    starved = _pcie_traffic(ctx, dev, view, peers)
    _power(ctx, dev, view, peers, hot or slow or signs.thermal or signs.pcie or starved)


def _temperature(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None) -> bool:
    s = ctx.settings.tuned(TEMP)
    temp = view.temp
    if temp is None or peers is None or peers.n < s.peer_min:
        ctx.judge(dev, unjudged(view.device, TEMP))
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
    ctx.judge(dev, verdict(
        ctx, view.device, TEMP, bad, metric=gm.TEMP, value=temp, baseline=peers.temp + base.mean,
        score=z or offset,
        message=lambda: f"{temp:.0f} C, {offset:+.1f} C against its peers (usually "
        f"{base.mean:+.1f})",
    ))  # fmt: skip
    return bad


def _clock(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, signs: Signs) -> bool:
    """Throttling: SM clock below busy peers, or below its own history with heat as evidence,
    or hardware slowdown reasons on their own. A node slower than its history with no
    evidence at all (`gpu.clock.slow`) is only watched: a transient compute slowdown looks the
    same, so it becomes a throttle finding only once it has lasted `slow_escalate_s`."""
    s, as_slow = ctx.settings.tuned(CLOCK), ctx.settings.tuned(SLOW)
    clock = view.clock
    if clock is None or not view.clocked:
        # An idle clock says nothing, but hardware slowdown reasons hold whatever the load.
        # Nor does it end a slow run: a serving GPU slow whenever it is busy, idle between
        # peaks, is slow all along (only a busy scrape at its usual clock ends the run). So
        # between the peaks of the job its baseline was learned on, an idle scrape neither
        # counts towards a clock episode nor towards clearing one; without that job (drained,
        # repaired, another job) it counts towards clearing.
        between_peaks = clock is not None and view.job is not None and view.job == dev.clock_job
        if not between_peaks:
            ctx.judge(dev, unjudged(view.device, SLOW))
        if not signs.slowdown:
            if not between_peaks:
                ctx.judge(dev, unjudged(view.device, CLOCK))
            return False
        ctx.judge(dev, verdict(
            ctx, view.device, CLOCK, True, metric=gm.THROTTLE_REASONS,
            value=view.metrics.get(gm.THROTTLE_REASONS), baseline=0.0, score=None,
            message=lambda: "hardware slowdown reasons (HW thermal / power brake) while idle",
        ))  # fmt: skip
        return True
    gap, slow_peer = _peer_gap(ctx, dev, peers, clock)
    drop = _own_drop(ctx, dev, view, clock, slow_peer)
    slow_heat = signs.thermal and drop >= s.clock_drop_frac
    explained = slow_peer or signs.thermal or signs.slowdown
    plain = not explained and drop >= s.clock_own_frac
    # once watched, half the drop holds the run: a GPU slowed by about clock_own_frac is not
    # restarted by every scrape just above the line (a transient that ends still ends it)
    held = not explained and watched(dev.runs, SLOW) and drop >= s.clock_own_frac / 2
    lasting_for = timer(ctx.settings, catalog.SLOW_LASTING, CLOCK)
    step(dev.runs, LASTING, ctx.ts, plain or held, lasting_for)
    lasting = watched(dev.runs, LASTING)
    plain_watched = not explained and drop >= as_slow.clock_own_frac
    bad = slow_peer or slow_heat or signs.slowdown or lasting
    own = dev.clock_own.mean
    reference = peers.clock if slow_peer and peers is not None else own
    why = "hardware slowdown reasons" if signs.slowdown else "thermal throttling"
    ctx.judge(dev, verdict(
        ctx, view.device, CLOCK, bad, metric=gm.SM_CLOCK, value=clock, baseline=reference,
        score=gap if slow_peer else drop,
        message=lambda: f"SM clock {clock:.0f} MHz against {reference:.0f} MHz"
        + (f" with {why}" if signs.thermal or signs.slowdown else ""),
    ))  # fmt: skip
    ctx.judge(dev, verdict(
        ctx, view.device, SLOW, plain_watched, metric=gm.SM_CLOCK, value=clock, baseline=own,
        score=drop,
        message=lambda: f"SM clock {clock:.0f} MHz, {100 * drop:.0f} % below its usual "
        f"{own:.0f} MHz on this job, no hardware evidence yet",
    ))  # fmt: skip
    # A slowdown on top of an open one (a rank slowed on a node already slow) is news too.
    for check, tuned in ((CLOCK, s), (SLOW, as_slow)):
        deepen(ctx, dev, view.device, check, metric=gm.SM_CLOCK, value=clock,
               frac=tuned.clock_drop_frac, what="SM clock", unit="MHz")  # fmt: skip
    return bad


def _peer_gap(ctx: Ctx, dev: GpuDevice, peers: Peers | None, clock: float) -> tuple[float, bool]:
    """Relative SM-clock deficit to the busy peers, and whether it is beyond the GPU's usual."""
    s = ctx.settings.tuned(CLOCK)
    if peers is None or peers.n_busy < s.peer_min or peers.clock <= 0:
        return 0.0, False
    gap = (peers.clock - clock) / peers.clock
    base = dev.clock_gap
    slow = gap >= s.clock_alone_frac
    if base.n >= s.warmup_samples:
        slow |= gap - base.mean >= max(
            s.clock_drop_frac, s.peer_mad_k * scale_of(base, CLOCK_FLOOR)
        )
    learn(
        base,
        gap,
        ctx.alpha,
        s.warmup_samples,
        s.clip_z,
        CLOCK_FLOOR,
        s.anomaly_adapt if slow else 1.0,
    )
    return gap, slow


def _own_drop(ctx: Ctx, dev: GpuDevice, view: View, clock: float, slow_peer: bool) -> float:
    """Relative drop of the SM clock below its own baseline on the current job.

    Jobs set clocks (power-capped kernels run slower), so the baseline starts again with
    each job and says nothing until it has warmed up."""
    s = ctx.settings.tuned(CLOCK)
    if view.job != dev.clock_job:
        dev.clock_job, dev.clock_own = view.job, Baseline()
        dev.runs.pop(LASTING, None)
        for check in (CLOCK, SLOW):  # the new job sets its own clocks
            forget_mark(dev.runs, check)
    own = dev.clock_own
    drop = (own.mean - clock) / own.mean if own.n >= s.warmup_samples and own.mean > 0 else 0.0
    slowing = slow_peer or drop >= s.clock_drop_frac
    learn(
        own, clock, ctx.alpha, s.warmup_samples, s.clip_z, 1.0, s.anomaly_adapt if slowing else 1.0
    )
    return drop


def _pcie_traffic(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None) -> bool:
    """A GPU whose PCIe traffic collapsed while its same-job peers keep moving data: the NIC
    or PCIe switch behind it (GPUDirect RDMA goes through PCIe)."""
    s = ctx.settings.tuned(PCIE_TRAFFIC)
    traffic = view.pcie
    if traffic is None or peers is None or peers.n < s.peer_min:
        ctx.judge(dev, unjudged(view.device, PCIE_TRAFFIC))
        return False
    starved = peers.pcie >= s.pcie_traffic_min_bps and traffic <= s.pcie_traffic_frac * peers.pcie
    level = peers.pcie
    ctx.judge(dev, verdict(
        ctx, view.device, PCIE_TRAFFIC, starved, metric="DCGM_FI_PROF_PCIE_TX_BYTES+RX_BYTES",
        value=traffic, baseline=level, score=traffic / level if level else None,
        message=lambda: f"PCIe traffic {traffic:.3g} B/s against {level:.3g} B/s on its "
        "peers: NIC or PCIe path",
    ))  # fmt: skip
    return starved


def _power(ctx: Ctx, dev: GpuDevice, view: View, peers: Peers | None, corroborated: bool) -> None:
    """Straggler: busy but drawing clearly less power than same-job peers.

    A workload straggler (a rank with more work or a slow data loader) looks the same, so
    this opens only with hardware-like evidence or when the GPU stays slow across jobs.
    """
    s = ctx.settings.tuned(POWER)
    power = view.power
    if power is None or not view.busy or peers is None or peers.n_busy < s.peer_min:
        ctx.judge(dev, unjudged(view.device, POWER))
        return
    if peers.power <= 0:
        ctx.judge(dev, unjudged(view.device, POWER))
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
    if low or jobs:  # busy at its peers' level long enough: the slow jobs are forgotten
        step(dev.runs, LEVEL, ctx.ts, not low, timer(ctx.settings, catalog.POWER_LEVEL, POWER))
    if low:
        job = view.job or ""
        if job not in jobs:
            jobs.append(job)
            del jobs[:-8]
    elif jobs and watched(dev.runs, LEVEL):
        jobs.clear()
    bad = low and (corroborated or len(jobs) >= s.straggler_min_jobs)
    level = peers.power
    ctx.judge(dev, verdict(
        ctx, view.device, POWER, bad, metric=gm.POWER, value=power, baseline=level, score=gap,
        message=lambda: f"straggler: {power:.0f} W against {level:.0f} W on its peers "
        f"(jobs {', '.join(j or '?' for j in jobs)})",
    ))  # fmt: skip
