"""Health state machine: table-driven transitions, one scenario per row.

A scenario is a list of steps; each step applies one signal to one target and states the health
state expected after it and the kinds of the proposals it must emit (in order). "do" carries
out the latest proposal as a real action (what the policy publishes), "dry" answers it with a
dry-run action.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pipeline.config import HealthSettings
from pipeline.decide.health import HealthState, to_node_state, transition
from pipeline.ids import stable_id
from pipeline.model import Action, Proposal, Reason, Target, target_key
from tests.remediation_fixture import action_for, finding, heartbeat, ms, node_event, target

SETTINGS = HealthSettings(
    persist_s=60,
    probation_s=300,
    reproposal_s=120,
    dry_run_reproposal_s=1200,
    flap_window_s=600,
    flap_max=2,
    flap_persist_factor=3,
    flap_hold_s=300,
    drain_timeout_s=600,
    max_repairs=3,
)
Step = tuple[Any, ...]  # (op, at, *args, expected state, expected proposal kinds)


def _run(steps: list[Step], t: Target, settings: HealthSettings = SETTINGS) -> HealthState:
    state: HealthState | None = None
    last: Proposal | None = None
    for number, step in enumerate(steps):
        op, at, *args, want_state, want_kinds = step
        signal = _signal(op, at, args, t, last)
        state, proposals = transition(state, signal, settings)
        got = (state.state, [p.kind for p in proposals])
        assert got == (want_state, want_kinds), f"step {number} {step[:3]}: got {got}"
        last = proposals[-1] if proposals else last
    assert state is not None
    return state


def _signal(op: str, at: float, args: list[Any], t: Target, last: Proposal | None) -> Any:
    if op == "hb":
        return heartbeat(t, at)
    if op == "open":
        return finding(t, at, **(args[0] if args else {}))
    if op == "close":
        return finding(t, at, healthy=True, **(args[0] if args else {}))
    if op in ("do", "dry"):
        assert last is not None, "nothing proposed to carry out"
        return action_for(last, at, dry_run=op == "dry")
    return node_event(t, at, args[0])


FATAL = {"fatal": True}
SCENARIOS: dict[str, list[Step]] = {
    "a glitch shorter than persist_s never cordons": [
        ("hb", 0, "healthy", []),
        ("open", 10, "suspect", []),
        ("hb", 60, "suspect", []),
        ("close", 65, "healthy", []),
        ("hb", 400, "healthy", []),
    ],
    "a persisting condition is degraded after persist_s, re-proposed after reproposal_s": [
        ("open", 0, "suspect", []),
        ("hb", 59, "suspect", []),
        ("hb", 60, "degraded", ["cordon"]),
        ("hb", 120, "degraded", []),
        ("hb", 180, "degraded", ["cordon"]),
        ("close", 200, "healthy", []),
    ],
    "a fatal finding skips persistence": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
    ],
    "watch-only findings never cordon": [
        ("open", 0, {"action": "watch"}, "suspect", []),
        ("hb", 5000, "suspect", []),
    ],
    "cordon, drain, drained, repair, repaired, probation, uncordon": [
        ("open", 0, "suspect", []),
        ("hb", 60, "degraded", ["cordon"]),
        ("do", 61, "cordoned", ["drain"]),
        ("do", 62, "draining", []),
        ("event", 90, "drained", "draining", ["reset_gpu"]),
        ("do", 91, "repairing", []),
        ("hb", 150, "repairing", []),
        ("event", 200, "repaired", "probation", []),
        ("close", 210, "probation", []),
        ("hb", 509, "probation", []),
        ("hb", 510, "probation", ["uncordon"]),
        ("do", 511, "healthy", []),
    ],
    "a cordon-only recommendation cordons, waits for the close, then releases": [
        ("open", 0, {"action": "cordon"}, "suspect", []),
        ("hb", 60, "degraded", ["cordon"]),
        ("do", 61, "cordoned", []),
        ("hb", 400, "cordoned", []),
        ("close", 401, {"action": "cordon"}, "probation", []),
        ("hb", 701, "probation", ["uncordon"]),
        ("do", 702, "healthy", []),
    ],
    "a drain nobody reports stops at drain_timeout_s: no repair over running pods": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("hb", 601, "draining", []),
        ("hb", 602, "draining", []),
        ("hb", 5000, "draining", []),
    ],
    # working off a backlog, our actions come back long after the findings of their moment:
    # what they start runs from when the policy acted (their ts), as it does live
    # the same, when the repair is reported done before our reset comes back (a backlog):
    # the late action is recorded (the ladder counts it) but does not undo the report
    "a repair reported done before its action came back stays done": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["reset_gpu"]),
        ("event", 100, "repaired", "probation", []),
        ("do", 4, "probation", []),
        ("close", 110, "probation", []),
        ("open", 150, "probation", []),
        ("hb", 209, "probation", []),
        ("hb", 210, "cordoned", ["reboot"]),
    ],
    "a repair that does not stick escalates reset_gpu -> reboot -> replace": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["reset_gpu"]),
        ("do", 4, "repairing", []),
        ("event", 100, "repaired", "probation", []),
        ("close", 110, "probation", []),
        ("open", 150, "probation", []),
        ("hb", 209, "probation", []),
        ("hb", 210, "cordoned", ["reboot"]),
        ("do", 211, "repairing", []),
        ("event", 300, "repaired", "probation", []),
        ("open", 301, FATAL, "cordoned", ["replace"]),
    ],
    "a condition carried over a repair gets probation_s for its detector to clear it": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["reset_gpu"]),
        ("do", 4, "repairing", []),
        ("event", 100, "repaired", "probation", []),
        ("hb", 399, "probation", []),
        ("hb", 400, "cordoned", ["reboot"]),
    ],
    "a person's cordon is a hold: nothing proposed, never released by us": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("event", 5, "cordoned", "cordoned", []),
        ("hb", 1000, "cordoned", []),
        ("open", 1001, {"check": "xid_79", "fatal": True}, "cordoned", []),
        ("hb", 5000, "cordoned", []),
        ("event", 5001, "uncordoned", "probation", []),
        ("hb", 5400, "suspect", []),
    ],
    "a person's uncordon of our cordon ends the episode; only new evidence cordons again": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("event", 20, "uncordoned", "probation", []),
        ("open", 30, FATAL, "probation", []),
        ("hb", 400, "suspect", []),
        ("hb", 4000, "suspect", []),
        ("open", 4001, {"check": "nvlink_down", "fatal": True}, "degraded", ["cordon"]),
    ],
    "a waived condition that closes and comes back is new evidence": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("event", 20, "uncordoned", "probation", []),
        ("close", 40, "probation", []),
        ("open", 50, FATAL, "degraded", ["cordon"]),
    ],
    "a dry-run answer is not carried out and is not re-proposed every reproposal_s": [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("dry", 1, "degraded", []),
        ("hb", 200, "degraded", []),
        ("hb", 1000, "degraded", []),
        ("hb", 1201, "degraded", ["cordon"]),
    ],
    "a flapping target is held suspect and needs persist_s x factor": [
        ("open", 0, "suspect", []),
        ("close", 10, "healthy", []),
        ("open", 20, "suspect", []),
        ("close", 30, "healthy", []),
        ("open", 40, "suspect", []),
        ("close", 50, "suspect", []),
        ("hb", 100, "suspect", []),
        ("open", 110, "suspect", []),
        ("hb", 219, "suspect", []),
        ("hb", 220, "degraded", ["cordon"]),
    ],
    "a flapping target that goes quiet is healthy after flap_hold_s": [
        ("open", 0, "suspect", []),
        ("close", 10, "healthy", []),
        ("open", 20, "suspect", []),
        ("close", 30, "healthy", []),
        ("open", 40, "suspect", []),
        ("close", 50, "suspect", []),
        ("hb", 349, "suspect", []),
        ("hb", 350, "healthy", []),
    ],
    "a replaced node comes back schedulable: no uncordon proposed": [
        ("open", 0, {"fatal": True, "action": "replace"}, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["replace"]),
        ("do", 4, "repairing", []),
        ("event", 50, "deleted", "repairing", []),
        ("hb", 880, "repairing", []),  # heartbeats move the clock (events far ahead wait)
        ("event", 900, "created", "probation", []),
        ("close", 950, {"action": "replace"}, "probation", []),
        ("hb", 1250, "healthy", []),
    ],
    "a clear older than the latest evidence is stale": [
        ("open", 100, "suspect", []),
        ("close", 50, "suspect", []),
        ("hb", 160, "degraded", ["cordon"]),
    ],
}


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenario(steps: list[Step]) -> None:
    _run(steps, target())


def test_actions_that_come_back_late_start_their_timers_at_their_own_ts() -> None:
    # the drain timeout runs from the drain's ts (300), not from when it arrived (500); with
    # the opt-in, a drain nobody reports is followed by the repair at that timeout
    opted = msgspec.structs.replace(SETTINGS, repair_after_failed_drain=True)
    steps: list[Step] = [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("hb", 300, "degraded", ["cordon"]),  # re-sent: our cordon (ts 1) is on its way
        ("do", 1, "cordoned", ["drain"]),
        ("hb", 500, "cordoned", ["drain"]),
        ("do", 300, "draining", []),
        ("hb", 899, "draining", []),
        ("hb", 900, "draining", ["reset_gpu"]),
    ]
    _run(steps, target(), opted)


def test_slices_use_the_slice_ladder() -> None:
    steps: list[Step] = [
        (
            "open",
            0,
            {"fatal": True, "action": "repair_slice", "device": "chip-3"},
            "degraded",
            ["cordon"],
        ),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["repair_slice"]),
    ]
    _run(steps, target("slice-a", kind="slice"))


@pytest.mark.parametrize(
    ("recommended", "kind", "first"),
    [
        ("reset_gpu", "node", "reset_gpu"),
        ("reboot", "node", "reboot"),
        ("repair", "node", "reboot"),  # not on the node ladder: the rung of the same strength
        ("replace", "node", "replace"),
        ("reset_gpu", "slice", "repair_slice"),  # a slice cannot reset one GPU
        ("replace", "slice", "replace"),
    ],
)
def test_first_repair_follows_the_recommendation(recommended: str, kind: str, first: str) -> None:
    steps: list[Step] = [
        ("open", 0, {"fatal": True, "action": recommended}, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", [first]),
    ]
    _run(steps, target(kind=kind))


def test_after_max_repairs_the_target_is_left_cordoned_for_a_person() -> None:
    steps: list[Step] = [
        ("open", 0, FATAL, "degraded", ["cordon"]),
        ("do", 1, "cordoned", ["drain"]),
        ("do", 2, "draining", []),
        ("event", 3, "drained", "draining", ["reset_gpu"]),
        ("do", 4, "repairing", []),
        ("event", 100, "repaired", "probation", []),
        ("open", 101, {"check": "xid_79", "fatal": True}, "cordoned", []),
        ("hb", 10_000, "cordoned", []),
    ]
    state = _run(steps, target(), msgspec.structs.replace(SETTINGS, max_repairs=1))
    assert to_node_state(state).repairs == 1 and state.cordoned_by_us


def test_the_actuator_echo_of_our_cordon_is_not_a_human_hold() -> None:
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True), SETTINGS)
    action = action_for(proposals[0], 1)
    state, _ = transition(state, action, SETTINGS)
    for echo in (node_event(t, 2, "cordoned"), node_event(t, 2, "cordoned", action.action_id)):
        after, _ = transition(state, echo, SETTINGS)
        assert after.cordoned_by_us and not after.human_hold


def test_an_actuator_held_report_is_a_human_hold_and_reports_change_nothing() -> None:
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True), SETTINGS)
    cordon = action_for(proposals[0], 1)
    state, _ = transition(state, cordon, SETTINGS)
    for kind in ("repair_requested", "ready", "not_ready"):
        after, out = transition(state, node_event(t, 2, kind, cordon.action_id), SETTINGS)
        assert (after.state, after.human_hold, after.cordoned_by_us) == (
            state.state, False, True), kind
    held, out = transition(state, node_event(t, 2, "held", cordon.action_id), SETTINGS)
    assert held.human_hold and out == []


def test_after_our_release_an_open_condition_is_judged_afresh() -> None:
    t = target()
    maintenance = Reason(checks=["maintenance"], finding_ids=[], summary="maintenance")
    cordon = Action(
        action_id="act-maint-cordon",
        ts=ms(0),
        kind="cordon",
        target=t,
        reason=maintenance,
        dry_run=False,
        proposal_id="prp-maint-cordon",
    )
    state, _ = transition(None, cordon, SETTINGS)
    state, proposals = transition(state, finding(t, 10), SETTINGS)
    state, proposals = transition(state, heartbeat(t, 500), SETTINGS)
    assert (state.state, state.maintenance, proposals) == ("cordoned", True, [])
    release = msgspec.structs.replace(
        cordon,
        action_id="act-maint-release",
        kind="uncordon",
        ts=ms(600),
        proposal_id="prp-maint-release",
    )
    state, proposals = transition(state, release, SETTINGS)
    assert (state.state, proposals) == ("suspect", [])  # persistence counts from the release
    state, proposals = transition(state, heartbeat(t, 660), SETTINGS)
    assert [p.kind for p in proposals] == ["cordon"]
    assert state.episode == stable_id("ep", target_key(t), ms(600))


def test_a_replayed_action_changes_nothing() -> None:
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True), SETTINGS)
    cordon = action_for(proposals[0], 1)
    state, proposals = transition(state, cordon, SETTINGS)
    state, _ = transition(state, action_for(proposals[0], 2), SETTINGS)
    replayed, again = transition(state, cordon, SETTINGS)
    assert (replayed.state, replayed.last_action, again) == ("draining", state.last_action, [])


def test_ids_are_derived_from_target_episode_kind_and_round() -> None:
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True), SETTINGS)
    episode = stable_id("ep", target_key(t), ms(0))
    assert state.episode == proposals[0].episode == episode
    assert proposals[0].proposal_id == stable_id("prp", episode, "cordon", 1)
    state, again = transition(state, heartbeat(t, 200), SETTINGS)
    assert [p.proposal_id for p in again] == [proposals[0].proposal_id]
    state, drain = transition(state, action_for(proposals[0], 201), SETTINGS)
    assert drain[0].proposal_id == stable_id("prp", episode, "drain", 2)


def test_the_proposal_explains_itself() -> None:
    t = target()
    fnd = finding(t, 0, fatal=True)
    _, proposals = transition(None, fnd, SETTINGS)
    reason = proposals[0].reason
    assert reason.checks == ["ecc_dbe"] and reason.finding_ids == [fnd.finding_id]
    assert "ecc_dbe@0" in reason.summary and "fatal" in reason.summary
    assert proposals[0].fatal and proposals[0].state == "degraded"


def test_node_state_reports_what_the_policy_needs() -> None:
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True), SETTINGS)
    action = action_for(proposals[0], 1)
    state, _ = transition(state, action, SETTINGS)
    ns = to_node_state(state)
    assert (ns.state, ns.cordoned_by_us, ns.human_hold) == ("cordoned", True, False)
    assert ns.last_action == f"cordon:{action.action_id}" and ns.open_checks == ["ecc_dbe"]
    assert ns.episode == state.episode and ns.since == ms(1) and ns.ts == ms(1)


def test_the_state_passed_in_is_the_state_returned() -> None:
    # one rule for every stage (pipeline/stages/topology.py): stages change the state they
    # are given, the driver keeps the snapshot; the old state is not a copy to compare with
    t = target()
    state, _ = transition(None, finding(t, 0), SETTINGS)
    after, _ = transition(state, finding(t, 100, check="xid_79", fatal=True), SETTINGS)
    assert after is state and after.clock == ms(100)


def test_a_signal_for_another_target_is_refused() -> None:
    state, _ = transition(None, heartbeat(target("n1"), 0), SETTINGS)
    with pytest.raises(ValueError, match="n2"):
        transition(state, heartbeat(target("n2"), 1), SETTINGS)


def test_conditions_are_bounded() -> None:
    t = target()
    state: HealthState | None = None
    for gpu in range(300):
        state, _ = transition(state, finding(t, gpu, device=str(gpu), action="watch"), SETTINGS)
    assert state is not None and len(state.conditions) <= 257


def test_a_gpu_reset_names_the_gpus_its_conditions_are_on() -> None:
    # the actuator must know which GPU to reset without parsing the summary text
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True, device="3"), SETTINGS)
    state, _ = transition(state, finding(t, 0.5, "row_remap", fatal=True, device="10"), SETTINGS)
    assert [(p.kind, p.device) for p in proposals] == [("cordon", None)]
    state, proposals = transition(state, action_for(proposals[-1], 1), SETTINGS)  # cordon
    state, proposals = transition(state, action_for(proposals[-1], 2), SETTINGS)  # drain
    state, proposals = transition(state, node_event(t, 3, "drained"), SETTINGS)
    assert [(p.kind, p.device) for p in proposals] == [("reset_gpu", "3,10")]


def test_a_gpu_reset_for_mig_instances_names_their_gpu_once() -> None:
    # nvidia-smi resets whole GPUs: faults on GPU instances 1 and 2 of GPU 3 reset GPU 3
    t = target()
    state, proposals = transition(None, finding(t, 0, fatal=True, device="3/mig1"), SETTINGS)
    state, _ = transition(
        state, finding(t, 0.5, "row_remap", fatal=True, device="3/mig2"), SETTINGS
    )
    state, proposals = transition(state, action_for(proposals[-1], 1), SETTINGS)  # cordon
    state, proposals = transition(state, action_for(proposals[-1], 2), SETTINGS)  # drain
    state, proposals = transition(state, node_event(t, 3, "drained"), SETTINGS)
    assert [(p.kind, p.device) for p in proposals] == [("reset_gpu", "3")]


# --- a drain or cordon the actuator did not carry out (issue 33, item 6) -------------------


def _to_draining(settings: HealthSettings = SETTINGS) -> tuple[HealthState, Proposal]:
    t = target()
    state, (cordon,) = transition(None, finding(t, 0, fatal=True), settings)
    state, (drain,) = transition(state, action_for(cordon, 1), settings)
    state, _ = transition(state, action_for(drain, 2), settings)
    assert state.state == "draining"
    return state, drain


@pytest.mark.parametrize("outcome", ["blocked", "skipped", "refused"])
def test_a_drain_not_carried_out_is_never_followed_by_a_repair(outcome: str) -> None:
    state, drain = _to_draining()
    echo = node_event(target(), 40, outcome, action_id=action_for(drain).action_id)
    state, proposals = transition(state, echo, SETTINGS)
    assert proposals == [] and state.drain_failed
    for at in (700, 5000, 20_000):  # past drain_timeout_s and reproposal_s
        state, proposals = transition(state, heartbeat(target(), at), SETTINGS)
        assert proposals == [], f"{outcome}: proposed {[p.kind for p in proposals]} at {at}"
    # the drain finishing after all (a person deleted the pods) lets the ladder go on
    echo = node_event(target(), 20_001, "drained", action_id=action_for(drain).action_id)
    state, proposals = transition(state, echo, SETTINGS)
    assert [p.kind for p in proposals] == ["reset_gpu"]


def test_the_opt_in_repairs_after_a_failed_drain() -> None:
    opted = msgspec.structs.replace(SETTINGS, repair_after_failed_drain=True)
    state, drain = _to_draining(opted)
    echo = node_event(target(), 40, "blocked", action_id=action_for(drain).action_id)
    state, proposals = transition(state, echo, opted)
    assert [p.kind for p in proposals] == ["reset_gpu"]


def test_an_echo_of_an_older_action_changes_nothing() -> None:
    state, _ = _to_draining()
    state, proposals = transition(state, node_event(target(), 40, "skipped", "act-old"), SETTINGS)
    assert not state.drain_failed and state.state == "draining" and proposals == []


def test_a_cordon_that_never_landed_leaves_the_node_in_service_and_asks_again() -> None:
    t = target()
    state, (cordon,) = transition(None, finding(t, 0, fatal=True), SETTINGS)
    state, (_drain,) = transition(state, action_for(cordon, 1), SETTINGS)
    echo = node_event(t, 30, "skipped", action_id=action_for(cordon).action_id)
    state, proposals = transition(state, echo, SETTINGS)
    assert not state.cordoned_by_us and state.state == "degraded"
    assert [p.kind for p in proposals] == ["cordon"]  # never a drain of an uncordoned node
