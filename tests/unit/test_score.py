"""The scorer: recall, delay, precision and confounder cordons, on hand-made cases."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.model import Action, Entity, Finding, Reason, Target
from pipeline.score import score

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
