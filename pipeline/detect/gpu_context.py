"""What the per-GPU rules share: the scrape context, a GPU's view of the scrape, its peers,
and the GPU rules' way into the episode engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.detect import episodes
from pipeline.detect import gpu_metrics as gm
from pipeline.detect.episodes import CLEAR, OPEN, clear_episode, deepen_episode, open_episode
from pipeline.detect.findings import evidence
from pipeline.model import Finding, RecommendedAction

if TYPE_CHECKING:
    from pipeline.config import DetectSettings
    from pipeline.detect.findings import Book
    from pipeline.detect.gpu import GpuDevice


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


def step(ctx: Ctx, dev: GpuDevice, check: str, bad: bool) -> int:
    """Feed one verdict of a check on a device to the episode engine: OPEN, CLEAR or 0; the
    caller builds the finding only then (messages cost time)."""
    if not bad and check not in dev.runs:
        return 0  # the common case: healthy for a while already
    return episodes.step(dev.runs, check, ctx.ts, bad, episodes.rule(ctx.settings, check))


def edge(
    ctx: Ctx,
    transition: int,
    device: str,
    check: str,
    *,
    metric: str,
    value: float | None,
    baseline: float | None,
    score: float | None,
    message: str,
    action: RecommendedAction | None = None,
) -> None:
    """Emit the finding of an OPEN or CLEAR transition returned by `step`; the evidence
    window is the check's persistence."""
    persist = episodes.rule(ctx.settings, check).open_after
    proof = evidence(metric, value, baseline, score, persist * ctx.interval_s)
    if transition == OPEN:
        ctx.emit(
            open_episode(
                ctx.book,
                check,
                ctx.ts,
                device=device,
                action=action,
                message=f"GPU {device}: {message}",
                evidence=proof,
            )
        )
    elif transition == CLEAR:
        ctx.emit(
            clear_episode(
                ctx.book, check, ctx.ts, device, f"GPU {device}: {check} back to normal", proof
            )
        )


def deepen(
    ctx: Ctx, dev: GpuDevice, device: str, check: str, *, metric: str, value: float, frac: float,
    what: str, unit: str,
) -> None:
    """Announce an open episode of `check` again once `value` (lower is worse) has fallen a
    further `frac` below the level it held, for the check's persistence (episodes.deepened)."""
    if check not in dev.runs:
        return  # the common case: no episode at all
    rule = episodes.rule(ctx.settings, check)
    fell_from = episodes.deepened(dev.runs, check, ctx.ts, value, frac, rule)
    if fell_from is None:
        return
    fall = (fell_from - value) / fell_from
    ctx.emit(
        deepen_episode(
            ctx.book,
            check,
            ctx.ts,
            device=device,
            evidence=evidence(metric, value, fell_from, fall, rule.open_after * ctx.interval_s),
            message=f"GPU {device}: {check} worse: {what} {value:.0f} {unit}, a further "
            f"{100 * fall:.0f} % below the {fell_from:.0f} {unit} it held in this episode",
        )
    )


def unjudged(ctx: Ctx, dev: GpuDevice, device: str, check: str) -> None:
    # Nothing to judge (idle, no peers, no value) counts towards clearing, so a repaired GPU
    # that sits idle on a cordoned node does not keep its old finding open forever.
    if step(ctx, dev, check, False) == CLEAR:
        ctx.emit(clear_episode(ctx.book, check, ctx.ts, device, f"GPU {device}: {check} cleared"))
