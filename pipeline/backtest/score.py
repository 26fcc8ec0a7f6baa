"""Score what the pipeline did against the simulator's ground truth (pure, no I/O).

Each fault is scored on its window, from its onset to its end plus a grace period, and on its
target (node or slice), three ways:

- *found*: an unhealthy finding on the target in the window. A removal, done or withheld, in the
  window counts as found too: the policy only proposes removals for findings. Recall goals are
  on found; time to detect is the first of these minus the onset.
- *acted*: for a fault that expects a removal, an action that takes its target out of service
  (cordon, drain, reset, reboot, repair, replace) in the window.
- *withheld*: for a fault that expects a removal and was not acted on, a removal proposal for
  the target that the policy held back in the window under one of its deliberate rules (budget,
  fatal ceiling, capacity, slow start, rate limit, zone / fleet cap, common cause, inventory
  membership): correct behaviour, listed with the rule that held it last. Holds that only wait
  for something (`busy`, `awaiting_cordon`) are not withholding.
- *missed*: not found. A found action-fault neither acted on nor withheld is counted apart
  (`found_not_acted`): acted + withheld + found_not_acted + missed = faults expecting a removal.
- *named*: for a fault whose truth names the element that failed (`element`: the leaf switch
  or the link of a fabric fault, the node of a NIC), an unhealthy finding on that element in
  the window: the finding points the repair at the right thing, not only at a node behind it.

Every removal episode (the first removal action on a target after a quiet spell) is then either
explained by a fault that wanted it (true), caused by a confounder (confounder cordon) or by
nothing (false cordon). Precision = true / all episodes. Cordons the policy places ahead of
scheduled maintenance (reason check "maintenance") are planned work and are not scored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.decide.policy import PolicyState
from pipeline.model import MAINTENANCE_CHECK, Action, Finding, Proposal, Target

REMOVALS = frozenset(
    {"cordon", "drain", "reset_gpu", "reboot", "repair", "replace", "repair_slice"}
)
ACTION_EXPECTED = frozenset({"cordon", "repair_slice"})
SCORED_EXPECTED = ACTION_EXPECTED | {"finding"}
# The policy's deliberate holds (pipeline/decide/policy.py WITHHELD_ALERT,
# pipeline/decide/guard.py); "busy" and "awaiting_cordon" only wait for an earlier action and
# do not count as withholding.
HOLD_RULES = frozenset(
    {
        "budget",
        "fatal_ceiling",
        "capacity",
        "slow_start",
        "rate_limit",
        "zone_cap",
        "fleet_cap",
        "common_cause",
        "not_in_inventory",
        "inventory_mismatch",
    }
)

Key = tuple[str, str, str]
# runtime outputs after which the policy state (and so what it withholds) may have changed
POLICY_OUTPUTS = frozenset({"node-state", "proposals", "actions", "alerts"})


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
    @property
    def element(self) -> Target | None: ...


@dataclass(frozen=True)
class Held:
    """A removal proposal the policy held back from `first_ts` to `last_ts`, and the rule that
    held it the last time it was seen."""

    proposal_id: str
    kind: str
    target: Target
    rule: str
    first_ts: int
    last_ts: int


class HeldLog:
    """Collects withheld proposals from successive looks at the policy state (which keeps only
    what is held now), one entry per proposal id with its span and latest rule."""

    def __init__(self) -> None:
        self.by_id: dict[str, Held] = {}

    def note(self, held: Iterable[tuple[Proposal, int, int, str]]) -> None:
        """`held`: (proposal, first_ts, last_ts, rule) as the policy holds them now."""
        for proposal, first_ts, last_ts, rule in held:
            if not rule:
                continue  # not gated yet: nothing held it
            seen = self.by_id.get(proposal.proposal_id)
            first = first_ts if seen is None else min(seen.first_ts, first_ts)
            self.by_id[proposal.proposal_id] = Held(
                proposal.proposal_id, proposal.kind, proposal.target, rule, first, last_ts
            )

    def note_policy(self, states: Iterable[PolicyState]) -> None:
        """What the pools' policy states hold now (EmbeddedRuntime.policy.values())."""
        self.note(
            (w.proposal, w.first_ts, w.last_ts, w.reason)
            for st in states
            for w in st.withheld.values()
        )

    def held(self) -> list[Held]:
        return [self.by_id[k] for k in sorted(self.by_id)]


@dataclass(frozen=True)
class ScoreSettings:
    grace_ms: int = 10 * 60_000  # an action this long after a fault ended still counts for it
    episode_gap_ms: int = 30 * 60_000  # removals on one target closer than this are one episode


@dataclass
class ClassScore:
    faults: int = 0
    action_faults: int = 0  # faults that expect a removal
    found: int = 0
    acted: int = 0
    withheld: int = 0
    found_not_acted: int = 0  # action faults found but neither acted on nor withheld
    element_faults: int = 0  # faults whose truth names the element that failed
    named: int = 0  # ... with an unhealthy finding on that element
    delays_ms: list[int] = field(default_factory=list)  # onset -> found
    withheld_rules: dict[str, int] = field(default_factory=dict)

    @property
    def missed(self) -> int:
        return self.faults - self.found

    @property
    def missed_action(self) -> int:
        """Action faults neither acted on nor withheld (missed, or found and let go)."""
        return self.action_faults - self.acted - self.withheld

    @property
    def recall(self) -> float | None:
        return self.found / self.faults if self.faults else None

    def add(self, other: ClassScore) -> None:
        self.faults += other.faults
        self.action_faults += other.action_faults
        self.found += other.found
        self.acted += other.acted
        self.withheld += other.withheld
        self.found_not_acted += other.found_not_acted
        self.element_faults += other.element_faults
        self.named += other.named
        self.delays_ms += other.delays_ms
        for rule, n in other.withheld_rules.items():
            self.withheld_rules[rule] = self.withheld_rules.get(rule, 0) + n

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
        "action_faults": score.action_faults,
        "found": score.found,
        "acted": score.acted,
        "withheld": score.withheld,
        "withheld_rules": dict(sorted(score.withheld_rules.items())),
        "found_not_acted": score.found_not_acted,
        "element_faults": score.element_faults,
        "named": score.named,
        "missed": score.missed,
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
    held: Iterable[Held] = (),
) -> Score:
    removals = _removals_by_target(actions)
    flagged = _findings_by_target(findings)
    holds = _holds_by_target(held)
    by_class: dict[str, ClassScore] = defaultdict(ClassScore)
    by_type: dict[str, ClassScore] = defaultdict(ClassScore)
    for fault in faults:
        if fault.expected not in SCORED_EXPECTED:
            continue
        one = fault_score(fault, removals, flagged, holds, settings)
        by_class[fault.klass].add(one)
        by_type[fault.fault_type].add(one)
    episodes = _episodes(removals, settings)
    wanted = [f for f in faults if f.expected in ACTION_EXPECTED]
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


def fault_score(
    fault: Fault,
    removals: Mapping[Key, list[int]],
    flagged: Mapping[Key, list[int]],
    holds: Mapping[Key, list[Held]],
    settings: ScoreSettings,
) -> ClassScore:
    """One fault as a ClassScore of one: found / acted / withheld (with its rule) / missed."""
    key = _key(fault.target)
    wants_action = fault.expected in ACTION_EXPECTED
    acted_at = _first_in(removals.get(key, []), fault, settings) if wants_action else None
    hold = None
    if wants_action and acted_at is None:
        hold = next((h for h in holds.get(key, []) if _overlaps(h, fault, settings)), None)
    first_finding = _first_in(flagged.get(key, []), fault, settings)
    seen = [t for t in (first_finding, acted_at) if t is not None]
    if hold is not None:
        seen.append(max(hold.first_ts, fault.onset_ms))
    out = ClassScore(faults=1, action_faults=int(wants_action))
    if seen:
        out.found = 1
        out.delays_ms.append(min(seen) - fault.onset_ms)
    if acted_at is not None:
        out.acted = 1
    elif hold is not None:
        out.withheld = 1
        out.withheld_rules[hold.rule] = 1
    elif wants_action and seen:
        out.found_not_acted = 1
    if fault.element is not None:
        out.element_faults = 1
        on_element = flagged.get(_key(fault.element), [])
        out.named = int(_first_in(on_element, fault, settings) is not None)
    return out


def _key(target: Target) -> Key:
    return (target.cluster, target.kind, target.name)


def _removals_by_target(actions: Iterable[Action]) -> dict[Key, list[int]]:
    # Cordons ahead of scheduled maintenance are planned work, not verdicts on health.
    out: dict[Key, list[int]] = defaultdict(list)
    for action in actions:
        if action.kind in REMOVALS and MAINTENANCE_CHECK not in action.reason.checks:
            out[_key(action.target)].append(action.ts)
    return {k: sorted(v) for k, v in out.items()}


def _findings_by_target(findings: Iterable[Finding]) -> dict[Key, list[int]]:
    out: dict[Key, list[int]] = defaultdict(list)
    for finding in findings:
        if not finding.healthy and finding.check != "heartbeat":
            out[_key(finding.entity.target)].append(finding.ts)
    return {k: sorted(v) for k, v in out.items()}


def _holds_by_target(held: Iterable[Held]) -> dict[Key, list[Held]]:
    out: dict[Key, list[Held]] = defaultdict(list)
    for h in held:
        if h.kind in REMOVALS and h.rule in HOLD_RULES:
            out[_key(h.target)].append(h)
    return {k: sorted(v, key=lambda h: (h.first_ts, h.proposal_id)) for k, v in out.items()}


def _first_in(times: list[int], fault: Fault, settings: ScoreSettings) -> int | None:
    for ts in times:
        if fault.onset_ms <= ts <= fault.end_ms + settings.grace_ms:
            return ts
    return None


def _overlaps(hold: Held, fault: Fault, settings: ScoreSettings) -> bool:
    return hold.first_ts <= fault.end_ms + settings.grace_ms and hold.last_ts >= fault.onset_ms


def _episodes(removals: dict[Key, list[int]], settings: ScoreSettings) -> list[tuple[Key, int]]:
    episodes = []
    for key, times in sorted(removals.items()):
        last: int | None = None
        for ts in times:
            if last is None or ts - last > settings.episode_gap_ms:
                episodes.append((key, ts))
            last = ts
    return episodes


def _explains(fault: Fault, key: Key, ts: int, settings: ScoreSettings) -> bool:
    return _key(fault.target) == key and fault.onset_ms <= ts <= fault.end_ms + settings.grace_ms
