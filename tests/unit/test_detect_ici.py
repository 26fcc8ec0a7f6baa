"""ICI localisation from both ends of a link: cable, chip, host, OCS pattern, degradation.

The slice is a 2x2x2 cube: chip = x + 2y + 4z, dimension d joins chips differing in bit d,
port 2d points to the lower coordinate and 2d + 1 to the higher; host h0 holds chips 0-3
(z = 0) and h1 chips 4-7, so dimension 2 links cross hosts.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from pipeline.catalog.tpu import chip_id_at, host_of_chip, ici_neighbours, slice_shape
from pipeline.detect import IciSliceState, detect_ici
from pipeline.model import Finding, IciSample
from tests.detect_fixture import SETTINGS, STEP_MS, T0, checks, ici_sample, unhealthy

Health = Callable[[int, int, int], int]  # (chip, peer, step) -> health


def healthy(chip: int, peer: int, step: int) -> int:
    return 0


def links_of(host: int, health: Health, step: int) -> list[tuple[int, int, int, int]]:
    out = []
    for chip in range(host * 4, host * 4 + 4):
        for dim in range(3):
            peer = chip ^ (1 << dim)
            port = 2 * dim + (0 if chip & (1 << dim) else 1)
            out.append((chip, port, peer, health(chip, peer, step)))
    return out


def run(
    steps: int,
    health: Health = healthy,
    hosts: tuple[int, ...] = (0, 1),
    dead_from: dict[int, int] | None = None,
    state: IciSliceState | None = None,
    start: int = 0,
) -> tuple[IciSliceState, list[Finding]]:
    found: list[Finding] = []
    for step in range(start, start + steps):
        for host in hosts:
            if dead_from and step >= dead_from.get(host, 10**9):
                continue
            sample = ici_sample(step, f"h{host}", links_of(host, health, step))
            state, out = detect_ici(state, sample, SETTINGS)
            found += out
    assert state is not None
    return state, found


def cut(pairs: set[frozenset[int]], from_step: int, value: int = 10) -> Health:
    return lambda c, p, s: value if s >= from_step and frozenset((c, p)) in pairs else 0


def test_healthy_links_say_nothing() -> None:
    assert run(30)[1] == []


def test_cable_down_at_both_ends_is_a_link_fault_on_the_slice() -> None:
    _, found = run(20, cut({frozenset((0, 4))}, 10))
    (finding,) = unhealthy(found)
    assert (finding.check, finding.entity.kind, finding.entity.device) == (
        "ici.link.down",
        "ici_link",
        "0:5",
    )
    assert finding.entity.target.kind == "slice" and finding.recommended_action == "repair_slice"
    assert finding.ts == T0 + 11 * STEP_MS  # confirmed at the next round


def test_cable_back_up_clears() -> None:
    health = lambda c, p, s: 10 if 10 <= s < 20 and frozenset((c, p)) == {0, 4} else 0  # noqa: E731
    _, found = run(40, health)
    assert checks(found) == [("ici.link.down", "0:5", False), ("ici.link.down", "0:5", True)]


def test_one_end_down_the_other_healthy_waits_longer() -> None:
    one_sided = lambda c, p, s: 10 if s >= 10 and (c, p) == (0, 4) else 0  # noqa: E731
    _, found = run(30, one_sided)
    (finding,) = unhealthy(found)
    assert finding.check == "ici.link.down"
    assert finding.ts - (T0 + 10 * STEP_MS) >= SETTINGS.ici_one_sided_s * 1000


def test_every_link_of_one_chip_down_is_the_chip() -> None:
    chip1 = {frozenset((1, 0)), frozenset((1, 3)), frozenset((1, 5))}
    _, found = run(20, cut(chip1, 10))
    assert [(f.check, f.entity.kind, f.entity.device) for f in unhealthy(found)] == [
        ("ici.chip.down", "tpu_chip", "1")
    ]


def test_dead_host_seen_from_its_neighbours() -> None:
    into_h1 = {frozenset((c, c + 4)) for c in range(4)}
    _, found = run(20, cut(into_h1, 10), dead_from={1: 10})
    assert [(f.check, f.entity.kind, f.entity.device) for f in unhealthy(found)] == [
        ("ici.host.down", "node", "h1")
    ]


# A v5p-256 slice (128 chips), 4x4x8: two 4x4x4 cubes along z, joined (and wrapped around) by optical
# circuit switches; every link inside a cube is copper.
V5P_256 = slice_shape("v5p-256", "4x4x8")


def run_v5p(steps: int, health: Health) -> list[Finding]:
    hosts: dict[int, list[tuple[int, int, int]]] = {}
    for chip in range(V5P_256.chips):
        for port, peer in ici_neighbours(V5P_256, chip):
            hosts.setdefault(host_of_chip(V5P_256, chip), []).append((chip, port, peer))
    state: IciSliceState | None = None
    found: list[Finding] = []
    for step in range(steps):
        for host, links in sorted(hosts.items()):
            sample = ici_sample(
                step, f"h{host}", [(c, p, q, health(c, q, step)) for c, p, q in links]
            )
            state, out = detect_ici(state, sample, SETTINGS)
            found += out
    return found


def z_links(z_from: int) -> set[frozenset[int]]:
    """The 16 links from z = z_from to the next z (wrapping around), one per (x, y)."""
    at = lambda x, y, z: chip_id_at(V5P_256, (x, y, z % 8))  # noqa: E731
    return {frozenset((at(x, y, z_from), at(x, y, z_from + 1))) for x in range(4) for y in range(4)}


def test_the_links_between_cubes_down_at_once_are_an_ocs_watch_not_a_repair() -> None:
    found = run_v5p(20, cut(z_links(7), 10))  # the wraparound: through an OCS
    assert [(f.check, f.recommended_action, f.entity.kind) for f in unhealthy(found)] == [
        ("ici.ocs.degraded", "watch", "slice")
    ]


def test_a_copper_link_inside_a_cube_down_while_an_ocs_is_out_is_a_cable_of_its_own() -> None:
    inside = frozenset((chip_id_at(V5P_256, (1, 2, 5)), chip_id_at(V5P_256, (1, 2, 6))))
    found = run_v5p(20, cut(z_links(7) | {inside}, 10))
    assert sorted((f.check, f.recommended_action) for f in unhealthy(found)) == [
        ("ici.link.down", "repair_slice"),
        ("ici.ocs.degraded", "watch"),
    ]
    (link,) = [f for f in unhealthy(found) if f.check == "ici.link.down"]
    assert link.entity.device == f"{min(inside)}:5"


def test_links_down_inside_cubes_are_never_an_ocs_however_many() -> None:
    found = run_v5p(20, cut(z_links(5), 10))  # z 5 -> 6: inside the second cube
    assert {(f.check, f.recommended_action) for f in unhealthy(found)} == {
        ("ici.link.down", "repair_slice")
    }
    assert len(unhealthy(found)) == 16


def test_degraded_health_is_watched_after_persisting() -> None:
    _, found = run(20, cut({frozenset((2, 6))}, 10, value=5))
    found = unhealthy(found)
    assert {(f.check, f.recommended_action) for f in found} == {("ici.link.degraded", "watch")}
    assert sorted(f.entity.device or "" for f in found) == ["2:5", "6:4"]
    assert min(f.ts for f in found) - (T0 + 10 * STEP_MS) >= SETTINGS.tpu_persist_s * 1000


def test_flit_share_drop_without_link_down_is_degraded() -> None:
    state = None
    found: list[Finding] = []
    for step in range(40):
        for host in (0, 1):
            sample = ici_sample(step, f"h{host}", links_of(host, healthy, step))
            if step >= 25:  # chip 3 -> chip 7 carries a tenth of its share from now on
                base = 25 * 1_000_000_000
                slowed = [
                    msgspec.structs.replace(
                        link,
                        flits_tx=base + (step - 25) * 100_000_000,
                        flits_rx=base + (step - 25) * 100_000_000,
                    )
                    if (link.chip_id, link.peer_chip_id) == (3, 7)
                    else link
                    for link in sample.links
                ]
                sample = msgspec.structs.replace(sample, links=slowed)
            state, out = detect_ici(state, sample, SETTINGS)
            found += out
    found = unhealthy(found)
    assert [(f.check, f.entity.device) for f in found] == [("ici.link.degraded", "3:5")]
    assert found[0].evidence is not None and found[0].evidence.metric == "flit_share"


def test_flit_counter_reset_is_not_a_drop() -> None:
    state, found = run(25)
    for step in range(25, 40):  # both hosts rebooted: counters restart from zero
        for host in (0, 1):
            sample = ici_sample(
                step, f"h{host}", links_of(host, healthy, step), flits=(step - 25) * 1_000_000_000
            )
            state, out = detect_ici(state, sample, SETTINGS)
            found += out
    assert found == []


def test_duplicate_host_sample_is_dropped() -> None:
    state, _ = run(5)
    sample = ici_sample(4, "h0", links_of(0, healthy, 4))
    state, out = detect_ici(state, sample, SETTINGS)
    assert out == [] and state.dropped == 1


def test_state_round_trip_gives_the_same_ids() -> None:
    health = cut({frozenset((0, 4))}, 10)
    _, straight = run(20, health)
    state, first = run(10, health)
    restored = msgspec.json.decode(msgspec.json.encode(state), type=IciSliceState)
    _, rest = run(10, health, state=restored, start=10)
    assert [f.finding_id for f in first + rest] == [f.finding_id for f in straight]
    assert isinstance(ici_sample(0, "h0", []), IciSample)
