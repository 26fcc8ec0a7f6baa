"""The GPU node detector: one state per node, fed that node's dcgm-exporter scrapes.

Checks (severity, action, persistence and settings: catalog.py, docs/checks.md):
  counters (gpu_counters.py)  gpu.ecc.dbe, gpu.row_remap.failure, gpu.row_remap.pending,
                              gpu.recovery_action, gpu.pcie.replay_rate, gpu.pcie.link_downgrade,
                              gpu.nvlink.crc_rate, gpu.ecc.sbe_rate (noise: watch only)
  gauges (gpu_gauges.py)      gpu.temp.peer, gpu.clock.throttle, gpu.clock.slow (watched; becomes
                              gpu.clock.throttle if it lasts), gpu.power.peer, gpu.pcie.traffic
  device_flap.py              gpu.flap, gpu.flap.persistent (a GPU that drops out and returns)
  here                        gpu.missing (a known GPU absent from the scrape), node.stale (the
                              node stopped reporting), node.down (... and stayed silent
                              `node_down_s`; announced absences: node.stale watch only)
"""

from __future__ import annotations

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.announce import announced
from pipeline.detect.device_flap import came_back, settled
from pipeline.detect.emit import Judgement, Said, clear_device, emit, said
from pipeline.detect.episodes import rule
from pipeline.detect.findings import Book, evidence, heartbeat, refresh
from pipeline.detect.gpu_context import Ctx, GpuDevice, Peers, View
from pipeline.detect.gpu_counters import counter_rules
from pipeline.detect.gpu_gauges import gauge_rules
from pipeline.detect.plausible import unread
from pipeline.detect.stats import alpha_for, median, median_mad
from pipeline.model import Finding, GpuSample

NODE_STALE = catalog.NODE_STALE
NODE_DOWN = catalog.NODE_DOWN
GPU_MISSING = catalog.GPU_MISSING
__all__ = ["GpuDevice", "GpuNodeState", "check_stale_gpu", "detect_gpu", "new_gpu_state"]


class GpuNodeState(msgspec.Struct, kw_only=True):
    book: Book
    last_ts: int = 0
    interval_ms: float = 0.0  # learned scrape interval
    dropped: int = 0  # duplicate or out-of-order scrapes ignored
    devices: dict[str, GpuDevice] = {}  # by GPU index as text (the finding's device)


def new_gpu_state(sample: GpuSample) -> GpuNodeState:
    return GpuNodeState(book=Book.of(sample))


def detect_gpu(
    state: GpuNodeState | None, sample: GpuSample, settings: DetectSettings
) -> tuple[GpuNodeState, list[Finding]]:
    """Feed one scrape of one node; returns the new state and any findings."""
    if state is None:
        state = new_gpu_state(sample)
    if sample.ts <= state.last_ts:
        state.dropped += 1  # a replay or a late scrape: its information is already in
        return state, []
    book = state.book
    refresh(book, sample.cluster, sample.pool, sample.zone)
    _learn_interval(state, sample.ts)
    state.last_ts = sample.ts
    ctx = Ctx(
        book, sample.ts, settings, alpha_for(settings.half_life_samples), state.interval_ms / 1000.0
    )
    if book.open:  # the silence is over
        back = said(f"node {book.name} reporting")
        for check in (NODE_STALE, NODE_DOWN):
            emit(book, {}, sample.ts, Judgement(check, None, False, back), settings, ctx.out)
    # a GPU whose every metric reads 0 is listed (not missing) but unread (detect/plausible.py)
    seen = {r.device for r in sample.gpus if unread(r.metrics) and r.device in state.devices}
    views = [
        View(r.device, r.uuid, r.job, r.metrics, settings.busy_util_pct,
             settings.clock_active_util_pct)
        for r in sample.gpus
        if not unread(r.metrics)
    ]
    peers = _peer_groups(views, settings.peer_min)
    for view in views:
        if not view.reporting:
            continue
        seen.add(view.device)
        dev = _device(state, view, ctx)
        if dev.returns:
            dev.returns, done = settled(
                book, dev.returns, ctx.ts, prefix=catalog.GPU_FLAP, device=view.device,
                settings=settings,
            )
            ctx.out += done
        dt_ms = sample.ts - dev.last_ts if dev.last_ts else 0
        dev.last_ts = sample.ts
        signs = counter_rules(ctx, dev, view, dt_ms)
        gauge_rules(ctx, dev, view, peers.get(view.group), signs)
    _absent(state, seen, ctx)
    ctx.emit(heartbeat(book, sample.ts, settings.heartbeat_s))
    return state, ctx.out


def check_stale_gpu(
    state: GpuNodeState, now_ms: int, settings: DetectSettings
) -> tuple[GpuNodeState, list[Finding]]:
    """Called as event time advances (from other nodes' records): a silent node is stale, and
    after `node_down_s` of silence (when set) down, fatal: a dead node sends nothing more, so
    nothing else would move its episode forward. A node announced as going away (see
    announce.py) is only watched.

    Episodes are named by when the silence crossed each limit, so their ids do not depend on
    how often the runtime calls this.
    """
    if not state.last_ts:
        return state, []
    stale_ms = int(max(settings.node_stale_s * 1000, settings.stale_intervals * state.interval_ms))
    silent_ms = now_ms - state.last_ts
    out: list[Finding] = []
    stages = [(NODE_STALE, stale_ms)]
    if settings.node_down_s:
        stages.append((NODE_DOWN, max(stale_ms, settings.node_down_s * 1000)))
    for check, limit_ms in stages:
        if silent_ms <= limit_ms:
            break
        start_ts = state.last_ts + limit_ms
        note = announced(state.book, start_ts)  # deleted, drained or maintained on purpose?
        if note is not None and check == NODE_DOWN:
            break
        proof = evidence("seconds_since_last_scrape", silent_ms / 1000, state.interval_ms / 1000,
                         None, limit_ms / 1000)  # fmt: skip
        message = f"node {state.book.name} has not reported for {silent_ms / 1000:.0f} s" + (
            f", as announced ({note.reason})" if note else ""
        )
        silent = Judgement(check, None, True, said(message, proof), start_ts=start_ts,
                           announced=note is not None)  # fmt: skip
        emit(state.book, {}, now_ms, silent, settings, out)
    return state, out


def _learn_interval(state: GpuNodeState, ts: int) -> None:
    if not state.last_ts:
        return
    gap = ts - state.last_ts
    if state.interval_ms <= 0:
        state.interval_ms = float(gap)
    elif gap <= 4 * state.interval_ms:  # a gap is not the scrape interval
        state.interval_ms += 0.1 * (gap - state.interval_ms)


def _device(state: GpuNodeState, view: View, ctx: Ctx) -> GpuDevice:
    dev = state.devices.get(view.device)
    if dev is not None and dev.uuid == view.uuid:
        if dev.absent:
            back = said(f"GPU {view.device} reporting again")
            ctx.judge(dev, Judgement(GPU_MISSING, view.device, False, back))
            dev.returns, flaps = came_back(
                ctx.book, dev.returns, ctx.ts, ctx.ts - dev.last_ts,
                scrapes_away=dev.absent, interval_ms=ctx.interval_s * 1000,
                prefix=catalog.GPU_FLAP, device=view.device, settings=ctx.settings,
            )
            ctx.out += flaps
            dev.absent = 0
        return dev
    if dev is not None:  # another GPU in that slot: the old one's findings no longer apply
        message = f"GPU {view.device} replaced ({view.uuid})"
        clear_device(ctx.book, ctx.ts, view.device, message, ctx.out)
    dev = GpuDevice(uuid=view.uuid)
    state.devices[view.device] = dev
    return dev


def _absent(state: GpuNodeState, seen: set[str], ctx: Ctx) -> None:
    if len(seen) == len(state.devices):
        return
    missing = rule(ctx.settings, GPU_MISSING).open_after
    for device, dev in state.devices.items():
        if device in seen:
            continue
        dev.absent += 1
        if dev.absent != missing:
            continue  # the absence count is the check's window (catalog: gpu.missing)

        def say(_edge: int, device: str = device, dev: GpuDevice = dev) -> Said:
            return (
                f"GPU {device} ({dev.uuid}) missing from {dev.absent} scrapes while the node "
                "reports",
                evidence("gpus_reporting", len(seen), len(state.devices), None,
                         missing * ctx.interval_s),
            )  # fmt: skip

        ctx.judge(dev, Judgement(GPU_MISSING, device, True, say))


def _peer_groups(views: list[View], peer_min: int) -> dict[str, Peers]:
    """Median gauges per peer group (same job) at this instant; clock and power over the
    busy members only, since an idle GPU's clock says nothing about its health."""
    members: dict[str, list[View]] = {}
    for view in views:
        if view.reporting:
            members.setdefault(view.group, []).append(view)
    groups = {}
    for name, group in members.items():
        if len(group) < peer_min:
            continue
        peers = Peers()
        temps = [v.temp for v in group if v.temp is not None]
        if temps:
            peers.n = len(temps)
            peers.temp, peers.temp_mad = median_mad(temps)
        clocks = [v.clock for v in group if v.busy and v.clock is not None]
        powers = [v.power for v in group if v.busy and v.power is not None]
        peers.n_busy = min(len(clocks), len(powers)) if powers else len(clocks)
        if clocks:
            peers.clock = median(clocks)
        if powers:
            peers.power = median(powers)
        traffic = [v.pcie for v in group if v.pcie is not None]
        if traffic:
            peers.pcie = median(traffic)
        groups[name] = peers
    return groups
