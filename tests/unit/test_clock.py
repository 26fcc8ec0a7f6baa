"""The robust partition clock (pipeline/stages/clock.py): no minority of keys can move it, the
door refuses what is far off it, and a stream that resumes after a silence is followed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import ClockSettings
from pipeline.stages.clock import TICK_MS, RobustClock

SETTINGS = ClockSettings()  # max_ahead_s 300, quorum 10 % (at least 2 keys), min_keys 3
KEYS = [f"c/node-{i:02d}" for i in range(20)]
START = 1_700_000_000_000


def _report(clock: RobustClock, ts: int, keys: list[str] = KEYS) -> list[int]:
    ticks: list[int] = []
    for key in keys:
        if clock.check(ts, key=key) is None:
            ticks += clock.observe(key, ts)
        else:
            clock.claim(key, ts)
    return ticks


def _fleet_at(minutes: int) -> RobustClock:
    clock = RobustClock(SETTINGS)
    for m in range(minutes + 1):
        _report(clock, START + m * 60_000)
    return clock


def test_the_clock_moves_with_the_fleet_in_ticks() -> None:
    clock = _fleet_at(5)
    assert clock.ticked == START + 5 * 60_000 - (START + 5 * 60_000) % TICK_MS
    ticks = _report(clock, START + 6 * 60_000)
    assert ticks and ticks == sorted(ticks) and all(t % TICK_MS == 0 for t in ticks)


def test_one_host_a_day_ahead_is_refused_and_moves_nothing() -> None:
    clock = _fleet_at(5)
    before = clock.ticked
    day = 24 * 3600 * 1000
    for _ in range(50):  # it keeps sending
        verdict = clock.check(START + day, key=KEYS[0])
        assert verdict is not None and verdict.reason == "ahead"
        assert "within 300 s of the partition's clock" in verdict.message
        clock.claim(KEYS[0], START + day)
    assert clock.ticked == before
    assert clock.resumed is None


def test_a_record_far_behind_the_clock_is_refused() -> None:
    clock = _fleet_at(90)
    verdict = clock.check(START, key=KEYS[0])
    assert verdict is not None and verdict.reason == "behind"


def test_after_a_silence_of_the_whole_stream_the_clock_follows_it_in_one_tick() -> None:
    clock = _fleet_at(10)
    back = START + 25 * 60_000  # 15 minutes of nothing, then everyone reports again
    refused, ticks = [], []
    for key in KEYS:
        if clock.check(back, key=key) is None:
            ticks += clock.observe(key, back)
        else:
            refused.append(key)
            clock.claim(key, back)
    assert refused == KEYS[: clock.quorum() - 1]  # dead letters only until a quorum claims it
    assert ticks == [back - back % TICK_MS]  # no ticks for the gap: nothing was known in it
    assert clock.resumed == back - back % TICK_MS
    assert all(clock.check(back + 30_000, key=key) is None for key in KEYS)


@given(ahead_ms=st.lists(st.integers(1, 10**10), min_size=1, max_size=30))
def test_fewer_keys_than_the_quorum_never_move_the_clock(ahead_ms: list[int]) -> None:
    clock = _fleet_at(3)
    honest_now = clock.ticked
    assert clock.quorum() > 1  # 20 keys: two must agree
    key = KEYS[0]  # quorum - 1 keys: one, here, sending any times ahead
    for i, jump in enumerate(ahead_ms):
        ts = START + 3 * 60_000 + jump
        if clock.check(ts, key=key) is None:
            clock.observe(key, ts)
        else:
            clock.claim(key, ts)
        assert clock.ticked == honest_now, (i, jump)
