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
from pipeline.detect.announce import announced
from pipeline.detect.device_flap import came_back, settled
from pipeline.detect.episodes import CLEAR, OPEN, Run, clear_episode, open_episode, rule, step
from pipeline.detect.findings import Book, evidence, heartbeat, refresh
from pipeline.detect.stats import median
from pipeline.model import Finding, TpuChipReading, TpuSample

DUTY = "tpu.chip.duty_cycle"
UTIL = "tpu.chip.tensorcore_util"
CHIP_MISSING = "tpu.chip.missing"
HOST_STALE = "tpu.host.stale"
HOST_DOWN = "tpu.host.down"
SLICE_STALE = "tpu.slice.stale"
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
    if book.open:
        for check in (HOST_STALE, HOST_DOWN):
            _emit(
                out,
                clear_episode(
                    book, check, sample.ts, sample.node, f"host {sample.node} reporting again"
                ),
            )
        _emit(
            out,
            clear_episode(book, SLICE_STALE, sample.ts, None, f"slice {book.name} reporting again"),
        )
    reporting = [r for r in sample.chips if _reports(r)]
    for reading in reporting:
        _update_chip(state, sample, reading, settings, out)
    _absent_chips(state, sample, host, {r.chip_id for r in reporting}, settings, out)
    peers = _peers(state, sample, settings)
    for reading in reporting:
        _judge_chip(state, sample.ts, reading.chip_id, peers, settings, out)
    _emit(out, heartbeat(book, sample.ts, settings.heartbeat_s))
    return state, out


def check_stale_tpu(
    state: TpuSliceState, now_ms: int, settings: DetectSettings
) -> tuple[TpuSliceState, list[Finding]]:
    """Called as event time advances: a host that went silent while the rest of its slice
    kept reporting is stale (its machine failed). A slice whose hosts all went silent is being
    taken down or maintained as a whole (GKE recreates slices atomically): one watch finding,
    not a repair."""
    out: list[Finding] = []
    newest = max((host.last_ts for host in state.hosts.values()), default=0)
    limits = {node: _limit_ms(host, settings) for node, host in state.hosts.items()}
    for node, host in state.hosts.items():
        became_stale = host.last_ts + limits[node]
        if not host.last_ts or now_ms <= became_stale:
            continue
        if newest > became_stale:  # another host reported after this one fell silent
            _emit(out, _host_stale(state, node, host, now_ms, limits[node], HOST_STALE))
            down_ms = max(settings.node_down_s * 1000, limits[node])
            late = now_ms > host.last_ts + down_ms and newest > host.last_ts + down_ms
            if settings.node_down_s and late:
                _emit(out, _host_stale(state, node, host, now_ms, down_ms, HOST_DOWN))
    if newest and now_ms - newest > max(limits.values()) and len(state.hosts) > 1:
        silent_s = (now_ms - newest) / 1000
        _emit(
            out,
            open_episode(
                state.book,
                SLICE_STALE,
                now_ms,
                device=None,
                start_ts=newest + max(limits.values()),
                evidence=evidence("seconds_since_last_scrape", silent_s, None, None, silent_s),
                message=f"every host of slice {state.book.name} silent for {silent_s:.0f} s: "
                "the slice is down or in maintenance as a whole",
            ),
        )
    return state, out


def _limit_ms(host: TpuHost, settings: DetectSettings) -> int:
    return int(max(settings.node_stale_s * 1000, settings.stale_intervals * host.interval_ms))


def _host_stale(
    state: TpuSliceState, node: str, host: TpuHost, now_ms: int, limit_ms: int, check: str
) -> Finding | None:
    """`tpu.host.stale`, or `tpu.host.down` (fatal) once the silence lasted `node_down_s`:
    a dead host sends nothing more that could move its episode forward."""
    silent_ms = now_ms - host.last_ts
    note = announced(state.book, host.last_ts + limit_ms)
    if note is not None and check == HOST_DOWN:
        return None
    return open_episode(
        state.book,
        check,
        now_ms,
        device=node,
        announced=note is not None,
        start_ts=host.last_ts + limit_ms,
        evidence=evidence(
            "seconds_since_last_scrape",
            silent_ms / 1000,
            host.interval_ms / 1000,
            None,
            limit_ms / 1000,
        ),
        message=f"host {node} (worker {host.worker_id}) of slice {state.book.name} silent for "
        f"{silent_ms / 1000:.0f} s while its other hosts report",
    )


def _emit(out: list[Finding], finding: Finding | None) -> None:
    if finding is not None:
        out.append(finding)


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
        if chip.absent >= rule(settings, CHIP_MISSING).open_after:
            _emit(
                out,
                clear_episode(
                    state.book,
                    CHIP_MISSING,
                    sample.ts,
                    str(reading.chip_id),
                    f"chip {reading.chip_id} reporting again",
                ),
            )
        chip.returns, flaps = came_back(
            state.book, chip.returns, sample.ts, away_ms,
            scrapes_away=chip.absent, interval_ms=state.hosts[sample.node].interval_ms,
            prefix="tpu.chip", device=str(reading.chip_id), settings=settings,
        )
        out += flaps
        chip.absent = 0
    elif chip.returns:
        chip.returns, done = settled(
            state.book, chip.returns, sample.ts,
            prefix="tpu.chip", device=str(reading.chip_id), settings=settings,
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
        if chip.absent == missing:
            _emit(
                out,
                open_episode(
                    state.book,
                    CHIP_MISSING,
                    sample.ts,
                    device=str(chip_id),
                    evidence=evidence(
                        "chips_reporting",
                        len(seen),
                        len(host.chips),
                        None,
                        missing * host.interval_ms / 1000,
                    ),
                    message=f"chip {chip_id} missing from {chip.absent} scrapes of host "
                    f"{sample.node} while the host reports",
                ),
            )
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
    edge = step(chip.runs, DUTY, ts, duty_bad, rule(settings, DUTY))
    if edge == OPEN:
        _emit(
            out,
            open_episode(
                state.book,
                DUTY,
                ts,
                device=device,
                evidence=evidence(
                    DUTY_METRIC, chip.duty, duty_median, None, by_duty.tpu_persist_s
                ),
                message=f"chip {chip_id} on {chip.host}: duty cycle {chip.duty:.0f} % while its "
                f"{count} peers run at {duty_median:.0f} %",
            ),
        )
    elif edge == CLEAR:
        _emit(out, clear_episode(state.book, DUTY, ts, device, f"chip {chip_id} busy again"))
    edge = step(chip.runs, UTIL, ts, util_bad, rule(settings, UTIL))
    if edge == OPEN:
        _emit(
            out,
            open_episode(
                state.book,
                UTIL,
                ts,
                device=device,
                evidence=evidence(
                    UTIL_METRIC, chip.util, util_median, None, by_util.tpu_persist_s
                ),
                message=f"chip {chip_id} on {chip.host}: TensorCore utilisation {chip.util:.0f} "
                f"against {util_median:.0f} on its peers",
            ),
        )
    elif edge == CLEAR:
        _emit(out, clear_episode(state.book, UTIL, ts, device, f"chip {chip_id} keeps pace"))
