"""The one emitter: judgements in, episode findings out, the same for every detector family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.emit import Judgement, Said, clear_device, emit, said
from pipeline.detect.episodes import CLEAR, OPEN, Run, step, timer, watched
from pipeline.detect.findings import Book, evidence
from pipeline.model import Finding

SETTINGS = DetectSettings()


def book() -> Book:
    return Book(cluster="c", kind="node", name="n1", pool="p", zone="z")


def run(
    verdicts: Sequence[bool | None], check: str, **extra: Any
) -> tuple[Book, list[Finding], list[int]]:
    """Feed `verdicts` of `check` on device 0, one per 10 s; returns the book, the findings and
    the edges `say` was asked for."""
    target, runs, out, asked = book(), dict[str, Run](), list[Finding](), list[int]()

    def say(edge: int) -> Said:
        asked.append(edge)
        return f"edge {edge}", evidence("m", 1.0, 0.0, None, 0)

    for i, bad in enumerate(verdicts):
        judged = Judgement(check, "0", bad, say, **extra)
        emit(target, runs, (i + 1) * 10_000, judged, SETTINGS, out)
    return target, out, asked


def test_a_counted_check_opens_after_its_persistence_and_clears_after_its_own() -> None:
    opens, clears = SETTINGS.gray_persist_samples, SETTINGS.clear_persist_samples
    _, out, asked = run([True] * opens + [False] * clears, catalog.GPU_TEMP)
    assert [(f.healthy, f.ts) for f in out] == [(False, opens * 10_000),
                                                (True, (opens + clears) * 10_000)]  # fmt: skip
    assert asked == [OPEN, CLEAR]  # words are built at the edges only
    assert out[0].severity == "warning" and out[0].recommended_action == "cordon"


def test_nothing_judged_counts_neither_way() -> None:
    opens = SETTINGS.gray_persist_samples
    _, out, _ = run([True] * (opens - 1) + [None] * 5 + [True], catalog.GPU_TEMP)
    assert [f.healthy for f in out] == [False]  # the Nones did not break the bad stretch
    _, out, _ = run([True] * (opens - 1) + [False, True], catalog.GPU_TEMP)
    assert out == []  # a good verdict did


def test_a_windowed_check_opens_at_a_bad_verdict_and_clears_at_a_good_one() -> None:
    target, out, asked = run([True, True, None, False, False], catalog.GPU_ECC_DBE)
    assert [(f.healthy, f.ts) for f in out] == [(False, 10_000), (True, 40_000)]
    assert asked == [OPEN, CLEAR] and not target.open
    assert out[0].fatal and out[0].recommended_action == "reset_gpu"


def test_a_counted_episode_can_be_named_by_its_onset() -> None:
    opens = SETTINGS.gray_persist_samples
    _, named, _ = run([True] * opens, catalog.JOB_STRAGGLER, by_onset=True)
    _, found, _ = run([True] * opens, catalog.JOB_STRAGGLER)
    assert named[0].finding_id != found[0].finding_id
    _, again, _ = run([False, *[True] * opens], catalog.JOB_STRAGGLER, by_onset=True)
    assert again[0].finding_id != named[0].finding_id  # another onset, another episode


def test_a_verdict_may_carry_its_own_open_persistence() -> None:
    target, runs, out = book(), dict[str, Run](), list[Finding]()
    for ts in (1_000, 2_000, 5_000):
        judged = Judgement(catalog.ICI_LINK_DOWN, "3:1", True, said("down"), key="k",
                           open_ms=3_000)  # fmt: skip
        emit(target, runs, ts, judged, SETTINGS, out)
    assert [f.ts for f in out] == [5_000] and "k" in target.open


def test_the_catalog_decides_the_action_unless_the_spec_says_the_data_does() -> None:
    with pytest.raises(ValueError, match="catalog's"):
        run([True] * SETTINGS.gray_persist_samples, catalog.GPU_TEMP, action="reboot")
    _, out, _ = run([True], catalog.GPU_RECOVERY_ACTION, action="drain")
    assert out[0].recommended_action == "drain"


def test_a_replaced_device_has_every_episode_cleared() -> None:
    target, _, _ = run([True], catalog.GPU_ECC_DBE)
    out: list[Finding] = []
    clear_device(target, 99_000, "0", "GPU 0 replaced", out)
    assert [(f.check, f.healthy) for f in out] == [(catalog.GPU_ECC_DBE, True)]
    assert not target.open


def test_a_condition_timer_holds_while_its_run_is_open() -> None:
    rule = timer(SETTINGS, catalog.SLOW_LASTING, catalog.GPU_CLOCK_THROTTLE)
    assert rule.open_after == SETTINGS.slow_escalate_s * 1000 and rule.open_ms
    assert rule.clear_after == 1 and not rule.clear_ms
    level = timer(SETTINGS, catalog.POWER_LEVEL, catalog.GPU_POWER)
    assert level == (SETTINGS.clear_persist_samples, False, 1, False)
    runs: dict[str, Run] = {}
    held = []
    for ts in range(0, 1_300_000, 100_000):
        step(runs, "k", ts, True, rule)
        held.append(watched(runs, "k"))
    assert held.index(True) == SETTINGS.slow_escalate_s // 100  # held from the limit on
    step(runs, "k", 1_300_000, False, rule)
    assert not watched(runs, "k")  # one scrape without it ends it
