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
from pipeline.detect.announce import announced
from pipeline.detect.device_flap import came_back, settled
from pipeline.detect.episodes import Run, clear_episode, open_episode, rule
from pipeline.detect.findings import Book, evidence, heartbeat, refresh
from pipeline.detect.gpu_context import Ctx, Peers, View
from pipeline.detect.gpu_counters import counter_rules
from pipeline.detect.gpu_gauges import gauge_rules
from pipeline.detect.plausible import unread
from pipeline.detect.stats import Baseline, alpha_for, median, median_mad
from pipeline.model import Finding, GpuSample

NODE_STALE = "node.stale"
NODE_DOWN = "node.down"
GPU_MISSING = "gpu.missing"


class GpuDevice(msgspec.Struct, kw_only=True, gc=False):
    """What the detector remembers about one GPU of a node."""

    uuid: str = ""
    last_ts: int = 0
    absent: int = 0  # consecutive scrapes of the node without this GPU
    returns: list[int] = []  # ts of recent returns after an absence (device_flap.py)
    temp_offset: Baseline = msgspec.field(default_factory=Baseline)  # temp - peer median
    clock_gap: Baseline = msgspec.field(default_factory=Baseline)  # relative deficit to peers
    clock_own: Baseline = msgspec.field(default_factory=Baseline)  # own SM clock, this job
    clock_job: str | None = None  # the job clock_own was learned on
    slow_since: int = 0  # start of a run of clock drops without hardware evidence
    power_gap: Baseline = msgspec.field(default_factory=Baseline)  # relative deficit to peers
    raw: tuple[float | None, ...] = ()  # last counter and flag fields (gpu_metrics.RAW_FIELDS)
    at_rest: bool = False  # no counter check open or counting: unchanged fields need no work
    was_busy: bool = False
    thermal_reasons: bool = False  # last throttle reasons: thermal or hardware slowdown
    slowdown_reasons: bool = False  # ... hardware slowdown (HW thermal, power brake)
    runs: dict[str, Run] = {}  # per check: its bad or clearing stretch (episode engine)
    nvlink_hits: list[int] = []  # ts of recent scrapes with new NVLink errors
    pcie_hits: list[tuple[int, float]] = []  # (ts, replays) of recent scrapes with replays
    sbe_hour: float = 0.0  # SBE count decaying with a one-hour half-life ...
    sbe_ts: int = 0  # ... as of this time
    wake_ts: int = 0  # when a counter window or quiet period ends (0: none pending)
    last_dbe_ts: int = 0
    last_rows_ts: int = 0
    best_gen: float = 0.0
    best_width: float = 0.0
    slow_jobs: list[str] = []  # jobs during which it drew less power than its peers
    normal_busy: int = 0  # busy scrapes since it last looked slow


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
    if book.open:
        for check in (NODE_STALE, NODE_DOWN):
            ctx.emit(clear_episode(book, check, sample.ts, None, f"node {book.name} reporting"))
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
                book, dev.returns, ctx.ts, prefix="gpu", device=view.device, settings=settings
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
        finding = open_episode(
            state.book,
            check,
            now_ms,
            device=None,
            announced=note is not None,
            start_ts=start_ts,
            evidence=evidence(
                "seconds_since_last_scrape",
                silent_ms / 1000,
                state.interval_ms / 1000,
                None,
                limit_ms / 1000,
            ),
            message=f"node {state.book.name} has not reported for {silent_ms / 1000:.0f} s"
            + (f", as announced ({note.reason})" if note else ""),
        )
        if finding is not None:
            out.append(finding)
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
            if dev.absent >= rule(ctx.settings, GPU_MISSING).open_after:
                ctx.emit(
                    clear_episode(
                        ctx.book,
                        GPU_MISSING,
                        ctx.ts,
                        view.device,
                        f"GPU {view.device} reporting again",
                    )
                )
            dev.returns, flaps = came_back(
                ctx.book, dev.returns, ctx.ts, ctx.ts - dev.last_ts,
                scrapes_away=dev.absent, interval_ms=ctx.interval_s * 1000,
                prefix="gpu", device=view.device, settings=ctx.settings,
            )
            ctx.out += flaps
            dev.absent = 0
        return dev
    if dev is not None:  # another GPU in that slot: the old one's findings no longer apply
        for key, episode in list(ctx.book.open.items()):
            if episode.device == view.device:
                ctx.emit(
                    clear_episode(
                        ctx.book,
                        episode.check,
                        ctx.ts,
                        view.device,
                        f"GPU {view.device} replaced ({view.uuid})",
                        key=key,
                    )
                )
    dev = GpuDevice(uuid=view.uuid)
    state.devices[view.device] = dev
    return dev


def _absent(state: GpuNodeState, seen: set[str], ctx: Ctx) -> None:
    if len(seen) == len(state.devices):
        return
    for device, dev in state.devices.items():
        if device in seen:
            continue
        dev.absent += 1
        if dev.absent == rule(ctx.settings, GPU_MISSING).open_after:
            ctx.emit(
                open_episode(
                    ctx.book,
                    GPU_MISSING,
                    ctx.ts,
                    device=device,
                    evidence=evidence(
                        "gpus_reporting",
                        len(seen),
                        len(state.devices),
                        None,
                        rule(ctx.settings, GPU_MISSING).open_after * ctx.interval_s,
                    ),
                    message=f"GPU {device} ({dev.uuid}) missing from {dev.absent} scrapes while "
                    f"the node reports",
                )
            )


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
