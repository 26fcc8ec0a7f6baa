"""An open episode announced again when its signal gets markedly worse (episodes.deepened): a
second slowdown on top of an open one is news, noise around the open level is not."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.detect.episodes import (
    OPEN,
    Rule,
    Run,
    deepen_episode,
    deepened,
    forget_mark,
    open_episode,
    step,
)
from pipeline.detect.findings import Book
from pipeline.model import Event, Finding, GpuSample
from pipeline.runtime.embedded import collect
from tests.detect_fixture import quiet_fleet

RULE = Rule(open_after=4, open_ms=False, clear_after=6, clear_ms=False)
FRAC = 0.05
BASE = load_settings(environ={})
NODE = "fp-us-central1-h200-train-002"  # a training node busy all run under seed 3
MINUTE = 60_000


def _open_runs() -> dict[str, Run]:
    runs: dict[str, Run] = {}
    for ts in range(1, 5):
        edge = step(runs, "k", ts, True, RULE)
    assert edge == OPEN
    return runs


def _feed(runs: dict[str, Run], values: list[float], start: int = 10) -> list[float | None]:
    return [deepened(runs, "k", start + i, v, FRAC, RULE) for i, v in enumerate(values)]


@given(
    level=st.floats(100.0, 3000.0),
    wobble=st.lists(st.floats(-FRAC / 2, FRAC / 2), min_size=1, max_size=80),
)
def test_noise_within_half_the_fraction_never_deepens(level: float, wobble: list[float]) -> None:
    runs = _open_runs()
    assert _feed(runs, [level * (1 + w) for w in wobble]) == [None] * len(wobble)


def test_a_step_down_held_for_the_checks_persistence_deepens_once() -> None:
    runs = _open_runs()
    got = _feed(runs, [1500.0] * 5 + [1300.0] * 8 + [1100.0] * 4)
    hits = [(i, mark) for i, mark in enumerate(got) if mark is not None]
    # the first deeper sample is index 5; the fourth in a row announces it, once; then 1100
    # is a further step below the new mark 1300
    assert hits == [(8, 1500.0), (16, 1300.0)]


def test_a_dip_shorter_than_the_persistence_is_not_news() -> None:
    runs = _open_runs()
    assert _feed(runs, [1500.0] * 5 + [1300.0] * 3 + [1500.0] * 5 + [1300.0] * 3) == [None] * 16


def test_the_mark_follows_a_recovery_so_a_later_step_is_seen_again() -> None:
    runs = _open_runs()
    got = _feed(runs, [1500.0] * 3 + [1300.0] * 4 + [1500.0] * 20 + [1300.0] * 4)
    assert [i for i, mark in enumerate(got) if mark is not None] == [6, 30]


def test_only_an_open_episode_deepens_and_a_forgotten_mark_starts_again() -> None:
    runs: dict[str, Run] = {}
    step(runs, "k", 1, True, RULE)  # bad, not open yet
    assert _feed(runs, [1500.0] + [1000.0] * 6) == [None] * 7
    runs = _open_runs()
    _feed(runs, [1500.0] * 3)
    forget_mark(runs, "k")  # a new job with its own clocks
    assert _feed(runs, [1000.0] * 6) == [None] * 6


def test_the_deepened_finding_is_the_open_episodes_with_an_id_of_its_own() -> None:
    book = Book(cluster="c", kind="node", name="n", pool="p", zone="z")
    assert deepen_episode(book, "gpu.clock.slow", 5, device="0", evidence=None, message="m") is None
    opened = open_episode(book, "gpu.clock.slow", 1, device="0", evidence=None, message="m")
    again = deepen_episode(book, "gpu.clock.slow", 5, device="0", evidence=None, message="worse")
    later = deepen_episode(book, "gpu.clock.slow", 9, device="0", evidence=None, message="worse")
    assert opened is not None and again is not None and later is not None
    assert not again.healthy and again.check == opened.check
    assert again.entity == opened.entity and again.recommended_action == "watch"
    assert len({opened.finding_id, again.finding_id, later.finding_id}) == 3
    replay = deepen_episode(book, "gpu.clock.slow", 5, device="0", evidence=None, message="x")
    assert replay is not None and replay.finding_id == again.finding_id


def _slower(event: Event, start: int, end: int, speed: float) -> Event:
    if not isinstance(event, GpuSample) or event.node != NODE or not start <= event.ts < end:
        return event
    gpus = [
        msgspec.structs.replace(g, metrics=g.metrics | {
            "DCGM_FI_DEV_SM_CLOCK": round(g.metrics["DCGM_FI_DEV_SM_CLOCK"] * speed)})
        for g in event.gpus
    ]  # fmt: skip
    return msgspec.structs.replace(event, gpus=gpus)


def _worse_findings(second_step: bool) -> tuple[int, list[Finding]]:
    settings, events = quiet_fleet(minutes=45)
    t0 = events[0].ts
    # the node 20 % slower from minute 5 on (a fail-slow node) and, in the first run, a rank
    # transient 15 % slower still from minute 25 to 33
    slowed = [_slower(e, t0 + 5 * MINUTE, t0 + 60 * MINUTE, 0.8) for e in events]
    if second_step:
        slowed = [_slower(e, t0 + 25 * MINUTE, t0 + 33 * MINUTE, 0.85) for e in slowed]
    out = collect(settings, iter(slowed))
    found = [f for f in out.get("findings", []) if isinstance(f, Finding)
             and f.entity.target.name == NODE and not f.healthy
             and f.check.startswith("gpu.clock")]  # fmt: skip
    return t0, found


def test_a_slowdown_on_a_node_already_slow_is_announced_again() -> None:
    t0, found = _worse_findings(second_step=True)
    first = {(f.check, f.entity.device) for f in found if f.ts < t0 + 25 * MINUTE}
    assert first, "the first slowdown opened nothing"
    worse = [f for f in found if "worse" in f.message]
    assert worse, [(f.check, f.ts - t0, f.message) for f in found]
    assert all(t0 + 25 * MINUTE < f.ts <= t0 + 33 * MINUTE for f in worse)
    assert {(f.check, f.entity.device) for f in worse} <= first  # the open episodes, again
    proof = worse[0].evidence
    assert proof is not None and proof.value is not None and proof.baseline is not None
    assert proof.value <= (1 - BASE.detect.clock_drop_frac) * proof.baseline


def test_a_node_that_stays_as_slow_is_not_announced_again() -> None:
    _, found = _worse_findings(second_step=False)
    assert found, "the slowdown opened nothing"
    assert not [f for f in found if "worse" in f.message]
