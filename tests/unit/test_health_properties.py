"""Health state machine under random signal sequences: the safety rules hold in every state."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import HealthSettings
from pipeline.decide.health import HealthState, to_node_state, transition
from pipeline.model import REPAIR_KINDS, Action, NodeState, Proposal, Reason
from pipeline.wire.codec import decode, encode
from tests.remediation_fixture import action_for, finding, heartbeat, ms, node_event, target

SETTINGS = HealthSettings(
    persist_s=60,
    probation_s=200,
    reproposal_s=100,
    dry_run_reproposal_s=600,
    flap_window_s=600,
    flap_max=2,
    flap_hold_s=200,
    drain_timeout_s=300,
    max_repairs=3,
)
T = target()
CHECKS = ("ecc", "xid")
ops = st.one_of(
    st.tuples(
        st.just("open"),
        st.sampled_from(CHECKS),
        st.booleans(),
        st.sampled_from(["watch", "cordon", "drain", "reset_gpu", "reboot", "replace"]),
        st.sampled_from(["0", "1"]),
    ),
    st.tuples(st.just("close"), st.sampled_from(CHECKS), st.sampled_from(["0", "1", None])),
    st.tuples(st.just("hb")),
    st.tuples(st.just("do")),
    st.tuples(st.just("dry")),
    st.tuples(
        st.just("event"),
        st.sampled_from(["cordoned", "uncordoned", "drained", "repaired", "deleted", "created",
                         "held", "blocked", "skipped", "repair_requested", "ready", "not_ready"]),
    ),
    st.tuples(
        st.just("foreign"),
        st.sampled_from(["cordon", "uncordon", "drain", "reboot"]),
        st.booleans(),
    ),
)
steps = st.lists(st.tuples(st.integers(0, 240), ops), min_size=1, max_size=60)


def _signal(op: tuple[Any, ...], at: float, last: Proposal | None, n: int) -> Any:
    name = op[0]
    if name == "open":
        return finding(T, at, op[1], fatal=op[2], action=op[3], device=op[4])
    if name == "close":
        return finding(T, at, op[1], healthy=True, device=op[2])
    if name in ("do", "dry") and last is not None:
        return action_for(last, at, dry_run=name == "dry")
    if name == "event":
        return node_event(T, at, op[1])
    if name == "foreign":  # an action nobody here proposed: the policy's maintenance, a replay
        checks = ["maintenance"] if op[2] else ["ecc"]
        return Action(
            action_id=f"act-foreign-{n}",
            ts=ms(at),
            kind=op[1],
            target=T,
            reason=Reason(checks=checks, finding_ids=[], summary="x"),
            dry_run=False,
            proposal_id=f"prp-foreign-{n}",
        )
    return heartbeat(T, at)


def _run(sequence: list[tuple[int, tuple[Any, ...]]]) -> list[tuple[HealthState, list[Proposal]]]:
    state: HealthState | None = None
    last: Proposal | None = None
    at = 0.0
    trace = []
    for n, (dt, op) in enumerate(sequence):
        at += dt
        state, proposals = transition(state, _signal(op, at, last, n), SETTINGS)
        # transition changes the state it is given; a driver keeps snapshots (topology.py)
        trace.append((msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=HealthState),
                      proposals))
        last = proposals[-1] if proposals else last
    return trace


@settings(max_examples=200, deadline=None)
@given(steps)
def test_safety_rules_hold_after_every_signal(sequence: list[tuple[int, tuple[Any, ...]]]) -> None:
    for state, proposals in _run(sequence):
        assert len(proposals) <= 1
        for proposal in proposals:
            assert not state.human_hold, "proposed while a person holds the target"
            assert not state.maintenance, "proposed during scheduled maintenance"
            if proposal.kind == "drain" or proposal.kind in REPAIR_KINDS:
                assert state.cordoned_by_us, f"{proposal.kind} proposed before our cordon"
            if proposal.kind == "uncordon":
                assert state.cordoned_by_us, "release proposed for a cordon that is not ours"
            if proposal.kind == "cordon":
                assert not state.cordoned_by_us and state.state == "degraded"
            assert proposal.episode == state.episode
        node_state = to_node_state(state)
        assert decode(encode(node_state), NodeState) == node_state


@settings(max_examples=100, deadline=None)
@given(steps)
def test_same_signals_same_states_and_ids(sequence: list[tuple[int, tuple[Any, ...]]]) -> None:
    first = [(encode(to_node_state(s)), [p.proposal_id for p in ps]) for s, ps in _run(sequence)]
    again = [(encode(to_node_state(s)), [p.proposal_id for p in ps]) for s, ps in _run(sequence)]
    assert first == again
