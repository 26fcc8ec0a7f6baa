"""The guard's member counts per pool, zone and fleet are kept as members come and move (every
policy input asks for them): they must always equal a count from scratch, in both modes. Without
an inventory the caps' sizes follow the names seen freely in the warm-up, then grow at most
`inventory.growth_pct` an hour: a burst of ghost names never widens them at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.decide import guard, guard_state

BASE = load_settings(environ={})

# (where: inventory or seen, target, pool, zone): a few of each, so they collide and move
CHANGES = st.lists(
    st.tuples(st.booleans(), st.sampled_from("abcdef"), st.sampled_from(["c/p1", "c/p2"]),
              st.sampled_from(["z1", "z2", "z3"])),
    max_size=40,
)


def recount(state: guard.GuardState, inventory: bool) -> dict[tuple[str, str], int]:
    fresh = guard.GuardState(members=dict(state.members), seen=dict(state.seen))
    return guard.member_counts(fresh, inventory)


@given(CHANGES)
def test_kept_counts_equal_a_count_from_scratch(changes: list[tuple[bool, str, str, str]]) -> None:
    state = guard.GuardState()
    for inventory, target, pool, zone in changes:
        where = state.members if inventory else state.seen
        guard_state.set_member(state, where, f"c/node/{target}", pool, zone)
        for inventory in (False, True):
            assert guard.member_counts(state, inventory) == recount(state, inventory)


def test_a_seen_pool_counts_over_the_inventorys_unless_the_inventory_is_enforced() -> None:
    state = guard.GuardState()
    guard_state.set_member(state, state.members, "c/node/a", "c/p1", "z1")
    guard_state.set_member(state, state.seen, "c/node/a", "c/p2", "z1")
    assert guard.member_counts(state, inventory=False)[("pool", "c/p2")] == 1
    assert ("pool", "c/p1") not in guard.member_counts(state, inventory=False)
    assert guard.sizes(state, BASE) == {("pool", "c/p1"): 1, ("zone", "z1"): 1,
                                        ("fleet", "fleet"): 1}
