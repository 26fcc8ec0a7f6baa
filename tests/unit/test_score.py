"""The scorer: found / acted / withheld / missed, delay, precision and confounder cordons, on
hand-made cases and as invariants over generated ones."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.backtest.score import Held, HeldLog, score
from pipeline.model import Action, Entity, Finding, Proposal, Reason, Target

T0 = 1_764_424_800_000
MIN = 60_000


def _target(name: str) -> Target:
    return Target(cluster="c", kind="node", name=name, pool="p", zone="z")


@dataclass(frozen=True)
class F:
    fault_id: str
    fault_type: str
    klass: str
    target: Target
    onset_ms: int
    end_ms: int
    expected: str
    must_not_cordon: bool = False
    element: Target | None = None


def _action(name: str, ts: int, kind: str = "cordon", check: str = "x") -> Action:
    return Action(
        action_id=f"act-{name}-{ts}", ts=ts, kind=kind, target=_target(name),  # type: ignore[arg-type]
        reason=Reason(checks=[check], finding_ids=[], summary=""), dry_run=False, proposal_id="prp-00000000",
    )


def _finding(name: str, ts: int, healthy: bool = False, check: str = "gpu.temp.peer") -> Finding:
    return Finding(
        finding_id=f"fnd-{name}-{ts}", ts=ts, entity=Entity(kind="node", target=_target(name)),
        check=check, severity="warning", healthy=healthy, recommended_action="watch",
    )


def test_hard_fault_detected_with_its_delay_and_precision_one() -> None:
    faults = [F("f1", "G1", "hard", _target("n1"), T0, T0 + 60 * MIN, "cordon")]
    result = score(faults, [_action("n1", T0 + 5_000), _action("n1", T0 + 9_000, "drain")], [], 1.0)
    assert result.by_class["hard"].recall == 1.0
    assert result.by_class["hard"].delays_ms == [5_000]
    assert (result.episodes, result.true_episodes, result.precision) == (1, 1, 1.0)


def test_a_fabric_fault_is_named_only_by_a_finding_on_its_element() -> None:
    link = Target(cluster="c", kind="link", name="n1:mlx5_0:1", pool="p", zone="z")
    faults = [
        F("f1", "F1", "hard", _target("n1"), T0, T0 + 60 * MIN, "finding", element=link),
        F("f2", "F1", "hard", _target("n2"), T0, T0 + 60 * MIN, "finding",
          element=Target(cluster="c", kind="link", name="n2:mlx5_3:1", pool="p", zone="z")),
    ]
    on_link = Finding(
        finding_id="fnd-link", ts=T0 + 30_000, entity=Entity(kind="link", target=link),
        check="fabric.link.down", severity="critical", healthy=False,
        recommended_action="repair_link",
    )
    findings = [on_link, _finding("n1", T0 + 10_000), _finding("n2", T0 + 10_000)]
    part = score(faults, [], findings, 1.0).by_type["F1"]
    assert (part.found, part.element_faults, part.named) == (2, 2, 1)  # n2's port: unnamed


def test_action_before_onset_or_after_grace_does_not_count() -> None:
    faults = [F("f1", "G8", "gray", _target("n1"), T0, T0 + 10 * MIN, "cordon")]
    actions = [_action("n1", T0 - 1), _action("n1", T0 + 10 * MIN + 11 * MIN)]
    result = score(faults, actions, [], 2.0)
    assert result.by_class["gray"].recall == 0.0
    assert result.false_cordons == 1  # 21 minutes apart: one episode
    assert result.false_cordons_per_1k_node_days == 500.0


def test_confounder_cordon_is_counted_apart_and_uncordon_is_not_a_removal() -> None:
    faults = [F("j3", "J3", "confounder", _target("n2"), T0, T0 + MIN, "none", must_not_cordon=True)]
    result = score(faults, [_action("n2", T0 + 1_000), _action("n2", T0 + 2_000, "uncordon")], [], 1.0)
    assert (result.episodes, result.confounder_cordons, result.false_cordons) == (1, 1, 0)
    assert result.precision == 0.0


def test_finding_only_faults_need_an_unhealthy_non_heartbeat_finding() -> None:
    faults = [F("t3", "T3", "gray", _target("n3"), T0, T0 + MIN, "finding")]
    assert score(faults, [], [_finding("n3", T0 + 1, check="heartbeat", healthy=True)], 1).by_type["T3"].recall == 0.0
    assert score(faults, [], [_finding("n3", T0 + 1)], 1).by_type["T3"].recall == 1.0


def test_removals_close_together_are_one_episode() -> None:
    result = score([], [_action("n4", T0), _action("n4", T0 + MIN), _action("n4", T0 + 90 * MIN)], [], 1)
    assert result.episodes == 2


def test_maintenance_cordons_are_planned_work_not_scored() -> None:
    faults = [F("n3", "N3", "planned", _target("n5"), T0, T0 + MIN, "none", must_not_cordon=True)]
    result = score(faults, [_action("n5", T0 - MIN, check="maintenance")], [], 1)
    assert (result.episodes, result.confounder_cordons, result.false_cordons) == (0, 0, 0)


# --- found / acted / withheld / missed -------------------------------------------------------


def _held(name: str, first: int, last: int, rule: str = "budget", kind: str = "cordon") -> Held:
    return Held(f"prp-{name}-{first}", kind, _target(name), rule, first, last)


def test_a_removal_found_but_held_by_the_budget_is_withheld_with_its_rule() -> None:
    faults = [F("f1", "G8", "gray", _target("n1"), T0, T0 + 60 * MIN, "cordon")]
    result = score(faults, [], [_finding("n1", T0 + MIN)], 1.0,
                   held=[_held("n1", T0 + 2 * MIN, T0 + 30 * MIN, "zone_cap")])
    gray = result.by_class["gray"]
    assert (gray.found, gray.acted, gray.withheld, gray.missed, gray.found_not_acted) == (1, 0, 1, 0, 0)
    assert gray.withheld_rules == {"zone_cap": 1}
    assert gray.delays_ms == [MIN]
    assert result.episodes == 0  # withheld is not a removal: no episode, no false cordon


def test_an_acted_fault_is_not_also_withheld_and_transient_holds_do_not_count() -> None:
    faults = [F("f1", "G1", "hard", _target("n1"), T0, T0 + 60 * MIN, "cordon"),
              F("f2", "G1", "hard", _target("n2"), T0, T0 + 60 * MIN, "cordon")]
    held = [_held("n1", T0, T0 + MIN), _held("n2", T0, T0 + MIN, "busy")]
    result = score(faults, [_action("n1", T0 + 2 * MIN)], [_finding("n2", T0 + 5)], 1.0, held=held)
    hard = result.by_class["hard"]
    assert (hard.found, hard.acted, hard.withheld, hard.found_not_acted, hard.missed) == (2, 1, 0, 1, 0)
    assert hard.missed_action == 1


def test_a_hold_outside_the_fault_window_or_on_another_target_does_not_count() -> None:
    faults = [F("f1", "G1", "hard", _target("n1"), T0, T0 + 10 * MIN, "cordon")]
    held = [_held("n1", T0 - 5 * MIN, T0 - MIN), _held("n1", T0 + 21 * MIN, T0 + 22 * MIN),
            _held("n9", T0, T0 + MIN), _held("n1", T0, T0 + MIN, kind="uncordon")]
    hard = score(faults, [], [], 1.0, held=held).by_class["hard"]
    assert (hard.found, hard.withheld, hard.missed, hard.missed_action) == (0, 0, 1, 1)


def test_the_held_log_keeps_one_entry_per_proposal_with_its_span_and_latest_rule() -> None:
    log = HeldLog()
    proposal = Proposal(proposal_id="prp-1", ts=T0, kind="cordon", target=_target("n1"),
                        reason=Reason(checks=["x"], finding_ids=[], summary=""), fatal=False,
                        episode="ep-1", state="suspect")
    log.note([(proposal, T0, T0, "")])  # not gated yet
    assert log.held() == []
    log.note([(proposal, T0, T0 + MIN, "slow_start")])
    log.note([(proposal, T0, T0 + 3 * MIN, "budget")])
    assert log.held() == [Held("prp-1", "cordon", _target("n1"), "budget", T0, T0 + 3 * MIN)]


EXPECTED = st.sampled_from(["cordon", "repair_slice", "finding", "none"])
OFFSET = st.integers(min_value=-30, max_value=90).map(lambda m: T0 + m * MIN)
NAMES = st.sampled_from(["n1", "n2", "n3"])


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[F], list[Action], list[Finding], list[Held]]:
    faults = []
    for i in range(draw(st.integers(0, 6))):
        onset = draw(OFFSET)
        faults.append(F(f"f{i}", draw(st.sampled_from(["G1", "G8"])),
                        draw(st.sampled_from(["hard", "gray"])), _target(draw(NAMES)), onset,
                        onset + draw(st.integers(0, 60)) * MIN, draw(EXPECTED)))
    actions = [_action(draw(NAMES), draw(OFFSET), draw(st.sampled_from(["cordon", "uncordon"])))
               for _ in range(draw(st.integers(0, 4)))]
    findings = [_finding(draw(NAMES), draw(OFFSET)) for _ in range(draw(st.integers(0, 4)))]
    held = []
    for _ in range(draw(st.integers(0, 4))):
        first = draw(OFFSET)
        held.append(_held(draw(NAMES), first, first + draw(st.integers(0, 30)) * MIN,
                          draw(st.sampled_from(["budget", "common_cause", "busy"]))))
    return faults, actions, findings, held


@given(_cases())
@settings(max_examples=300, deadline=None)
def test_found_acted_withheld_and_missed_add_up(
    case: tuple[list[F], list[Action], list[Finding], list[Held]],
) -> None:
    faults, actions, findings, held = case
    result = score(faults, actions, findings, 1.0, held=held)
    scored = [f for f in faults if f.expected in ("cordon", "repair_slice", "finding")]
    for group in (result.by_class, result.by_type):
        parts = list(group.values())
        assert sum(p.faults for p in parts) == len(scored)
        for p in parts:
            assert p.found + p.missed == p.faults
            assert p.found >= p.acted + p.withheld
            assert p.acted + p.withheld + p.missed_action == p.action_faults
            assert p.missed_action >= p.found_not_acted
            assert sum(p.withheld_rules.values()) == p.withheld
            assert "busy" not in p.withheld_rules
            assert len(p.delays_ms) == p.found and all(d >= 0 for d in p.delays_ms)
    # holds change none of the removal arithmetic
    plain = score(faults, actions, findings, 1.0)
    assert (plain.episodes, plain.true_episodes, plain.false_cordons) == (
        result.episodes, result.true_episodes, result.false_cordons)
    for klass, p in result.by_class.items():
        assert plain.by_class[klass].acted == p.acted
        assert plain.by_class[klass].found <= p.found
