"""Our own actions coming back late (a worked-off backlog) decide as they do live.

Live, the policy acts on a proposal at once and the action is back before the next finding;
working off a backlog on Kafka, it comes back after findings and reports up to an hour of event
time newer. The health machine puts such an action where it came live and applies what followed
again: the proposals (ids, kinds, and the ts they are dated at) are the same whatever the lag.
The policy's half: an action it takes at once is dated by its proposal, not by the pool's clock,
which runs ahead of a target whose actions come back late.
"""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import HealthSettings, PolicySettings
from pipeline.decide import health, health_propose, policy
from pipeline.model import Action, Finding, NodeEvent, Proposal
from tests.remediation_fixture import action_for, finding, heartbeat, ms, node_event, target

# repair_after_failed_drain: a drain nobody reports is followed by a repair at its timeout,
# so the timeout's start (the drain's own ts, however late it came back) shows in the proposals
SETTINGS = HealthSettings(
    persist_s=60, probation_s=300, reproposal_s=120, drain_timeout_s=600, event_ahead_s=100,
    repair_after_failed_drain=True,
)
POLICY = PolicySettings()
T = target("n1")
# A GPU that fails, is drained and reported repaired (by people who do not wait for our
# actions), clears, and stays quiet through probation: cordon, drain, reset_gpu, uncordon.
FAILS_AND_IS_REPAIRED: list[Finding | NodeEvent] = [
    finding(T, 0, fatal=True),
    heartbeat(T, 60),
    finding(T, 70, "xid_48", action="reboot", device="1"),
    heartbeat(T, 120),
    node_event(T, 130, "drained"),
    heartbeat(T, 180),
    finding(T, 200, "xid_48", healthy=True, device="1"),
    heartbeat(T, 240),
    node_event(T, 300, "repaired"),
    finding(T, 310, healthy=True),
    *[heartbeat(T, s) for s in range(360, 1000, 60)],
]
# ... and one whose drain nobody reports: the repair follows drain_timeout_s after the drain.
DRAIN_TIMES_OUT: list[Finding | NodeEvent] = [
    finding(T, 0, fatal=True),
    *[heartbeat(T, s) for s in range(60, 1300, 60)],
    node_event(T, 1250, "repaired"),
    finding(T, 1260, healthy=True),
    *[heartbeat(T, s) for s in range(1300, 1800, 60)],
]
Made = tuple[str, str, str, int]  # (action id, proposal id, kind, ts)


def _run(signals: list[Finding | NodeEvent], lags: list[int]) -> list[Made]:
    """Feed `signals` to the health machine, its node states and proposals to the policy; the
    policy's i-th action comes back to the health machine after the next `lags[i]` signals (the
    last lag repeats). Returns the actions with the proposals they carry out, in order."""
    state: health.HealthState | None = None
    pool: policy.PolicyState | None = None
    acted: list[Made] = []
    late: list[tuple[int, Action]] = []  # (due after this many signals, action)
    fed = 0

    def apply(signal: Finding | NodeEvent | Action) -> None:
        nonlocal state, pool
        before = None if state is None else health.to_node_state(state)
        state, proposals = health.transition(state, signal, SETTINGS)
        after = health.to_node_state(state)
        changed = before is None or msgspec.structs.replace(before, ts=after.ts) != after
        for item in [after] if changed else []:
            pool, actions, _ = policy.decide(pool, item, POLICY)
            assert not actions
        for proposal in proposals:
            pool, actions, _ = policy.decide(pool, proposal, POLICY)
            for action in actions:
                acted.append((action.action_id, action.proposal_id, action.kind, action.ts))
                lag = lags[min(len(acted) - 1, len(lags) - 1)]
                late.append((fed + lag, action))

    for signal in signals:
        for due in [x for x in late if x[0] <= fed]:
            late.remove(due)
            apply(due[1])
        apply(signal)
        fed += 1
    for _, action in late:
        apply(action)
    return acted


def test_a_chain_of_late_actions_decides_as_live() -> None:
    live = _run(FAILS_AND_IS_REPAIRED, [0])
    assert [(kind, ts) for _, _, kind, ts in live] == [
        ("cordon", ms(0)), ("drain", ms(0)), ("reboot", ms(130)), ("uncordon", ms(660)),
    ]
    # each action comes back after the next two signals: the drain's after the "drained"
    # report, the reset's after the "repaired" one
    assert _run(FAILS_AND_IS_REPAIRED, [2]) == live


def test_a_drain_timeout_runs_from_the_late_drain() -> None:
    live = _run(DRAIN_TIMES_OUT, [0])
    assert [(kind, ts) for _, _, kind, ts in live] == [
        ("cordon", ms(0)), ("drain", ms(0)), ("reset_gpu", ms(600)), ("uncordon", ms(1600)),
    ]
    assert _run(DRAIN_TIMES_OUT, [15, 3, 8]) == live


@settings(max_examples=60, deadline=None)
@given(lags=st.lists(st.integers(0, 12), min_size=1, max_size=5))
def test_proposals_do_not_depend_on_how_late_our_actions_come_back(lags: list[int]) -> None:
    assert _run(FAILS_AND_IS_REPAIRED, lags) == _run(FAILS_AND_IS_REPAIRED, [0])
    assert _run(DRAIN_TIMES_OUT, lags) == _run(DRAIN_TIMES_OUT, [0])


def test_the_state_keeps_no_past_once_every_action_is_back() -> None:
    state: health.HealthState | None = None
    for signal in FAILS_AND_IS_REPAIRED[:2]:
        state, proposals = health.transition(state, signal, SETTINGS)
    assert state is not None and state.past is not None  # the cordon is in flight
    state, proposals = health.transition(state, action_for(proposals[-1] if proposals else
                                                           _outstanding(state)), SETTINGS)
    assert [p.kind for p in proposals] == ["drain"]
    state, _ = health.transition(state, action_for(proposals[0]), SETTINGS)
    assert state.past is None and state.state == "draining"


def _outstanding(state: health.HealthState) -> Proposal:
    assert state.outstanding is not None
    return msgspec.structs.replace(
        health_propose.make_proposal(state, state.outstanding.proposal_id, state.outstanding.kind),
        ts=state.outstanding.first_ts,
    )


def test_the_policy_dates_an_action_taken_at_once_by_its_proposal() -> None:
    # The pool's clock is ahead (other targets' node states of an hour later): the cordon it
    # takes at once for a proposal made at 0 is dated 0, where the health machine puts it.
    from tests.remediation_fixture import node_state, proposal

    pool, _, _ = policy.decide(None, node_state(target("n2"), 3600), PolicySettings())
    pool, actions, _ = policy.decide(pool, proposal(T, 0, fatal=True), PolicySettings())
    assert [(a.kind, a.ts) for a in actions] == [("cordon", ms(0))]


def test_a_node_event_far_ahead_of_the_findings_waits_for_them() -> None:
    # A backlog: the aligner lets the sparse events.node through after its grace, so the
    # "repaired" report comes before the findings of the hour before it; it is applied in
    # event-time order, as live.
    signals = list(FAILS_AND_IS_REPAIRED)
    repaired = signals.pop(8)
    early = [*signals[:2], repaired, *signals[2:]]
    assert _run(early, [0]) == _run(FAILS_AND_IS_REPAIRED, [0])
    assert _run(early, [3]) == _run(FAILS_AND_IS_REPAIRED, [0])


def test_a_persons_hold_far_ahead_of_the_findings_applies_at_once() -> None:
    # Ahead of the findings may mean the node's metrics stopped, not a backlog: a person's
    # cordon is applied at once (it can only stop us), without moving the target's clock.
    state, _ = health.transition(None, heartbeat(T, 0), SETTINGS)
    state, proposals = health.transition(state, node_event(T, 500, "cordoned"), SETTINGS)
    shown = health.to_node_state(state)
    assert (shown.state, shown.human_hold, shown.ts) == ("cordoned", True, ms(0))
    state, proposals = health.transition(state, finding(T, 60, fatal=True), SETTINGS)
    assert proposals == []  # the fault behind the person's hold is theirs to handle
    # an actuator's report that far ahead still waits for the findings before it
    state, _ = health.transition(state, node_event(T, 900, "repaired", "act-1"), SETTINGS)
    assert [e.kind for e in state.ahead] == ["repaired"]
