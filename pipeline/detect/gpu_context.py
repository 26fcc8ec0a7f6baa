"""What the per-GPU rules share: what is remembered of a GPU, the scrape context, a GPU's view
of the scrape, its peers, and the GPU rules' judgements (emitted by emit.py)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect import emit, episodes
from pipeline.detect import gpu_metrics as gm
from pipeline.detect.emit import Judgement, Said
from pipeline.detect.episodes import OPEN, Run
from pipeline.detect.findings import Book, evidence
from pipeline.detect.stats import Baseline
from pipeline.model import Finding, RecommendedAction


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

    def judge(self, dev: GpuDevice, judged: Judgement) -> bool | None:
        """Emit a rule's judgement of one GPU; returns its verdict."""
        return emit.emit(self.book, dev.runs, self.ts, judged, self.settings, self.out)


class Peers:
    """Medians (and the temperature MAD) of a peer group's gauges at one instant."""

    __slots__ = ("clock", "n", "n_busy", "pcie", "power", "temp", "temp_mad")

    def __init__(self) -> None:
        self.n = self.n_busy = 0
        self.temp = self.temp_mad = self.clock = self.power = self.pcie = 0.0


class View:
    """One GPU's reading in one scrape, with the gauges already extracted."""

    __slots__ = (
        "busy",
        "clock",
        "clocked",
        "device",
        "group",
        "job",
        "metrics",
        "pcie",
        "power",
        "temp",
        "uuid",
    )

    def __init__(
        self, device: str, uuid: str, job: str | None, metrics: dict[str, float],
        busy_pct: float, active_pct: float,
    ) -> None:
        self.device, self.uuid, self.job, self.metrics = device, uuid, job, metrics
        # Readings are finite by contract (GpuReading rejects NaN/inf); absent is None.
        self.temp = metrics.get(gm.TEMP)
        self.clock = metrics.get(gm.SM_CLOCK)
        self.power = metrics.get(gm.POWER)
        tx, rx = metrics.get(gm.PCIE_TX), metrics.get(gm.PCIE_RX)
        self.pcie = None if tx is None and rx is None else (tx or 0.0) + (rx or 0.0)
        util = metrics.get(gm.UTIL)
        if util is None:
            util = gm.utilisation(metrics)
        self.busy = util is not None and util >= busy_pct
        # judged on its clock: busy, or at work by its clock event reasons (not idle-clocked)
        reasons = metrics.get(gm.THROTTLE_REASONS)
        self.clocked = self.busy or (
            util is not None and util >= active_pct
            and reasons is not None and not int(reasons) & gm.IDLE_REASON
        )
        # Peers are the GPUs on the same job; without a job label, the ones equally busy.
        self.group = job or ("busy" if self.busy else "idle")

    @property
    def reporting(self) -> bool:
        """A GPU listed with none of its core gauges is as good as gone (NVML returns blanks)."""
        return self.temp is not None or self.clock is not None or self.power is not None


def verdict(
    ctx: Ctx,
    device: str,
    check: str,
    bad: bool,
    *,
    metric: str,
    value: float | None,
    baseline: float | None,
    score: float | None,
    message: Callable[[], str],
    action: RecommendedAction | None = None,
) -> Judgement:
    """A GPU rule's verdict on a check whose persistence the engine counts; its findings'
    evidence window is that persistence, and `message` is only built if an episode opens."""

    def say(edge: int) -> Said:
        persist = episodes.rule(ctx.settings, check).open_after
        proof = evidence(metric, value, baseline, score, persist * ctx.interval_s)
        if edge == OPEN:
            return f"GPU {device}: {message()}", proof
        return f"GPU {device}: {check} back to normal", proof

    return Judgement(check, device, bad, say, action=action)


def unjudged(device: str, check: str) -> Judgement:
    """Nothing to judge (idle, no peers, no value) counts towards clearing, so a repaired GPU
    that sits idle on a cordoned node does not keep its old finding open forever."""
    return Judgement(check, device, False, lambda _: (f"GPU {device}: {check} cleared", None))


def deepen(
    ctx: Ctx, dev: GpuDevice, device: str, check: str, *, metric: str, value: float, frac: float,
    what: str, unit: str,
) -> None:
    """Announce an open episode of `check` again once `value` (lower is worse) has fallen a
    further `frac` below the level it held, for the check's persistence (emit.deepen)."""

    def say(fell_from: float) -> Said:
        fall = (fell_from - value) / fell_from
        window_s = episodes.rule(ctx.settings, check).open_after * ctx.interval_s
        return (
            f"GPU {device}: {check} worse: {what} {value:.0f} {unit}, a further "
            f"{100 * fall:.0f} % below the {fell_from:.0f} {unit} it held in this episode",
            evidence(metric, value, fell_from, fall, window_s),
        )

    emit.deepen(ctx.book, dev.runs, ctx.ts, ctx.settings, check, device, value, frac, say, ctx.out)
