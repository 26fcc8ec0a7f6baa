"""Why a node was not removed is data: the policy's withheld/1 records (issue 35, item 4).

One record when a proposal is first held back, one when the rule holding it changes, one when
it is dropped; none while the same rule keeps holding it, however many signals pass. Ids come
from (proposal, reason), so a replay re-emits the same records."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from pipeline.config import PolicySettings, Settings
from pipeline.decide.policy import PolicyState, decide_all
from pipeline.ids import stable_id
from pipeline.model import Action, CapacityEvent, Inventory, NodeState, Proposal, WithheldRecord
from pipeline.stages import keys
from pipeline.stages import policy as policy_stage
from tests.remediation_fixture import capacity, ms, node_state, proposal, target

BASE = PolicySettings(
    max_unavailable_pct=10.0,
    max_unavailable=10,
    burst_cordons=100,  # slow start and rate limits off unless a test turns them on
    max_actions_per_hour=1000,
)
Signal = Proposal | NodeState | CapacityEvent


def run(
    state: PolicyState | None, signals: Iterable[Signal], settings: PolicySettings = BASE
) -> tuple[PolicyState, list[Action], list[WithheldRecord]]:
    actions: list[Action] = []
    records: list[WithheldRecord] = []
    for signal in signals:
        state, new_actions, _, withheld = decide_all(state, signal, settings)
        actions += new_actions
        records += withheld
    assert state is not None
    return state, actions, records


def pool(size: int, settings: PolicySettings = BASE) -> PolicyState:
    return run(None, [node_state(target(f"n{i}"), 0) for i in range(size)], settings)[0]


def said(records: list[WithheldRecord]) -> list[tuple[str, str]]:
    return [(r.target.name, r.reason) for r in records]


def test_a_proposal_held_for_the_budget_is_one_record_with_its_numbers() -> None:
    state = pool(20)  # budget 2
    state, actions, records = run(state, [proposal(target(f"n{i}"), 10 + i) for i in range(4)])
    assert [a.target.name for a in actions] == ["n0", "n1"]
    assert said(records) == [("n2", "budget"), ("n3", "budget")]
    first = records[0]
    assert first.detail == "pool p1: 2 of 2 out (budget 2 of 20 nodes)", first.detail
    assert (first.kind, first.checks, first.fatal) == ("cordon", ["ecc_dbe"], False)
    assert first.ts == ms(12)  # the pool's clock: when n2's proposal was held
    assert first.withheld_id == stable_id("whd", first.proposal_id, "budget")
    # the health machine re-sends, other nodes report: the same rule holds, nothing new is said
    again = [proposal(target("n2"), 20), node_state(target("n9"), 21), proposal(target("n3"), 22)]
    state, _, records = run(state, again)
    assert records == []


def test_a_rule_that_changes_is_said_again_and_a_drop_says_why() -> None:
    state = pool(10)  # budget 1
    state, _, records = run(state, [proposal(target("n1"), 1), proposal(target("n2"), 2)])
    assert said(records) == [("n2", "budget")]
    state, _, records = run(state, [capacity(3, "STOCKOUT")])  # n2 still held for the budget
    assert records == []
    # a person takes n2 out of our hands: the held cordon is dropped, with the reason
    state, actions, records = run(state, [node_state(target("n2"), 4, "cordoned", human=True)])
    assert actions == [] and said(records) == [("n2", "dropped: human_hold")]
    assert "never fights a person" in records[0].detail
    assert not state.withheld


def test_a_refusal_at_first_sight_is_a_record_too() -> None:
    state = pool(10)
    held = node_state(target("n4"), 1, "cordoned", human=True)
    state, actions, records = run(state, [held, proposal(target("n4"), 2, episode="ep-x")])
    assert actions == [] and said(records) == [("n4", "dropped: human_hold")]
    state, actions, records = run(state, [proposal(target("n5"), 3, "drain")])
    assert actions == [] and said(records) == [("n5", "awaiting_cordon")]
    assert records[0].kind == "drain" and "waits for our cordon of n5" in records[0].detail


def test_episode_over_and_expiry_drop_held_proposals_with_a_record() -> None:
    settings = msgspec.structs.replace(BASE, pending_ttl_s=600)
    state = pool(10, settings)
    signals = [proposal(target(f"n{i}"), i) for i in (1, 2, 3)]
    state, _, records = run(state, signals, settings)
    assert said(records) == [("n2", "budget"), ("n3", "budget")]
    state, _, records = run(state, [node_state(target("n2"), 10)], settings)  # n2 recovered
    assert said(records) == [("n2", "dropped: episode_over")]
    state, _, records = run(state, [node_state(target("n9"), 700)], settings)  # n3 not re-sent
    assert said(records) == [("n3", "dropped: expired")]
    assert records[0].ts == ms(700)  # the pool's clock when it was given up


def test_a_replay_says_the_same_records_with_the_same_ids() -> None:
    signals = [proposal(target(f"n{i}"), 10 + i) for i in range(5)]
    signals += [node_state(target("n3"), 30), capacity(31, "STOCKOUT")]
    first = run(pool(20), signals)[2]
    second = run(pool(20), signals)[2]
    assert first == second and len(first) == 4
    assert len({r.withheld_id for r in first}) == len(first)


def test_maintenance_held_for_its_allowance_is_said_once_while_it_is_asked_every_signal() -> None:
    settings = msgspec.structs.replace(BASE, maintenance_lead_s=1800)
    state = pool(10, settings)  # maintenance allowance: max(1, 10 % of 10) = 1
    notices = [
        capacity(0, "MAINTENANCE_SCHEDULED", t=target(name), window=(1000, 5000),
                 event_id=f"cap-mnt-{name}")
        for name in ("n3", "n4")
    ]
    ticks = [node_state(target("n9"), at) for at in (100, 200, 300)]
    state, actions, records = run(state, [*notices, *ticks], settings)
    assert [(a.kind, a.target.name) for a in actions] == [("cordon", "n3")]
    assert said(records) == [("n4", "maintenance_budget")]
    assert records[0].checks == ["maintenance"]
    assert records[0].detail == "pool p1: 1 of 1 out for maintenance (10% of 10 nodes)"


def test_the_guard_s_reasons_come_through_the_policy_stage() -> None:
    """policy_stage.on_policy (both runtimes' policy stage) returns the records; an enforced inventory
    that does not list the node holds its cordon back as not_in_inventory."""
    settings = Settings()
    t1, t2 = target("n1"), target("n2")
    member = Inventory(ts=ms(0), cluster=t1.cluster, kind="node", name="n1", pool="p1",
                       zone="z1", accelerator="H100", capacity=8)
    _, fleet, *_ = policy_stage.on_policy(None, None, member, settings, keys.GUARD_KEY)
    key = keys.policy_key(proposal(t2, 1))
    state: PolicyState | None = None
    records: list[WithheldRecord] = []
    for signal in (node_state(t1, 1), node_state(t2, 1), proposal(t2, 2)):
        state, fleet, _, _, withheld = policy_stage.on_policy(state, fleet, signal, settings, key)
        records += withheld
    assert said(records) == [("n2", "not_in_inventory")]
    assert records[0].detail == "node n2 is not in the inventory, which is enforced"
