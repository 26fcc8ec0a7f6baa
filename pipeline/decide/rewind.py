"""Rewind: put an answer that comes back late where it came live, and apply again what followed.

A keyed state machine (the health machine) makes requests (proposals) and learns that they were
carried out from answers (our actions) that come back through Kafka. While a backlog is worked
off the answers come late: the signals of the next hour may be in before the answer they were
live behind. So that a backlog decides as live did, the state keeps, while a request of its own
is in flight, a `Past`: itself (encoded) as of that request, and the signals since. An answer
that arrives behind signals newer than it is placed where it came live (after the request it
answers and the signals no newer than it), and the signals after it are applied again from the
past; the outputs, their ids and their ts are those of the live run. A request whose answer has
not come within the horizon (`late_ms`) is not waited for any more.

The machine says what it is through a `Machine`: how to apply a signal, what an output's id is,
which request a signal answers, how to decode its state. The state must be a msgspec Struct
with `clock` (its event time) and `past` (`Past | None`) fields. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

E = TypeVar("E")  # a signal as logged
R = TypeVar("R")  # an output (a request)


class Past(msgspec.Struct, Generic[E], kw_only=True):
    """The state right after the oldest request still in flight (msgpack, without its own past)
    and the signals since, so that a late answer can be put where it came live."""

    state: bytes
    signals: list[E] = []
    # request id -> (len(signals), clock) when first made; gone once its answer came back
    flight: dict[str, tuple[int, int]] = {}


class Rewindable(Protocol[E]):
    clock: int
    past: Past[E] | None


S = TypeVar("S", bound=Rewindable[Any])


@dataclass(frozen=True)
class Machine(Generic[S, E, R]):
    """What the rewind needs to know of a state machine."""

    apply: Callable[[S, E], list[R]]  # apply one signal in place, return the outputs
    decode: Callable[[bytes], S]
    output_id: Callable[[R], str]
    answers: Callable[[E], str | None]  # the request id a signal answers (None: not an answer)
    ts: Callable[[E], int]
    logged: Callable[[E], E]  # what the past keeps of a signal (a heartbeat: its ts only)
    late_ms: int  # how long a request's answer is waited for, in event time


_ENCODE = msgspec.msgpack.Encoder()


def remember(machine: Machine[S, E, R], st: S, signal: E, outputs: list[R]) -> None:
    """Log `signal` (just applied, with `outputs`) while a request is in flight; start a past
    with the first request."""
    past = st.past
    if past is None:
        if outputs:
            flight = {machine.output_id(o): (0, st.clock) for o in outputs}
            st.past = Past(state=snapshot(st), flight=flight)
        return
    past.signals.append(machine.logged(signal))
    answered = machine.answers(signal)
    if answered is not None:
        past.flight.pop(answered, None)
    for output in outputs:
        past.flight.setdefault(machine.output_id(output), (len(past.signals), st.clock))
    _rebase(machine, st, past)


def rewind(machine: Machine[S, E, R], st: S, answer: E) -> list[R] | None:
    """An answer that comes back behind newer signals: from the past, apply it where it came
    live and the signals after it again; `st` becomes the result. Returns the outputs made from
    it on (each id once, as first made), or None when it is not late (or too late to place:
    the caller applies it as it comes)."""
    past = st.past
    if past is None:
        return None
    at = _place(machine, past, answer)
    if at == len(past.signals):
        return None
    then = machine.decode(past.state)
    then.past = Past(state=past.state, flight={k: m for k, m in past.flight.items() if m[0] == 0})
    for signal in past.signals[:at]:
        remember(machine, then, signal, machine.apply(then, signal))
    outputs: dict[str, R] = {}
    for signal in [answer, *past.signals[at:]]:
        made = machine.apply(then, signal)
        remember(machine, then, signal, made)
        for output in made:
            outputs.setdefault(machine.output_id(output), output)
    assign(st, then)
    return list(outputs.values())


def snapshot(st: Rewindable[Any]) -> bytes:
    """The state encoded without its past."""
    past, st.past = st.past, None
    try:
        return _ENCODE.encode(st)
    finally:
        st.past = past


def assign(st: S, other: S) -> None:
    """Make `st` (a msgspec Struct) the same as `other`, in place: the caller holds `st`."""
    for name in type(st).__struct_fields__:  # type: ignore[attr-defined]
        setattr(st, name, getattr(other, name))


def _rebase(machine: Machine[S, E, R], st: S, past: Past[E]) -> None:
    """Start the past at the oldest request still in flight (none: no past). One whose answer
    has not come back within late_ms is not waited for any more."""
    horizon = st.clock - machine.late_ms
    past.flight = {k: made for k, made in past.flight.items() if made[1] >= horizon}
    if not past.flight:
        st.past = None
        return
    start = min(at for at, _ in past.flight.values())
    if start == 0:
        return
    if start == len(past.signals):
        past.state = snapshot(st)
    else:
        then = machine.decode(past.state)
        for signal in past.signals[:start]:
            machine.apply(then, signal)
        past.state = _ENCODE.encode(then)
    past.signals = past.signals[start:]
    past.flight = {k: (at - start, clock) for k, (at, clock) in past.flight.items()}


def _place(machine: Machine[S, E, R], past: Past[E], answer: E) -> int:
    """Where `answer` came live among the logged signals: after the request it answers and the
    signals no newer than it (an answer given later than requested came at its ts)."""
    asked = machine.answers(answer)
    made = past.flight.get(asked) if asked is not None else None
    at = made[0] if made is not None else 0
    while at < len(past.signals) and machine.ts(past.signals[at]) <= machine.ts(answer):
        at += 1
    return at
