"""The TPU slice detector: one state per slice, fed every host's chip scrapes.

A slice is repaired as one unit, so every finding targets the slice (Target kind "slice");
the entity says which chip or host. Checks (severity, action, persistence and settings:
catalog.py, docs/checks.md):
  tpu.chip.duty_cycle      chip idle while its peers work (dead or hung chip)
  tpu.chip.tensorcore_util chip slower than its peers (fail-slow), watched
  tpu.chip.missing         a known chip absent from its host's scrape
  tpu.chip.flap(.persistent) a chip that drops out and returns (device_flap.py)
  tpu.host.stale (node)    a host went silent, the rest of the slice not
  tpu.host.down (node)     ... for `node_down_s`, fatal
  tpu.slice.stale (slice)  every host silent: taken down or maintained, watched

Peers of a chip are the chips on the same job on the *other* hosts of the slice (a whole host
going dark must not drag its own baseline down); a one-host slice compares its own chips.
"""

from __future__ import annotations

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.announce import announced
from pipeline.detect.device_flap import came_back, settled
from pipeline.detect.emit import Judgement, Said, emit, said
from pipeline.detect.episodes import OPEN, Run, rule
from pipeline.detect.findings import Book, evidence, heartbeat, refresh
from pipeline.detect.stats import median
from pipeline.model import Finding, TpuChipReading, TpuSample

DUTY = catalog.TPU_DUTY
UTIL = catalog.TPU_UTIL
CHIP_MISSING = catalog.TPU_CHIP_MISSING
HOST_STALE = catalog.TPU_HOST_STALE
HOST_DOWN = catalog.TPU_HOST_DOWN
SLICE_STALE = catalog.TPU_SLICE_STALE
DUTY_METRIC = "duty_cycle_pct"
UTIL_METRIC = "tensorcore_util"
# From this many hosts on, slice-wide medians are cached for a few seconds instead of being
# recomputed for every host's scrape (a 256-chip slice has 64 hosts reporting each round).
CACHED_PEERS_MIN_HOSTS = 4
PEER_REFRESH_MS = 5_000


class TpuChip(msgspec.Struct, kw_only=True, gc=False):
    host: str
    last_ts: int = 0
    job: str | None = None
    duty: float | None = None
    util: float | None = None
    absent: int = 0  # consecutive scrapes of its host without it
    returns: list[int] = []  # ts of recent returns after an absence (device_flap.py)
    runs: dict[str, Run] = {}


class TpuHost(msgspec.Struct, kw_only=True, gc=False):
    last_ts: int = 0
    interval_ms: float = 0.0
    worker_id: int = 0
    chips: list[int] = []  # chip ids in its last scrape


class TpuSliceState(msgspec.Struct, kw_only=True):
    book: Book
    accelerator_type: str = ""
    topology: str = ""
    hosts: dict[str, TpuHost] = {}
    chips: dict[int, TpuChip] = {}
    dropped: int = 0  # duplicate or out-of-order host scrapes ignored
    peers_ts: int = 0  # when the cached slice-wide medians were computed
    peers: dict[str, tuple[int, float, float]] = {}  # job -> (chips, duty median, util median)


def detect_tpu(
    state: TpuSliceState | None, sample: TpuSample, settings: DetectSettings
) -> tuple[TpuSliceState, list[Finding]]:
    """Feed one host's chip scrape; returns the new slice state and any findings."""
    if state is None:
        state = TpuSliceState(book=Book.of(sample))
    host = state.hosts.get(sample.node)
    if host is not None and sample.ts <= host.last_ts:
        state.dropped += 1
        return state, []
    if host is None:
        host = state.hosts[sample.node] = TpuHost()
    book = state.book
    refresh(book, sample.cluster, sample.pool, sample.zone)
    state.accelerator_type, state.topology = sample.accelerator_type, sample.topology
    _learn_interval(host, sample.ts)
    host.worker_id = sample.worker_id
    out: list[Finding] = []
    if book.open:  # the silence is over
        host_back = said(f"host {sample.node} reporting again")
        back = [
            Judgement(HOST_STALE, sample.node, False, host_back),
            Judgement(HOST_DOWN, sample.node, False, host_back),
            Judgement(SLICE_STALE, None, False, said(f"slice {book.name} reporting again")),
        ]
        for judged in back:
            emit(book, {}, sample.ts, judged, settings, out)
    reporting = [r for r in sample.chips if _reports(r)]
    for reading in reporting:
        _update_chip(state, sample, reading, settings, out)
    _absent_chips(state, sample, host, {r.chip_id for r in reporting}, settings, out)
    peers = _peers(state, sample, settings)
    for reading in reporting:
        _judge_chip(state, sample.ts, reading.chip_id, peers, settings, out)
    beat = heartbeat(book, sample.ts, settings.heartbeat_s)
    if beat is not None:
        out.append(beat)
    return state, out


def check_stale_tpu(
    state: TpuSliceState,
    now_ms: int,
    settings: DetectSettings,
    offsets: dict[str, int] | None = None,
) -> tuple[TpuSliceState, list[Finding]]:
    """Called as event time advances: a host that went silent while the rest of its slice
    kept reporting is stale (its machine failed). A slice whose hosts all went silent is being
    taken down or maintained as a whole (GKE recreates slices atomically): one watch finding,
    not a repair. `offsets`: how far behind the clock each host stamps (ms; negative: ahead),
    so that a host whose records keep arriving stamped late is not silent, and one stamping
    ahead does not make its siblings look silent (liveness from arrival). A host is never
    judged more silent for being ahead (a stream resuming looks ahead for a moment)."""
    out: list[Finding] = []
    offsets = offsets or {}
    # the hosts' last reports in the partition's time base
    heard = {node: host.last_ts + offsets.get(node, 0) for node, host in state.hosts.items()}
    newest = max(heard.values(), default=0)
    limits = {node: _limit_ms(host, settings) for node, host in state.hosts.items()}
    for node, host in state.hosts.items():
        if offsets.get(node, 0) > 0:  # stamping behind: its silence in the partition's time
            host = msgspec.structs.replace(host, last_ts=heard[node])
        became_stale = host.last_ts + limits[node]
        if not host.last_ts or now_ms <= became_stale:
            continue
        if newest > became_stale:  # another host reported after this one fell silent
            judged = [_host_stale(state, node, host, now_ms, limits[node], HOST_STALE)]
            down_ms = max(settings.node_down_s * 1000, limits[node])
            late = now_ms > host.last_ts + down_ms and newest > host.last_ts + down_ms
            if settings.node_down_s and late:
                judged.append(_host_stale(state, node, host, now_ms, down_ms, HOST_DOWN))
            for silent in judged:
                emit(state.book, {}, now_ms, silent, settings, out)
    if newest and now_ms - newest > max(limits.values()) and len(state.hosts) > 1:
        silent_s = (now_ms - newest) / 1000
        down = said(
            f"every host of slice {state.book.name} silent for {silent_s:.0f} s: the slice is "
            "down or in maintenance as a whole",
            evidence("seconds_since_last_scrape", silent_s, None, None, silent_s),
        )
        whole = Judgement(SLICE_STALE, None, True, down, start_ts=newest + max(limits.values()))
        emit(state.book, {}, now_ms, whole, settings, out)
    return state, out


def _limit_ms(host: TpuHost, settings: DetectSettings) -> int:
    return int(max(settings.node_stale_s * 1000, settings.stale_intervals * host.interval_ms))


def _host_stale(
    state: TpuSliceState, node: str, host: TpuHost, now_ms: int, limit_ms: int, check: str
) -> Judgement:
    """`tpu.host.stale`, or `tpu.host.down` (fatal) once the silence lasted `node_down_s`:
    a dead host sends nothing more that could move its episode forward. An announced absence
    is never down (None: no verdict)."""
    silent_ms = now_ms - host.last_ts
    note = announced(state.book, host.last_ts + limit_ms)

    def say(_edge: int) -> Said:
        return (
            f"host {node} (worker {host.worker_id}) of slice {state.book.name} silent for "
            f"{silent_ms / 1000:.0f} s while its other hosts report",
            evidence("seconds_since_last_scrape", silent_ms / 1000, host.interval_ms / 1000,
                     None, limit_ms / 1000),
        )  # fmt: skip

    down_announced = note is not None and check == HOST_DOWN
    return Judgement(check, node, None if down_announced else True, say,
                     start_ts=host.last_ts + limit_ms, announced=note is not None)  # fmt: skip


def _reports(reading: TpuChipReading) -> bool:
    # A chip listed without its core metrics is as good as missing.
    return DUTY_METRIC in reading.metrics or UTIL_METRIC in reading.metrics


def _learn_interval(host: TpuHost, ts: int) -> None:
    if host.last_ts:
        gap = ts - host.last_ts
        if host.interval_ms <= 0:
            host.interval_ms = float(gap)
        elif gap <= 4 * host.interval_ms:
            host.interval_ms += 0.1 * (gap - host.interval_ms)
    host.last_ts = ts


def _update_chip(
    state: TpuSliceState,
    sample: TpuSample,
    reading: TpuChipReading,
    settings: DetectSettings,
    out: list[Finding],
) -> None:
    chip = state.chips.get(reading.chip_id)
    if chip is None:
        chip = state.chips[reading.chip_id] = TpuChip(host=sample.node)
    away_ms = sample.ts - chip.last_ts
    chip.host, chip.last_ts, chip.job = sample.node, sample.ts, reading.job
    chip.duty = reading.metrics.get(DUTY_METRIC)
    chip.util = reading.metrics.get(UTIL_METRIC)
    if chip.absent:
        back = said(f"chip {reading.chip_id} reporting again")
        emit(state.book, chip.runs, sample.ts,
             Judgement(CHIP_MISSING, str(reading.chip_id), False, back), settings, out)  # fmt: skip
        chip.returns, flaps = came_back(
            state.book, chip.returns, sample.ts, away_ms,
            scrapes_away=chip.absent, interval_ms=state.hosts[sample.node].interval_ms,
            prefix=catalog.TPU_FLAP, device=str(reading.chip_id), settings=settings,
        )
        out += flaps
        chip.absent = 0
    elif chip.returns:
        chip.returns, done = settled(
            state.book, chip.returns, sample.ts,
            prefix=catalog.TPU_FLAP, device=str(reading.chip_id), settings=settings,
        )
        out += done


def _absent_chips(
    state: TpuSliceState,
    sample: TpuSample,
    host: TpuHost,
    seen: set[int],
    settings: DetectSettings,
    out: list[Finding],
) -> None:
    for chip_id in host.chips:
        chip = state.chips.get(chip_id)
        if chip_id in seen or chip is None or chip.host != sample.node:
            continue
        chip.absent += 1
        missing = rule(settings, CHIP_MISSING).open_after
        if chip.absent == missing:  # the absence count is the check's window (catalog)
            gone = said(
                f"chip {chip_id} missing from {chip.absent} scrapes of host {sample.node} while "
                "the host reports",
                evidence("chips_reporting", len(seen), len(host.chips), None,
                         missing * host.interval_ms / 1000),
            )  # fmt: skip
            gone_now = Judgement(CHIP_MISSING, str(chip_id), True, gone)
            emit(state.book, chip.runs, sample.ts, gone_now, settings, out)
    host.chips = sorted(seen | {c for c in host.chips if state.chips[c].absent})


def _peers(
    state: TpuSliceState, sample: TpuSample, settings: DetectSettings
) -> dict[str, tuple[int, float, float]]:
    """Per job: (chips, median duty cycle, median TensorCore util) of the fresh peer chips."""
    fresh_after = sample.ts - settings.node_stale_s * 1000
    if len(state.hosts) >= CACHED_PEERS_MIN_HOSTS:
        # One host is at most a quarter of the chips here: slice-wide medians barely move
        # without it, and recomputing them for every host's scrape would cost O(chips).
        if abs(sample.ts - state.peers_ts) < PEER_REFRESH_MS:
            return state.peers
        state.peers, state.peers_ts = _medians(state, fresh_after, None), sample.ts
        return state.peers
    other_hosts = any(
        c.host != sample.node and c.last_ts > fresh_after for c in state.chips.values()
    )
    return _medians(state, fresh_after, sample.node if other_hosts else None)


def _medians(
    state: TpuSliceState, fresh_after: int, exclude_host: str | None
) -> dict[str, tuple[int, float, float]]:
    duties: dict[str, list[float]] = {}
    utils: dict[str, list[float]] = {}
    for chip in state.chips.values():
        if chip.last_ts <= fresh_after or chip.host == exclude_host or chip.absent:
            continue
        job = chip.job or ""
        if chip.duty is not None:
            duties.setdefault(job, []).append(chip.duty)
        if chip.util is not None:
            utils.setdefault(job, []).append(chip.util)
    return {
        job: (len(values), median(values), median(utils[job]) if utils.get(job) else 0.0)
        for job, values in duties.items()
    }


def _judge_chip(
    state: TpuSliceState,
    ts: int,
    chip_id: int,
    peers: dict[str, tuple[int, float, float]],
    settings: DetectSettings,
    out: list[Finding],
) -> None:
    chip = state.chips[chip_id]
    group = peers.get(chip.job or "") or (0, 0.0, 0.0)
    count, duty_median, util_median = group
    by_duty, by_util = settings.tuned(DUTY), settings.tuned(UTIL)
    peers_up = count >= settings.peer_min
    duty_bad = (
        peers_up
        and duty_median >= by_duty.tpu_busy_pct
        and chip.duty is not None
        and chip.duty <= duty_median - by_duty.tpu_duty_drop_pct
    )
    util_bad = (
        peers_up
        and duty_median >= by_util.tpu_busy_pct
        and not duty_bad
        and chip.util is not None
        and util_median > 0
        and chip.util <= util_median * (1 - by_util.tpu_util_drop_frac)
    )
    device = str(chip_id)

    def duty_said(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"chip {chip_id} on {chip.host}: duty cycle {chip.duty:.0f} % while its {count} "
                f"peers run at {duty_median:.0f} %",
                evidence(DUTY_METRIC, chip.duty, duty_median, None, by_duty.tpu_persist_s),
            )
        return f"chip {chip_id} busy again", None

    def util_said(edge: int) -> Said:
        if edge == OPEN:
            return (
                f"chip {chip_id} on {chip.host}: TensorCore utilisation {chip.util:.0f} against "
                f"{util_median:.0f} on its peers",
                evidence(UTIL_METRIC, chip.util, util_median, None, by_util.tpu_persist_s),
            )
        return f"chip {chip_id} keeps pace", None

    for judged in (Judgement(DUTY, device, duty_bad, duty_said),
                   Judgement(UTIL, device, util_bad, util_said)):  # fmt: skip
        emit(state.book, chip.runs, ts, judged, settings, out)
