"""Silence judged by onset (pipeline/decide/causes.py): targets that fell silent together are
one cause whatever their pools and zones (the nodes behind one Prometheus server or scrape
job), so none of them is removed for silence; a target silent alone, or one with evidence of
its own, still is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.decide import guard
from pipeline.decide.causes import onset_names
from pipeline.decide.guard_state import ONSET_MS, SILENCE
from pipeline.model import NodeState, Proposal, Reason, Target, target_key

SETTINGS = load_settings(environ={})
T0 = 1_767_225_600_000
# 40 nodes over 4 pools and 5 zones: below, never 3 silent in one pool or zone, nor a fifth
# of the fleet
NODES = [
    Target(cluster="c", kind="node", name=f"n{i:02d}", pool=f"p{i % 4}", zone=f"z{i % 5}")
    for i in range(40)
]


def _state(target: Target, ts: int, checks: list[str]) -> NodeState:
    return NodeState(ts=ts, target=target, state="suspect" if checks else "healthy", since=ts,
                     open_checks=checks)


def _cordon(target: Target, ts: int, checks: list[str]) -> Proposal:
    return Proposal(
        proposal_id=f"prp-{target.name}", ts=ts, kind="cordon", target=target,
        reason=Reason(checks=checks, finding_ids=[], summary="x"), fatal=True, episode="ep",
        state="degraded",
    )


def _guard(silent: dict[int, int]) -> guard.GuardState:
    """Every node reports healthy; then node i falls silent at ms offset silent[i]."""
    state: guard.GuardState | None = None
    for target in NODES:
        state, _ = guard.observe(state, _state(target, T0, []), SETTINGS)
    assert state is not None
    for i, at in sorted(silent.items(), key=lambda kv: kv[1]):
        state, _ = guard.observe(state, _state(NODES[i], T0 + at, ["node.stale"]), SETTINGS)
    return state


def _admitted(state: guard.GuardState, i: int, checks: list[str]) -> bool:
    target = NODES[i]
    view = guard.view(state, SETTINGS, f"c/{target.pool}")
    ts = state.clock
    return view.admit(_cordon(target, ts, checks), already_out=False) is None


def test_nodes_of_several_pools_and_zones_silent_together_are_one_cause() -> None:
    # nodes 0, 5, 7 (pools 0, 1, 3; zones 0, 0, 2) within 20 s of each other
    state = _guard({0: 60_000, 5: 70_000, 7: 80_000})
    onset = [c for c in state.causes.values() if c.scope == "onset"]
    assert [c.check for c in onset] == [SILENCE]
    for i in (0, 5, 7):
        assert not _admitted(state, i, ["node.down", "node.stale"])
        # evidence of its own (another check) is still acted on
        assert _admitted(state, i, ["node.down", "xid.79"])


def test_one_outage_is_one_cause_and_one_alert() -> None:
    state: guard.GuardState | None = None
    for target in NODES:
        state, _ = guard.observe(state, _state(target, T0, []), SETTINGS)
    fired = []
    for i, at in enumerate([61_000, 65_000, 69_000, 72_000, 88_000, 89_000]):
        state, alerts = guard.observe(state, _state(NODES[i], T0 + at, ["node.stale"]), SETTINGS)
        fired += [a for a in alerts if a.status == "firing"]
    assert len({a.fingerprint for a in fired}) == 1 and fired[0].labels["scope"] == "onset"
    assert "fell silent together" in fired[0].annotations["summary"]


def test_silences_far_apart_are_each_a_nodes_own() -> None:
    state = _guard({0: 60_000, 5: 60_000 + 3 * ONSET_MS, 7: 60_000 + 6 * ONSET_MS})
    assert not state.causes
    assert _admitted(state, 7, ["node.down", "node.stale"])


def test_the_cause_ends_when_they_report_again() -> None:
    state = _guard({0: 60_000, 5: 70_000, 7: 80_000})
    for i in (0, 5, 7):
        state, _ = guard.observe(state, _state(NODES[i], T0 + 200_000, []), SETTINGS)
    assert not [c for c in state.causes.values() if c.scope == "onset"]


@given(st.lists(st.integers(0, 10 * ONSET_MS), min_size=2, max_size=2))
def test_two_marks_within_the_onset_share_a_window(ats: list[int]) -> None:
    state = _guard({0: T0 % ONSET_MS + ats[0], 1: T0 % ONSET_MS + ats[1]})
    marks = state.raised[SILENCE]
    first, second = (set(onset_names(marks[target_key(NODES[i])])) for i in (0, 1))
    if abs(ats[0] - ats[1]) <= ONSET_MS:
        assert first & second


def _not_ready(state: guard.GuardState, i: int, at: int) -> guard.GuardState:
    ns = _state(NODES[i], T0 + at, ["node.not_ready", "node.stale"])
    state, _ = guard.observe(state, ns, SETTINGS)
    return state


def test_kubernetes_not_ready_is_a_silent_nodes_own_evidence() -> None:
    state = _guard({0: 60_000, 5: 70_000, 7: 80_000})
    state = _not_ready(state, 5, 90_000)
    assert _admitted(state, 5, ["node.down", "node.stale"])
    assert not _admitted(state, 0, ["node.down", "node.stale"])


def test_not_ready_on_many_nodes_of_a_zone_is_a_common_cause_too() -> None:
    # a partition: zone z0's nodes (0, 5, 10, 15) silent and not Ready together
    state = _guard({0: 60_000, 5: 61_000, 10: 62_000, 15: 63_000})
    for i in (0, 5, 10, 15):
        state = _not_ready(state, i, 70_000)
    assert "node.not_ready|zone|z0" in state.causes
    assert not _admitted(state, 5, ["node.down", "node.stale"])
