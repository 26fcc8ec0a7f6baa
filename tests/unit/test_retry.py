"""pipeline.retry: jittered exponential delays within their bounds, bounded retries that give
up, hints honoured and capped — all without sleeping (the sleep is injected)."""

from __future__ import annotations

import random

import pytest
import tenacity

from pipeline.retry import Backoff, retrying


def test_backoff_delays_stay_within_equal_jitter_bounds() -> None:
    random.seed(7)
    backoff = Backoff(initial=1.0, maximum=30.0)
    for attempt in range(1, 40):
        ceiling = min(30.0, 2.0 ** (attempt - 1))
        assert ceiling / 2 <= backoff.next_delay() <= ceiling


def test_backoff_is_jittered_not_lockstep() -> None:
    # Clients that failed together must not retry together: the same attempt gets many delays.
    firsts = {round(Backoff(1.0, 30.0).next_delay(), 6) for _ in range(50)}
    assert len(firsts) > 40 and min(firsts) >= 0.5 and max(firsts) <= 1.0


def test_backoff_resets_after_a_success() -> None:
    backoff = Backoff(1.0, 30.0)
    for _ in range(6):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0 and backoff.next_delay() <= 1.0


class DownError(Exception):
    pass


def test_retrying_gives_up_after_the_limit_with_the_last_error() -> None:
    calls, sleeps = [], []

    def fail() -> None:
        calls.append(1)
        raise DownError(f"attempt {len(calls)}")

    with pytest.raises(tenacity.RetryError) as gave_up:
        retrying(attempts=4, initial_s=0.5, maximum_s=8.0, retry_on=DownError,
                 sleep=sleeps.append)(fail)
    assert len(calls) == 4 and len(sleeps) == 3  # no wait after the last try
    assert str(gave_up.value.last_attempt.exception()) == "attempt 4"
    for delay, ceiling in zip(sleeps, [0.5, 1.0, 2.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling


def test_retrying_stops_at_once_on_an_error_it_does_not_retry() -> None:
    sleeps: list[float] = []

    def broken() -> None:
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        retrying(attempts=5, initial_s=1.0, maximum_s=8.0, retry_on=DownError,
                 sleep=sleeps.append)(broken)
    assert sleeps == []


def test_retrying_returns_the_first_success() -> None:
    outcomes, sleeps = [DownError(), DownError(), "ok"], []

    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retrying(attempts=5, initial_s=1.0, maximum_s=8.0, retry_on=DownError,
                    sleep=sleeps.append)(flaky) == "ok"
    assert len(sleeps) == 2


def test_a_delay_hint_is_used_and_capped_at_the_maximum() -> None:
    class BusyError(Exception):
        def __init__(self, after: float) -> None:
            self.after = after

    hints, sleeps = [3.0, 120.0], []

    def busy() -> None:
        raise BusyError(hints.pop(0)) if hints else DownError()

    with pytest.raises(tenacity.RetryError):
        retrying(attempts=3, initial_s=0.5, maximum_s=10.0, retry_on=(BusyError, DownError),
                 sleep=sleeps.append,
                 delay_hint=lambda exc: exc.after if isinstance(exc, BusyError) else None)(busy)
    assert sleeps == [3.0, 10.0]
