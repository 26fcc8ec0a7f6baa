"""Retry delays and bounded retries, one way for the whole pipeline (tenacity underneath).

Every retry here backs off exponentially with jitter: the delay before retry n is drawn from
[d/2, d] with d = min(maximum, initial * 2**(n-1)) ("equal jitter"). The random half keeps many
clients that failed together (an endpoint restart, a broker election) from retrying in lockstep;
the fixed half keeps a retry from coming back at once.

Two shapes, because the loops differ:
- `Backoff`: a delay sequence for loops that retry forever and do other work between tries
  (the ingest loop, the alert sink's consume loop): `next_delay()` on failure, `reset()` on
  success;
- `retrying(...)`: a bounded tenacity `Retrying` for one call tried a few times (an HTTP POST).

Sleeping is injected everywhere (`sleep=`), so tests never wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tenacity
from tenacity.wait import wait_base


def jittered(initial_s: float, maximum_s: float) -> wait_base:
    """tenacity wait: exponential from `initial_s`, capped at `maximum_s`, equal jitter."""
    half, cap = initial_s / 2, maximum_s / 2
    return tenacity.wait_exponential(multiplier=half, max=cap) + tenacity.wait_random_exponential(
        multiplier=half, max=cap
    )


def _attempt(number: int) -> tenacity.RetryCallState:
    # tenacity's waits read only the attempt number of the call state they are given.
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = number
    return state


class Backoff:
    """Jittered exponential delays for a loop that retries forever; reset on success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.failures = 0
        self._wait = jittered(initial, maximum)

    def next_delay(self) -> float:
        self.failures += 1
        return float(self._wait(_attempt(self.failures)))

    def reset(self) -> None:
        self.failures = 0


def retrying(
    *,
    attempts: int,
    initial_s: float,
    maximum_s: float,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    sleep: Callable[[float], Any] = time.sleep,
    delay_hint: Callable[[BaseException], float | None] | None = None,
) -> tenacity.Retrying:
    """At most `attempts` tries of what raises `retry_on`; anything else propagates at once.

    When every try failed, tenacity raises `RetryError` (its `last_attempt` holds the last
    exception). `delay_hint(exc)` may name the delay the failure asked for (HTTP Retry-After);
    it is still capped at `maximum_s`.
    """
    backoff = jittered(initial_s, maximum_s)

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        hint = delay_hint(error) if delay_hint and error else None
        return min(maximum_s, hint) if hint is not None else float(backoff(state))

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait,
        retry=tenacity.retry_if_exception_type(retry_on),
        sleep=sleep,
    )
