"""Time back in service from node states (pipeline/capacity/repair.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.capacity.repair import (
    Outage,
    RepairState,
    on_node_state,
    overdue,
    percentile,
    stats,
)
from pipeline.model import NodeState, Target

T0 = 1_767_225_600_000
MIN = 60_000


def record(name: str, state: str, minute: float, last_action: str | None = None) -> NodeState:
    target = Target(cluster="c1", kind="node", name=name, pool="a3", zone="us-central1-a")
    ts = T0 + int(minute * MIN)
    return NodeState(
        ts=ts, target=target, state=state, since=ts, last_action=last_action  # type: ignore[arg-type]
    )


def run(
    state: RepairState, name: str, steps: Sequence[tuple[str, float, str | None]]
) -> list[Outage]:
    done = []
    for name_state, minute, action in steps:
        finished = on_node_state(state, record(name, name_state, minute, action), "nvidia-h100-80gb")
        if finished is not None:
            done.append(finished)
    return done


REPAIR = [
    ("suspect", 0, None),
    ("degraded", 1, None),
    ("cordoned", 2, "cordon"),
    ("draining", 3, "drain"),
    ("repairing", 10, "repair"),
    ("probation", 40, "uncordon"),
    ("healthy", 70, None),
]


def test_each_stage_is_stamped_once_and_back_means_back_in_service() -> None:
    state = RepairState()
    (outage,) = run(state, "n1", REPAIR)
    assert outage.stamps == {
        "found": T0,
        "cordoned": T0 + 2 * MIN,
        "drained": T0 + 10 * MIN,
        "requested": T0 + 10 * MIN,
        "back": T0 + 40 * MIN,  # probation: uncordoned and serving, not the later healthy
    }
    assert state.open == {}


def test_a_trouble_that_never_took_it_out_of_service_is_no_outage() -> None:
    state = RepairState()
    assert run(state, "n1", [("suspect", 0, None), ("healthy", 5, None)]) == []
    assert state.open == {} and state.done == []


def test_percentiles_per_stage_and_end_to_end() -> None:
    state = RepairState()
    done = []
    for i, repair_minutes in enumerate((30, 60, 90, 120)):
        steps = [("cordoned", 0, "cordon"), ("repairing", 5, "repair"),
                 ("probation", 5 + repair_minutes, None)]  # fmt: skip
        done += run(state, f"n{i}", steps)
    by_segment = {s.segment: s for s in stats(done)}
    assert by_segment["to_back"].count == 4
    assert by_segment["to_back"].p50_s == 75 * 60
    assert by_segment["to_back"].p95_s == (90 + 0.85 * 30) * 60
    assert by_segment["end_to_end"].p50_s == 80 * 60
    assert by_segment["to_cordon"].p95_s == 0.0


def test_out_of_service_past_the_setting_is_overdue() -> None:
    state = RepairState()
    run(state, "n1", REPAIR[:5])  # cordoned at minute 2, repairing since 10
    run(state, "n2", [("cordoned", 50, "cordon")])
    late = overdue(state, T0 + 63 * MIN, 3600)
    assert [o.target for o in late] == ["c1/n1"]


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 50))
