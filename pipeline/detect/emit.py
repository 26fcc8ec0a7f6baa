"""The one emitter: detectors return judgements, this turns them into episodes.

A detector says, per check and device at one instant, whether the condition is bad: a
`Judgement`, True, False, or None when there was nothing to judge that counts either way (an
idle scrape between a job's peaks). `emit` does the rest, the same for every detector family:

- a check whose persistence the engine counts (its catalog spec has no `window`): the verdict
  goes to the episode engine (episodes.step), and the episode opens or clears at its edges;
- a windowed check (the detector's own window, quiet spell or absence count decided): a bad
  verdict opens the episode unless it is open, a good one clears it if it is.

Severity, action, fatality and entity kind come from the catalog (episodes.open_episode).
Message and evidence are built only at an edge (`say`): most verdicts change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from pipeline.config import DetectSettings
from pipeline.detect import episodes
from pipeline.detect.catalog import spec_of
from pipeline.detect.episodes import CLEAR, OPEN, Rule, Run
from pipeline.detect.findings import Book, episode_key
from pipeline.model import Evidence, Finding, RecommendedAction, Severity

Said = tuple[str, Evidence | None]  # a finding's message and evidence
Say = Callable[[int], Said]  # OPEN or CLEAR -> what the finding says


class Judgement(NamedTuple):
    """A detector's verdict on one check of one device at one instant."""

    check: str
    device: str | None
    bad: bool | None  # None: nothing judged; it counts neither towards opening nor clearing
    say: Say
    key: str | None = None  # the run and episode key, where a check has several per device
    open_ms: int | None = None  # this verdict's own open persistence (ms), not the check's
    start_ts: int | None = None  # a windowed check: when the condition began (names it)
    by_onset: bool = False  # a counted check: name the episode by when it turned bad
    announced: bool = False  # the target was announced as going away (catalog when_announced)
    action: RecommendedAction | None = None  # where the spec says the data decides them
    severity: Severity | None = None
    fatal: bool | None = None


def emit(
    book: Book,
    runs: dict[str, Run],
    ts: int,
    judged: Judgement,
    settings: DetectSettings,
    out: list[Finding],
) -> bool | None:
    """Turn one judgement into the finding of an episode edge, if any (appended to `out`);
    returns the verdict, for detectors that chain their rules on it."""
    bad = judged.bad
    if bad is None:
        return None
    counted = _COUNTED.get(judged.check)
    if counted is None:
        counted = _COUNTED[judged.check] = spec_of(judged.check).engine_counted
    if not counted:
        _windowed(book, ts, judged, out)
        return bad
    run_key = judged.key or judged.check
    if not bad and run_key not in runs:
        return bad  # the common case: good for a while already
    timing = episodes.rule(settings, judged.check)
    if judged.open_ms is not None:
        timing = Rule(judged.open_ms, True, timing.clear_after, timing.clear_ms)
    edge = episodes.step(runs, run_key, ts, bad, timing)
    if edge == OPEN:
        start = episodes.onset(runs, run_key) if judged.by_onset else judged.start_ts
        _open(book, ts, judged, start, out)
    elif edge == CLEAR:
        _clear(book, ts, judged, out)
    return bad


# Whether the engine counts a check, by name: read for every judgement (xid.<code> names are
# many but few are ever seen on one fleet).
_COUNTED: dict[str, bool] = {}


def _windowed(book: Book, ts: int, judged: Judgement, out: list[Finding]) -> None:
    opened = (judged.key or episode_key(judged.check, judged.device)) in book.open
    if judged.bad and not opened:
        _open(book, ts, judged, judged.start_ts, out)
    elif not judged.bad and opened:
        _clear(book, ts, judged, out)


def _open(book: Book, ts: int, judged: Judgement, start_ts: int | None, out: list[Finding]) -> None:
    message, evidence = judged.say(OPEN)
    found = episodes.open_episode(
        book, judged.check, ts, device=judged.device, evidence=evidence, message=message,
        start_ts=start_ts, key=judged.key, announced=judged.announced, action=judged.action,
        severity=judged.severity, fatal=judged.fatal,
    )  # fmt: skip
    if found is not None:
        out.append(found)


def _clear(book: Book, ts: int, judged: Judgement, out: list[Finding]) -> None:
    message, evidence = judged.say(CLEAR)
    found = episodes.clear_episode(
        book, judged.check, ts, judged.device, message, evidence, judged.key
    )
    if found is not None:
        out.append(found)


def deepen(
    book: Book,
    runs: dict[str, Run],
    ts: int,
    settings: DetectSettings,
    check: str,
    device: str | None,
    value: float,
    frac: float,
    say: Callable[[float], Said],
    out: list[Finding],
) -> None:
    """Announce an open episode of `check` again once `value` (lower is worse) has fallen a
    further `frac` below the level it held, for the check's persistence (episodes.deepened);
    `say` gets the level it fell from."""
    if check not in runs:
        return  # the common case: no episode at all
    fell_from = episodes.deepened(runs, check, ts, value, frac, episodes.rule(settings, check))
    if fell_from is None:
        return
    message, evidence = say(fell_from)
    found = episodes.deepen_episode(
        book, check, ts, device=device, evidence=evidence, message=message
    )
    if found is not None:
        out.append(found)


def clear_device(book: Book, ts: int, device: str, message: str, out: list[Finding]) -> None:
    """Close every open episode of `device`: it was replaced, its findings no longer apply."""
    for key, episode in list(book.open.items()):
        if episode.device == device:
            found = episodes.clear_episode(book, episode.check, ts, device, message, key=key)
            if found is not None:
                out.append(found)


def said(message: str, evidence: Evidence | None = None) -> Say:
    """A Say for findings whose words do not depend on the edge's data (a clear, a fixed
    message)."""
    return lambda _edge: (message, evidence)
