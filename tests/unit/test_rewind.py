"""The rewind on its own: a toy machine whose answer comes back behind newer signals ends as
the live run did; one later than the horizon is applied as it comes."""

from __future__ import annotations

import msgspec

from pipeline.decide import rewind


class Tick(msgspec.Struct, tag=True):
    ts: int


class Answer(msgspec.Struct, tag=True):
    ts: int
    request: str


Signal = Tick | Answer


class Toy(msgspec.Struct, kw_only=True):
    clock: int = 0
    past: rewind.Past[Signal] | None = None
    answered: bool = False
    log: list[str] = []


def _apply(st: Toy, signal: Signal) -> list[str]:
    """Asks once, at its first tick; says of every tick whether the answer was in by then."""
    st.clock = max(st.clock, signal.ts)
    if isinstance(signal, Answer):
        st.answered = True
        st.log = [*st.log, f"answer@{signal.ts}"]
        return []
    st.log = [*st.log, f"tick@{signal.ts}:{'after' if st.answered else 'before'}"]
    return ["req"] if len(st.log) == 1 else []


def _machine(late_ms: int) -> rewind.Machine[Toy, Signal, str]:
    return rewind.Machine(
        apply=_apply,
        decode=msgspec.msgpack.Decoder(Toy).decode,
        output_id=lambda request: request,
        answers=lambda s: s.request if isinstance(s, Answer) else None,
        ts=lambda s: s.ts,
        logged=lambda s: s,
        late_ms=late_ms,
    )


def _run(signals: list[Signal], late_ms: int = 1000) -> tuple[Toy, list[str]]:
    machine, st, outputs = _machine(late_ms), Toy(), []
    for signal in signals:
        if isinstance(signal, Answer):
            replayed = rewind.rewind(machine, st, signal)
            if replayed is not None:
                outputs += replayed
                continue
        made = machine.apply(st, signal)
        rewind.remember(machine, st, signal, made)
        outputs += made
    return st, outputs


def test_a_late_answer_is_put_where_it_came_live() -> None:
    live, _ = _run([Tick(1), Answer(2, "req"), Tick(3), Tick(4)])
    late, outputs = _run([Tick(1), Tick(3), Tick(4), Answer(2, "req")])
    assert live.log == ["tick@1:before", "answer@2", "tick@3:after", "tick@4:after"]
    assert late.log == live.log
    assert late.past is None  # nothing in flight any more
    assert outputs == ["req"]  # asked once, not again on the rewind


def test_an_answer_past_the_horizon_is_applied_as_it_comes() -> None:
    late, _ = _run([Tick(1), Tick(30), Answer(2, "req")], late_ms=10)
    assert late.log == ["tick@1:before", "tick@30:before", "answer@2"]
