"""The episode engine: one persistence counter and one open / clear path for every check.

A rule says whether its condition is bad at this sample; `step` counts how long it has been bad
(consecutive samples, or event time since it turned bad) and how long good again, against the
check's persistence (catalog spec, overridable per check in `[detect.checks."<name>"]`), and
returns OPEN or CLEAR at the edges. `open_episode` / `clear_episode` then build the finding from
the spec: severity, action, fatality and entity kind are never written at a call site. The
detectors reach all this through one emitter (emit.py), with judgements. `timer` gives the same
counting to a condition that is not a check (a plain slowdown lasting long enough to count as
throttling: catalog.SLOW_LASTING), held while its run is open.

An open episode is silent until it clears, so a second fault on top of the first (a rank slowed
further on a node already slow) would go unsaid. `deepened` follows the open episode's signal
and says when it has fallen a further fraction below the level it held, for the check's own
open persistence; `deepen_episode` then announces it again (a new unhealthy finding of the same
episode, which the health machine takes as a refresh).

A `Run` exists only while its condition is bad, open, or on its way back to good (until the
clear limit), so a healthy device costs one failed dict lookup per check.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect.catalog import spec_of
from pipeline.detect.findings import Book, clear_check, deepen_check, open_check
from pipeline.detect.spec import CheckSpec, Persistence, Unit
from pipeline.model import Evidence, Finding, RecommendedAction, Severity

OPEN, CLEAR = 1, -1
# How fast an open episode's mark follows its signal while it is not deeper: about five
# samples, so a slow drift or a recovery moves the mark and only a step down is news.
MARK_FOLLOW = 0.2


class Run(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """The current bad or good stretch of one condition (zero fields are left out of the
    stored state: most runs never get a mark)."""

    bad_since: int = 0  # event time the bad stretch began (0: good now)
    good_since: int = 0  # event time the good stretch began (0: bad now)
    streak: int = 0  # > 0 consecutive bad samples, < 0 consecutive good ones
    open: bool = False
    mark: float = 0.0  # open: the level the signal holds (0: not yet seen), see deepened
    deeper_since: int = 0  # open: event time the signal fell below the mark (0: it is not)
    deeper: int = 0  # ... and for how many consecutive samples


class Rule(NamedTuple):
    """A check's persistence with the settings applied: samples, or milliseconds."""

    open_after: int
    open_ms: bool
    clear_after: int
    clear_ms: bool


def step(runs: dict[str, Run], key: str, ts: int, bad: bool, rule: Rule) -> int:
    """Feed one verdict: OPEN once bad for `rule.open_after`, CLEAR once an open condition
    has been good for `rule.clear_after`, else 0. Both limits are samples or milliseconds."""
    run = runs.get(key)
    if bad:
        if run is None:
            run = runs[key] = Run(bad_since=ts, streak=1)
        elif run.streak <= 0:
            run.bad_since, run.good_since, run.streak = ts, 0, 1
        else:
            run.streak += 1
        if not run.open and _held(rule.open_after, rule.open_ms, run.streak, ts - run.bad_since):
            run.open = True
            return OPEN
        return 0
    if run is None:
        return 0
    if run.streak >= 0:
        run.bad_since, run.good_since, run.streak = 0, ts, -1
    else:
        run.streak -= 1
    if _held(rule.clear_after, rule.clear_ms, -run.streak, ts - run.good_since):
        del runs[key]
        return CLEAR if run.open else 0
    return 0


def _held(limit: int, in_ms: bool, samples: int, elapsed_ms: int) -> bool:
    return elapsed_ms >= limit if in_ms else samples >= limit


def counting(runs: dict[str, Run], key: str, rule: Rule) -> bool:
    """Whether a sample-counted condition is on its way to an edge (a run below the open
    limit, or one clearing): its next sample matters even if the inputs have not changed."""
    run = runs.get(key)
    return run is not None and -rule.clear_after < run.streak < rule.open_after


def watched(runs: dict[str, Run], key: str) -> bool:
    """Whether `key`'s episode is open: a watch that a persistent check's hysteresis leans on
    (once watched, half the threshold holds the longer run)."""
    run = runs.get(key)
    return run is not None and run.open


def deepened(
    runs: dict[str, Run], key: str, ts: int, value: float, frac: float, rule: Rule
) -> float | None:
    """Feed the signal of an open episode (lower is worse) each judged sample. Returns the
    mark it fell from once it has stayed `frac` below it for the rule's open persistence (the
    mark is then the new level), else None. The mark follows the signal while it is not below
    it, and starts again when the episode does."""
    run = runs.get(key)
    if run is None or not run.open:
        return None
    if run.mark <= 0.0:
        run.mark = value
        return None
    if value > run.mark * (1.0 - frac):
        run.mark += MARK_FOLLOW * (value - run.mark)
        run.deeper_since = run.deeper = 0
        return None
    run.deeper_since = run.deeper_since or ts
    run.deeper += 1
    if not _held(rule.open_after, rule.open_ms, run.deeper, ts - run.deeper_since):
        return None
    fell_from = run.mark
    run.mark, run.deeper_since, run.deeper = value, 0, 0
    return fell_from


def forget_mark(runs: dict[str, Run], key: str) -> None:
    """The signal's level changes for a known reason (a new job sets its own clocks): the
    next sample is the new mark, not a deepening."""
    run = runs.get(key)
    if run is not None:
        run.mark, run.deeper_since, run.deeper = 0.0, 0, 0


def onset(runs: dict[str, Run], key: str) -> int:
    """When the current bad stretch began (0: not bad)."""
    run = runs.get(key)
    return run.bad_since if run is not None else 0


# Rules by settings object: settings are frozen and few, and a rule is read per GPU per scrape.
_RULES: dict[int, tuple[DetectSettings, dict[str, Rule]]] = {}


def rule(settings: DetectSettings, check: str) -> Rule:
    """The persistence of `check` under `settings` (its `[detect.checks]` override applied)."""
    cached = _RULES.get(id(settings))
    if cached is None or cached[0] is not settings:
        if len(_RULES) > 64:
            _RULES.clear()
        cached = _RULES[id(settings)] = (settings, {})
    rules = cached[1]
    found = rules.get(check)
    if found is None:
        found = rules[check] = _resolve(settings, spec_of(check))
    return found


def timer(settings: DetectSettings, persistence: Persistence, check: str) -> Rule:
    """A persistence that is not a check's own but one of its conditions' (how long a plain
    slowdown lasts before it counts as throttling), under `check`'s settings; counted with
    `step` like a check's, and held while its run is open (`watched`)."""
    cached = _TIMERS.get((id(settings), id(persistence), check))
    if cached is not None and cached[0] is settings:
        return cached[1]
    if len(_TIMERS) > 64:
        _TIMERS.clear()
    tuned = settings.tuned(check)
    p = persistence
    found = Rule(
        _amount(tuned, p.open_after, p.open_unit), p.open_unit == "seconds",
        _amount(tuned, p.clear_after, p.clear_unit), p.clear_unit == "seconds",
    )  # fmt: skip
    _TIMERS[(id(settings), id(persistence), check)] = (settings, found)
    return found


_TIMERS: dict[tuple[int, int, str], tuple[DetectSettings, Rule]] = {}


def _resolve(settings: DetectSettings, spec: CheckSpec) -> Rule:
    p = spec.persistence
    tuning = settings.checks.get(spec.name)
    settings = settings.tuned(spec.name)  # a persistence setting may be the check's own
    opened = _amount(settings, p.open_after, p.open_unit)
    cleared = _amount(settings, p.clear_after, p.clear_unit)
    if tuning is not None and tuning.open_after is not None:
        opened = _scaled(tuning.open_after, p.open_unit)
    if tuning is not None and tuning.clear_after is not None:
        cleared = _scaled(tuning.clear_after, p.clear_unit)
    return Rule(opened, p.open_unit == "seconds", cleared, p.clear_unit == "seconds")


def _amount(settings: DetectSettings, amount: int | str, unit: Unit) -> int:
    value = getattr(settings, amount) if isinstance(amount, str) else amount
    return _scaled(int(value), unit)


def _scaled(value: int, unit: Unit) -> int:
    return value * 1000 if unit == "seconds" else value


def open_episode(
    book: Book,
    check: str,
    ts: int,
    *,
    device: str | None,
    evidence: Evidence | None,
    message: str,
    start_ts: int | None = None,
    key: str | None = None,
    announced: bool = False,
    action: RecommendedAction | None = None,
    severity: Severity | None = None,
    fatal: bool | None = None,
) -> Finding | None:
    """Open an episode of `check` with its spec's severity, action, fatality and entity kind
    (an announced absence: the spec's `when_announced`). `action`, and `severity` / `fatal`,
    are given only where the spec says they come from the data (`action_from`,
    `severity_from`: the XID catalog, the driver's recovery action). None when the episode is
    open already."""
    spec = spec_of(check)
    graded: Severity = spec.severity
    chosen: RecommendedAction = spec.action
    if announced and spec.when_announced is not None:
        graded, chosen = spec.when_announced
    if (action and not spec.action_from) or (
        (severity or fatal is not None) and not spec.severity_from
    ):
        raise ValueError(f"{check}: its action and severity are the catalog's, not the caller's")
    chosen = action or chosen
    graded = severity or graded
    return open_check(
        book,
        ts,
        check=check,
        device=device,
        kind=spec.entity,
        severity=graded,
        action=chosen,
        fatal=(spec.fatal if fatal is None else fatal) and not announced,
        evidence=evidence,
        message=message,
        key=key,
        start_ts=start_ts,
    )


def deepen_episode(
    book: Book,
    check: str,
    ts: int,
    *,
    device: str | None,
    evidence: Evidence | None,
    message: str,
    key: str | None = None,
) -> Finding | None:
    """Announce an open episode of `check` again because its signal got worse (`deepened`):
    an unhealthy finding with the spec's severity and action, None when none is open."""
    spec = spec_of(check)
    return deepen_check(
        book, ts, check=check, device=device, severity=spec.severity, action=spec.action,
        evidence=evidence, message=message, key=key,
    )


def clear_episode(
    book: Book,
    check: str,
    ts: int,
    device: str | None,
    message: str,
    evidence: Evidence | None = None,
    key: str | None = None,
) -> Finding | None:
    """Close an open episode of `check`: its healthy finding, or None when none is open."""
    return clear_check(book, ts, check, device, message, evidence, key)
