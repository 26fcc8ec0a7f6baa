"""A property of the actuator's removal cap (pipeline/kube/defences.py): whatever sequence of
actions arrives (any kinds, targets, pools, zones, in any order and at any pace), no window
of `removal_window_s` ever holds more new removals than the caps allow, for the cluster, a
pool or a zone; and a target already counted costs nothing again within its window."""

from __future__ import annotations

import time
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import KubernetesSettings
from pipeline.kube.defences import RemovalCap
from pipeline.model import Action, Reason, Target

CAPS = KubernetesSettings(removal_window_s=60.0, max_removals=5, max_removals_per_pool=3,
                          max_removals_per_zone=4)  # fmt: skip
T0 = 1_800_000_000_000


def _action(name: str, pool: str, zone: str, kind: str) -> Action:
    return Action(action_id=f"act-{uuid.uuid4().hex[:16]}", ts=int(time.time() * 1000),
                  kind=kind,  # type: ignore[arg-type]
                  target=Target(cluster="c", kind="node", name=name, pool=pool, zone=zone),
                  reason=Reason(checks=[], finding_ids=[], summary="forged"), dry_run=False,
                  proposal_id="prp-0", expires_at=T0)  # fmt: skip


arrivals = st.lists(st.tuples(
    st.integers(0, 40),  # target
    st.integers(0, 2),  # pool
    st.integers(0, 2),  # zone
    st.sampled_from(["cordon", "drain", "reboot", "replace"]),
    st.integers(0, 30_000),  # ms since the previous one
), max_size=120)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(arrivals)
def test_no_window_holds_more_removals_than_the_caps(
    seq: list[tuple[int, int, int, str, int]],
) -> None:
    cap, now = RemovalCap(CAPS), T0
    window = int(CAPS.removal_window_s * 1000)
    new: list[tuple[int, str, str, str]] = []  # (ms, target, pool, zone) of each new removal
    for target, pool, zone, kind, gap in seq:
        now += gap
        act = _action(f"n{target}", f"p{pool}", f"z{zone}", kind)
        counted = any(n == act.target.name and t >= now - window for t, n, _, _ in new)
        if cap.take(act, now) is None and not counted:
            new.append((now, act.target.name, act.target.pool, act.target.zone))
    for at, *_ in new:
        inside = [(p, z) for t, _, p, z in new if at - window <= t <= at]
        assert len(inside) <= CAPS.max_removals
        for limit, scope in ((CAPS.max_removals_per_pool, 0), (CAPS.max_removals_per_zone, 1)):
            counts: dict[str, int] = {}
            for where in inside:
                counts[where[scope]] = counts.get(where[scope], 0) + 1
            assert max(counts.values()) <= limit, counts
    assert len({n for _, n, _, _ in new}) <= len(new)  # each new removal is a target


def test_a_counted_target_costs_nothing_again_in_its_window() -> None:
    cap = RemovalCap(CAPS)
    first = [_action(f"n{i}", "p0", "z0", "cordon") for i in range(CAPS.max_removals_per_pool)]
    assert all(cap.take(a, T0) is None for a in first)
    assert cap.take(_action("n9", "p0", "z0", "cordon"), T0) is not None  # the pool is full
    assert cap.take(_action("n0", "p0", "z0", "drain"), T0 + 1) is None  # n0 is out already
    later = T0 + int(CAPS.removal_window_s * 1000) + 1
    assert cap.take(_action("n9", "p0", "z0", "cordon"), later) is None  # a new window
