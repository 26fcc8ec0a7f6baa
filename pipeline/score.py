"""Score what the pipeline did against the simulator's ground truth (pure, no I/O).

A fault that expects an action is *detected* when an action that takes its target out of
service (cordon, drain, reset, reboot, repair, replace) lands on that target between its onset
and its end plus a grace period; time to detect is that action's ts minus the onset. A fault that
expects only a finding is detected by any unhealthy finding on its target in the same window.
Every removal episode (the first removal action on a target after a quiet spell) is then either
explained by a fault that wanted it (true), caused by a confounder (confounder cordon) or by
nothing (false cordon). Precision = true / all episodes. Cordons the policy places ahead of
scheduled maintenance (reason check "maintenance") are planned work and are not scored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.model import Action, Finding, Target

REMOVALS = frozenset(
    {"cordon", "drain", "reset_gpu", "reboot", "repair", "replace", "repair_slice"}
)

MAINTENANCE_CHECK = "maintenance"


class Fault(Protocol):
    """What the scorer needs of an injected fault (pipeline.sim's InjectedFault has it)."""

    @property
    def fault_id(self) -> str: ...
    @property
    def fault_type(self) -> str: ...
    @property
    def klass(self) -> str: ...
    @property
    def target(self) -> Target: ...
    @property
    def onset_ms(self) -> int: ...
    @property
    def end_ms(self) -> int: ...
    @property
    def expected(self) -> str: ...
    @property
    def must_not_cordon(self) -> bool: ...


@dataclass(frozen=True)
class ScoreSettings:
    grace_ms: int = 10 * 60_000  # an action this long after a fault ended still counts for it
    episode_gap_ms: int = 30 * 60_000  # removals on one target closer than this are one episode


@dataclass
class ClassScore:
    faults: int = 0
    detected: int = 0
    delays_ms: list[int] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None

    def delay_quantile(self, q: float) -> float | None:
        if not self.delays_ms:
            return None
        ordered = sorted(self.delays_ms)
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


@dataclass
class Score:
    by_class: dict[str, ClassScore]
    by_type: dict[str, ClassScore]
    episodes: int
    true_episodes: int
    confounder_cordons: int
    false_cordons: int
    node_days: float

    @property
    def precision(self) -> float | None:
        return self.true_episodes / self.episodes if self.episodes else None

    @property
    def false_cordons_per_1k_node_days(self) -> float | None:
        return 1000 * self.false_cordons / self.node_days if self.node_days else None

    def summary(self) -> dict[str, object]:
        return {
            "precision": self.precision,
            "episodes": self.episodes,
            "confounder_cordons": self.confounder_cordons,
            "false_cordons": self.false_cordons,
            "false_cordons_per_1k_node_days": self.false_cordons_per_1k_node_days,
            "by_class": {k: _class_summary(v) for k, v in sorted(self.by_class.items())},
            "by_type": {k: _class_summary(v) for k, v in sorted(self.by_type.items())},
        }


def _class_summary(score: ClassScore) -> dict[str, object]:
    return {
        "faults": score.faults,
        "detected": score.detected,
        "recall": score.recall,
        "median_delay_s": _seconds(score.delay_quantile(0.5)),
        "p95_delay_s": _seconds(score.delay_quantile(0.95)),
    }


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def score(
    faults: Sequence[Fault],
    actions: Iterable[Action],
    findings: Iterable[Finding],
    node_days: float,
    settings: ScoreSettings = ScoreSettings(),
) -> Score:
    removals = _removals_by_target(actions)
    flagged = _findings_by_target(findings)
    by_class: dict[str, ClassScore] = defaultdict(ClassScore)
    by_type: dict[str, ClassScore] = defaultdict(ClassScore)
    for fault in faults:
        if fault.expected not in ("cordon", "repair_slice", "finding"):
            continue
        times = flagged if fault.expected == "finding" else removals
        delay = _first_delay(times.get(_key(fault.target), []), fault, settings)
        for bucket in (by_class[fault.klass], by_type[fault.fault_type]):
            bucket.faults += 1
            if delay is not None:
                bucket.detected += 1
                bucket.delays_ms.append(delay)
    episodes = _episodes(removals, settings)
    wanted = [f for f in faults if f.expected in ("cordon", "repair_slice")]
    confounders = [f for f in faults if f.must_not_cordon]
    true = confounded = false = 0
    for key, ts in episodes:
        if any(_explains(f, key, ts, settings) for f in wanted):
            true += 1
        elif any(_explains(f, key, ts, settings) for f in confounders):
            confounded += 1
        else:
            false += 1
    return Score(dict(by_class), dict(by_type), len(episodes), true, confounded, false, node_days)


def _key(target: Target) -> tuple[str, str, str]:
    return (target.cluster, target.kind, target.name)


def _removals_by_target(actions: Iterable[Action]) -> dict[tuple[str, str, str], list[int]]:
    # Cordons ahead of scheduled maintenance are planned work, not verdicts on health.
    out: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for action in actions:
        if action.kind in REMOVALS and MAINTENANCE_CHECK not in action.reason.checks:
            out[_key(action.target)].append(action.ts)
    return {k: sorted(v) for k, v in out.items()}


def _findings_by_target(findings: Iterable[Finding]) -> dict[tuple[str, str, str], list[int]]:
    out: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for finding in findings:
        if not finding.healthy and finding.check != "heartbeat":
            out[_key(finding.entity.target)].append(finding.ts)
    return {k: sorted(v) for k, v in out.items()}


def _first_delay(times: list[int], fault: Fault, settings: ScoreSettings) -> int | None:
    for ts in times:
        if fault.onset_ms <= ts <= fault.end_ms + settings.grace_ms:
            return ts - fault.onset_ms
    return None


def _episodes(
    removals: dict[tuple[str, str, str], list[int]], settings: ScoreSettings
) -> list[tuple[tuple[str, str, str], int]]:
    episodes = []
    for key, times in sorted(removals.items()):
        last: int | None = None
        for ts in times:
            if last is None or ts - last > settings.episode_gap_ms:
                episodes.append((key, ts))
            last = ts
    return episodes


def _explains(fault: Fault, key: tuple[str, str, str], ts: int, settings: ScoreSettings) -> bool:
    return _key(fault.target) == key and fault.onset_ms <= ts <= fault.end_ms + settings.grace_ms

