"""bench/scaling.py's own rules: when a group owns every partition, and which events are the
measured input and which the probes."""

from __future__ import annotations

import pytest

from bench import scaling
from pipeline.config import SimSettings
from pipeline.sim.engine import Simulation


@pytest.mark.parametrize(
    ("owned", "covered"),
    [
        ([set(range(12))], True),
        ([set(range(6)), set(range(6, 12))], True),
        ([{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}], True),
        ([set(range(12)), set()], False),  # the new worker has nothing yet
        ([set(range(12)), set(range(6, 12))], False),  # the first one's line is stale
        ([set(range(6)), set(range(7, 12))], False),  # partition 6 owned by no one
        ([], False),
    ],
)
def test_a_group_covers_the_partitions_only_once_each(owned: list[set[int]],
                                                       covered: bool) -> None:
    assert scaling.covers(owned) is covered


def test_the_probes_are_the_ticks_after_the_measured_input() -> None:
    sim = Simulation(SimSettings(duration_s=60, random_faults=False))
    events = list(sim.events())
    main, probes = scaling.split(events, sim.start_ms, 30)
    assert len(main) + sum(map(len, probes)) == len(events)
    assert all(getattr(e, "ts", 0) < sim.start_ms + 30_000 for e in main)
    stamps = [{getattr(e, "ts", 0) for e in probe} for probe in probes]
    assert all(len(s) == 1 for s in stamps)  # one tick each, in time order
    assert [min(s) for s in stamps] == sorted(min(s) for s in stamps)
    assert len(probes) == 3  # 30 s of 10 s ticks
