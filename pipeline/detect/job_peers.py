"""Stragglers against the job's peers on other nodes: a node slower than the rest of its job.

The GPU detector compares a GPU with the GPUs of its own node; a node whose every GPU slows
down (a power brake, a firmware cap, a slow host: S1 fail-slow) looks normal there. Here each
multi-node job's nodes are compared with each other: a node's median SM clock over its busy
GPUs of that job, against the median of the job's other nodes (fresh, at least
`job_peers_min` of them: a clock only goes down when something is wrong, so one peer tells which
of two nodes is the slow one). A synchronous job runs every node at the same clocks, so a node
`job_clock_drop_frac` below its peers, sustained, is slow hardware, while a workload straggler
(more work on one stage: S4) keeps full clocks and a fleet-wide dip (diurnal, hot zone) moves
every node together.

  job.straggler            below peers for `gray_persist_samples` scrapes: watch (transient
                           compute fail-slows, S3, last minutes and end here)
  job.straggler.persistent still below them after `slow_escalate_s`: fail-slow hardware,
                           cordon (fault model S1: they do not self-heal). Once watched,
                           half the deficit keeps it going: a node slowed by about the
                           threshold is not restarted by every noisy scrape just above the
                           line; a transient slowdown that ends (S3) is.
Both clear after `clear_persist_samples` scrapes level with the peers. Evidence: the node's
clock, the peers' median, the deficit.

The same comparison on what a node does rather than how fast it clocks (issue 12 item 3):

  job.straggler.sm_active  SM activity (DCGM_FI_PROF_SM_ACTIVE) of its busy GPUs
  job.straggler.nvlink     NVLink TX+RX bytes/s
  job.straggler.pcie       PCIe TX+RX bytes/s (host and NIC path)
`job_activity_drop_frac` below the job's median node, watched (never a cordon alone: a
starved node and a workload imbalance look alike here). Unlike the clock these also fall on
the nodes that wait for a slow one, so one peer cannot tell which of two is the slow one: they
need `job_activity_peers_min` peers and compare with the median of the whole job (the node
itself counted), so that the nodes that wait, being the majority, set the level.

And on step time, where the job publishes its ranks' step compute time (`step_compute_s`,
waits in collectives left out: sources/prometheus_step.py). Only the slow rank computes longer,
so, like the clock, one peer tells which of two is slow:

  job.straggler.step       the node's median compute time `job_step_rise_frac` above the
                           median of the job's other nodes: watch (more work on its pipeline
                           stage, S4, computes longer too)
  job.straggler.step.persistent  still so after `slow_escalate_s` while its SM clock is
                           `job_step_clock_frac` below the peers' too: fail-slow hardware that
                           costs the job time, cordon. The two together are surer than either:
                           a clock a little low that slows nothing, or a long step at full
                           clocks (more work), is not broken hardware. Once watched, half the
                           rise keeps it going, so a slowdown near the line is not restarted
                           by every noisy sample below it; a transient one that ends is.

Pure: no I/O, no clock. One state for the fleet (jobs span nodes, so it cannot live in a
node's telemetry state); nodes are named by cluster/node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.emit import Judgement, Said, emit
from pipeline.detect.episodes import OPEN, Run, watched
from pipeline.detect.findings import Book, evidence
from pipeline.detect.stats import median
from pipeline.model import Evidence, Finding, GpuSample, JobLevels, PeerSample

STRAGGLER = catalog.JOB_STRAGGLER
PERSISTENT = catalog.JOB_STRAGGLER_PERSISTENT
CLOCK = "DCGM_FI_DEV_SM_CLOCK"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM_ACTIVE = catalog.JOB_SM_ACTIVE
NVLINK = catalog.JOB_NVLINK
PCIE = catalog.JOB_PCIE
STEP = catalog.JOB_STEP
STEP_PERSISTENT = catalog.JOB_STEP_PERSISTENT
# check -> (the metrics summed per GPU, the evidence's metric name)
ACTIVITY: dict[str, tuple[tuple[str, ...], str]] = {
    SM_ACTIVE: (("DCGM_FI_PROF_SM_ACTIVE",), "sm_active_vs_job_peers"),
    NVLINK: (
        ("DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
        "nvlink_bytes_vs_job_peers",
    ),
    PCIE: (
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        "pcie_bytes_vs_job_peers",
    ),
}


class NodeInJob(msgspec.Struct, kw_only=True, gc=False):
    ts: int
    clock: float
    levels: dict[str, float] = {}  # activity check -> the node's median over its busy GPUs
    runs: dict[str, Run] = {}  # its stretches below the peers, per check (episode engine)


class JobPeersState(msgspec.Struct, kw_only=True):
    jobs: dict[str, dict[str, NodeInJob]] = {}  # job -> cluster/node -> latest
    books: dict[str, Book] = {}  # cluster/node -> its episodes (straggler checks only)
    interval_ms: dict[str, int] = {}  # cluster/node -> last scrape gap


_ACTIVITY_METRICS = tuple((check, metrics) for check, (metrics, _) in ACTIVITY.items())


def peer_sample(sample: GpuSample, settings: DetectSettings) -> PeerSample:
    """What the comparison needs of one scrape: per job, the node's median clock (two busy
    GPUs at least) and activity levels. Computed where the scrape is (the telemetry stage), so
    only this small record travels to the fleet stage."""
    clocks = _busy_clocks(sample, settings)
    levels = _busy_levels(sample, settings)
    steps = _step_times(sample)
    running = {gpu.job for gpu in sample.gpus if gpu.job is not None}  # busy or not
    jobs = {
        job: JobLevels(clock=clocks.get(job), levels=levels.get(job, {}) | steps.get(job, {}))
        for job in sorted(running)
    }
    return PeerSample(
        ts=sample.ts, cluster=sample.cluster, node=sample.node, pool=sample.pool,
        zone=sample.zone, jobs=jobs,
    )  # fmt: skip


def detect_job_peers(
    state: JobPeersState | None, sample: PeerSample | GpuSample, settings: DetectSettings
) -> tuple[JobPeersState, list[Finding]]:
    """Feed one node's scrape (or its peer sample); returns findings on that node against its
    jobs' peers."""
    if isinstance(sample, GpuSample):
        sample = peer_sample(sample, settings)
    state = state or JobPeersState()
    key = f"{sample.cluster}/{sample.node}"
    book = state.books.get(key)
    if book is None:
        book = state.books[key] = Book(
            cluster=sample.cluster, kind="node", name=sample.node, pool=sample.pool,
            zone=sample.zone,
        )  # fmt: skip
    out: list[Finding] = []
    for job, mine_now in sample.jobs.items():
        clock = mine_now.clock
        if clock is None:
            continue
        nodes = state.jobs.setdefault(job, {})
        mine = nodes.get(key)
        if mine is not None and sample.ts <= mine.ts:
            continue  # a replay or a late scrape
        gap = sample.ts - mine.ts if mine is not None else 0
        if gap:
            state.interval_ms[key] = gap
        if mine is None:
            mine = nodes[key] = NodeInJob(ts=sample.ts, clock=clock)
        mine.ts, mine.clock, mine.levels = sample.ts, clock, dict(mine_now.levels)
        fresh = _fresh(state, nodes, key, sample.ts)
        # lazily: a verdict may lean on an episode an earlier one of this sample opened
        judged = chain(
            _judge(book, job, mine, [n.clock for n in fresh], settings),
            _judge_activity(book, job, mine, fresh, settings),
            _judge_step(book, job, mine, fresh, settings),
        )
        for one in judged:  # named by when it fell behind, not when it was found
            emit(book, mine.runs, sample.ts, one, settings, out)
    _forget(state, key, sample)
    return state, out


def _busy_clocks(sample: GpuSample, settings: DetectSettings) -> dict[str, float]:
    """Median SM clock of the node's busy GPUs, per job (MIG instances are left out)."""
    by_job: dict[str, list[float]] = {}
    for gpu in sample.gpus:
        clock, util = gpu.metrics.get(CLOCK), gpu.metrics.get(UTIL)
        if gpu.job is None or gpu.mig_instance is not None or clock is None or util is None:
            continue
        if util >= settings.busy_util_pct:
            by_job.setdefault(gpu.job, []).append(clock)
    return {job: median(clocks) for job, clocks in by_job.items() if len(clocks) >= 2}


def _busy_levels(sample: GpuSample, settings: DetectSettings) -> dict[str, dict[str, float]]:
    """Per job, per activity check: the median over the node's busy GPUs reporting it."""
    # runs for every scrape of a node in a job: plain loops, no generator per GPU and check
    by_job: dict[str, dict[str, list[float]]] = {}
    busy = settings.busy_util_pct
    for gpu in sample.gpus:
        metrics = gpu.metrics
        util = metrics.get(UTIL)
        if gpu.job is None or gpu.mig_instance is not None or util is None or util < busy:
            continue
        mine = by_job.get(gpu.job)
        if mine is None:
            mine = by_job[gpu.job] = {}
        for check, names in _ACTIVITY_METRICS:
            total = 0.0
            for name in names:
                value = metrics.get(name)
                if value is None:
                    break
                total += value
            else:  # every metric of the check reported
                levels = mine.get(check)
                if levels is None:
                    mine[check] = [total]
                else:
                    levels.append(total)
    return {
        job: {check: median(vs) for check, vs in checks.items() if len(vs) >= 2}
        for job, checks in by_job.items()
    }


def _step_times(sample: GpuSample) -> dict[str, dict[str, float]]:
    """Per job: {STEP: median step compute time of the node's ranks}, where published."""
    by_job: dict[str, list[float]] = {}
    for gpu in sample.gpus:
        if gpu.job is not None and gpu.step_compute_s is not None and gpu.mig_instance is None:
            by_job.setdefault(gpu.job, []).append(gpu.step_compute_s)
    return {job: {STEP: median(times)} for job, times in by_job.items()}


def _fresh(
    state: JobPeersState, nodes: dict[str, NodeInJob], key: str, ts: int
) -> list[NodeInJob]:
    fresh_ms = 3 * max(state.interval_ms.get(key, 0), 10_000)
    return [n for k, n in nodes.items() if k != key and ts - n.ts <= fresh_ms]


def _judge_activity(
    book: Book, job: str, mine: NodeInJob, fresh: list[NodeInJob], settings: DetectSettings
) -> Iterator[Judgement]:
    for check, (_, metric) in ACTIVITY.items():
        own = settings.tuned(check)
        value = mine.levels.get(check)
        peers = [n.levels[check] for n in fresh if check in n.levels]
        if value is None or len(peers) < own.job_activity_peers_min:
            continue  # not reported, or too few peers for a majority to set the level
        level = median([*peers, value])  # the job's median node: the waiting majority
        deficit = 1.0 - value / level if level > 0 else 0.0

        def say(edge: int, value: float = value, level: float = level, deficit: float = deficit,
                metric: str = metric) -> Said:  # fmt: skip
            if edge != OPEN:
                return f"{book.name} level with its job's peers again", None
            return (
                f"node {book.name} runs job {job} {100 * deficit:.0f} % below the job's median "
                f"node on {metric.removesuffix('_vs_job_peers')} (watched)",
                evidence(metric, value, level, deficit, 0),
            )

        slow = deficit >= own.job_activity_drop_frac
        yield Judgement(check, None, slow, say, by_onset=True)


def _judge_step(
    book: Book, job: str, mine: NodeInJob, fresh: list[NodeInJob], settings: DetectSettings
) -> Iterator[Judgement]:
    value = mine.levels.get(STEP)
    peers = [n for n in fresh if STEP in n.levels]
    if value is None or len(peers) < settings.tuned(STEP).job_peers_min:
        return  # not published, or no peer to compare with
    level = median([n.levels[STEP] for n in peers])
    rise = value / level - 1.0 if level > 0 else 0.0
    clock_level = median([n.clock for n in peers])
    clock_deficit = 1.0 - mine.clock / clock_level if clock_level > 0 else 0.0
    longer = rise >= settings.tuned(STEP).job_step_rise_frac
    # once watched, half the rise holds it: noise around the line restarts nothing
    hard = settings.tuned(STEP_PERSISTENT)
    longer_held = rise >= hard.job_step_rise_frac or watched(mine.runs, STEP)
    held = longer_held and rise >= hard.job_step_rise_frac / 2
    slow_hardware = held and clock_deficit >= hard.job_step_clock_frac

    def said_of(check: str) -> Callable[[int], Said]:
        def say(edge: int) -> Said:
            if edge != OPEN:
                return f"{book.name} computes its steps level with its job's peers again", None
            return (
                _step_message(book, job, rise, clock_deficit, check == STEP_PERSISTENT),
                evidence("step_compute_s_vs_job_peers", value, level, rise, 0),
            )

        return say

    yield Judgement(STEP, None, longer, said_of(STEP), by_onset=True)
    yield Judgement(STEP_PERSISTENT, None, slow_hardware, said_of(STEP_PERSISTENT), by_onset=True)


def _step_message(book: Book, job: str, rise: float, clock_deficit: float, hard: bool) -> str:
    said = f"node {book.name} computes job {job}'s steps {100 * rise:.0f} % longer than its peers"
    if hard:
        return f"{said} at {100 * clock_deficit:.0f} % lower clocks, for too long: fail-slow"
    return f"{said} (watched)"


def _judge(
    book: Book, job: str, mine: NodeInJob, peers: list[float], settings: DetectSettings
) -> Iterator[Judgement]:
    if not peers:
        return
    level = median(peers)
    deficit = 1.0 - mine.clock / level if level > 0 else 0.0
    proof = evidence("sm_clock_vs_job_peers", mine.clock, level, deficit, 0)
    for check in (STRAGGLER, PERSISTENT):
        own = settings.tuned(check)
        if len(peers) < own.job_peers_min:
            continue  # too few peers to call anyone slow
        slow = deficit >= own.clock_drop_frac
        if check == PERSISTENT:  # once watched, half the deficit holds it (as for step time)
            slow = (slow or watched(mine.runs, STRAGGLER)) and deficit >= own.clock_drop_frac / 2
        # PERSISTENT's `watched` reads the STRAGGLER episode this sample's verdict left
        yield Judgement(check, None, slow, _clock_said(book, job, check, proof, deficit),
                        by_onset=True)  # fmt: skip


def _clock_said(
    book: Book, job: str, check: str, proof: Evidence, deficit: float
) -> Callable[[int], Said]:
    def say(edge: int) -> Said:
        if edge != OPEN:
            return f"{book.name} level with its job's peers again", None
        persistent = check == PERSISTENT
        return (
            f"node {book.name} runs job {job} {100 * deficit:.0f} % below the SM clock of the "
            "job's other nodes"
            + (" for too long: fail-slow hardware" if persistent else " (watched)"),
            proof,
        )

    return say


def _forget(state: JobPeersState, key: str, sample: PeerSample) -> None:
    """A node that left a job is no longer its peer."""
    running = sample.jobs.keys()
    for job, nodes in list(state.jobs.items()):
        if key in nodes and job not in running:
            del nodes[key]
            if not nodes:
                del state.jobs[job]
