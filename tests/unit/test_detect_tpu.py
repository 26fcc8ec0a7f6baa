"""The TPU slice detector: chips against their peers on other hosts, missing chips, silent
hosts versus a silent slice; every finding targets the slice."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from pipeline.detect import TpuSliceState, check_stale_tpu, detect_tpu
from pipeline.model import Finding
from tests.detect_fixture import DOWN_SETTINGS, SETTINGS, STEP_MS, T0, checks, tpu_sample, unhealthy

HOSTS = 4


def run(
    steps: int,
    duty: Callable[[int, int], float] = lambda chip, step: 97.0,
    hosts: int = HOSTS,
    missing: Callable[[int], list[int]] = lambda step: [],
    state: TpuSliceState | None = None,
    start: int = 0,
) -> tuple[TpuSliceState, list[Finding]]:
    found: list[Finding] = []
    for step in range(start, start + steps):
        for host in range(hosts):
            sample = tpu_sample(step, host, _at(duty, step), missing=missing(step))
            state, out = detect_tpu(state, sample, SETTINGS)
            found += out
    assert state is not None
    return state, found


def _at(duty: Callable[[int, int], float], step: int) -> Callable[[int], float]:
    return lambda chip: duty(chip, step)


def test_healthy_slice_gives_one_heartbeat_per_minute_for_the_slice() -> None:
    _, found = run(60)
    assert unhealthy(found) == []
    beats = [f for f in found if f.check == "heartbeat"]
    assert len(beats) == 10
    assert {(f.entity.kind, f.entity.target.kind, f.entity.target.name) for f in beats} == {
        ("slice", "slice", "s1")
    }


def test_idle_chip_among_busy_peers_is_a_slice_repair() -> None:
    _, found = run(30, lambda chip, step: 0.0 if chip == 6 and step >= 10 else 97.0)
    (finding,) = unhealthy(found)
    assert (finding.check, finding.entity.kind, finding.entity.device) == (
        "tpu.chip.duty_cycle",
        "tpu_chip",
        "6",
    )
    assert finding.entity.target.kind == "slice" and finding.recommended_action == "repair_slice"
    assert finding.ts - (T0 + 10 * STEP_MS) >= SETTINGS.tpu_persist_s * 1000


def test_chip_duty_recovers_and_the_finding_clears() -> None:
    _, found = run(60, lambda chip, step: 0.0 if chip == 6 and 10 <= step < 20 else 97.0)
    assert checks(found) == [
        ("tpu.chip.duty_cycle", "6", False),
        ("tpu.chip.duty_cycle", "6", True),
    ]


def test_whole_host_gone_idle_is_seen_against_the_other_host_of_a_two_host_slice() -> None:
    _, found = run(30, lambda chip, step: 0.0 if chip < 4 and step >= 10 else 97.0, hosts=2)
    assert sorted(f.entity.device or "" for f in unhealthy(found)) == ["0", "1", "2", "3"]


def test_an_idle_slice_is_not_a_fault() -> None:
    _, found = run(30, lambda chip, step: 0.0 if step >= 10 else 97.0)
    assert unhealthy(found) == []


def test_slow_chip_is_watched() -> None:
    state = None
    found: list[Finding] = []
    for step in range(20):
        for host in range(HOSTS):
            sample = tpu_sample(step, host)
            if host == 1 and step >= 5:
                chips = [
                    msgspec.structs.replace(c, metrics={**c.metrics, "tensorcore_util": 20.0})
                    if c.chip_id == 5
                    else c
                    for c in sample.chips
                ]
                sample = msgspec.structs.replace(sample, chips=chips)
            state, out = detect_tpu(state, sample, SETTINGS)
            found += out
    (finding,) = unhealthy(found)
    assert (finding.check, finding.recommended_action) == ("tpu.chip.tensorcore_util", "watch")


def test_chip_missing_from_its_host_scrape() -> None:
    _, found = run(20, missing=lambda step: [9] if step >= 10 else [])
    (finding,) = unhealthy(found)
    assert (finding.check, finding.entity.device, finding.recommended_action) == (
        "tpu.chip.missing",
        "9",
        "repair_slice",
    )
    assert finding.ts == T0 + 11 * STEP_MS


def test_silent_host_while_the_rest_reports_is_stale() -> None:
    state, _ = run(10)
    found: list[Finding] = []
    for step in range(10, 25):
        for host in (0, 1, 3):  # host 2 died
            state, out = detect_tpu(state, tpu_sample(step, host), SETTINGS)
            found += out
        state, out = check_stale_tpu(state, T0 + step * STEP_MS, DOWN_SETTINGS)
        found += out
    stale = [f for f in unhealthy(found) if f.check == "tpu.host.stale"]
    assert [(f.entity.kind, f.entity.device, f.recommended_action) for f in stale] == [
        ("node", "s1-w2", "repair_slice")
    ]
    down = [f for f in unhealthy(found) if f.check == "tpu.host.down"]
    assert [(f.entity.device, f.fatal) for f in down] == [("s1-w2", True)]
    state, out = detect_tpu(state, tpu_sample(25, 2), SETTINGS)
    assert {"tpu.host.stale", "tpu.host.down"} <= {c for c, _, healthy in checks(out) if healthy}


def test_whole_slice_silent_is_one_watch_not_a_repair_per_host() -> None:
    state, _ = run(10)
    _, out = check_stale_tpu(state, T0 + 9 * STEP_MS + 120_000, SETTINGS)
    assert [(f.check, f.recommended_action) for f in out] == [("tpu.slice.stale", "watch")]


def test_duplicate_host_scrape_is_dropped_other_hosts_at_the_same_ts_are_not() -> None:
    state, _ = run(5)
    state, out = detect_tpu(state, tpu_sample(4, 1), SETTINGS)
    assert out == [] and state.dropped == 1
    assert all(host.last_ts == T0 + 4 * STEP_MS for host in state.hosts.values())


def test_state_round_trip_and_determinism() -> None:
    def duty(chip: int, step: int) -> float:
        return 0.0 if chip == 3 and step >= 8 else 97.0

    _, straight = run(20, duty)
    state, first = run(10, duty)
    restored = msgspec.json.decode(msgspec.json.encode(state), type=TpuSliceState)
    _, rest = run(10, duty, state=restored, start=10)
    assert [f.finding_id for f in first + rest] == [f.finding_id for f in straight]


def _skewed_run(by_ms: int, offsets: dict[str, int]) -> list[Finding]:
    """Host 2 stamps `by_ms` off (negative: behind) from step 10 on, reporting on time."""
    state, _ = run(10)
    found: list[Finding] = []
    for step in range(10, 40):
        for host in range(HOSTS):
            sample = tpu_sample(step, host)
            if host == 2:
                sample = msgspec.structs.replace(sample, ts=sample.ts + by_ms)
            state, out = detect_tpu(state, sample, SETTINGS)
            found += out
        state, out = check_stale_tpu(state, T0 + step * STEP_MS, DOWN_SETTINGS, offsets)
        found += out
    return found


def test_a_host_stamping_behind_is_silent_only_without_its_offset() -> None:
    assert {f.check for f in unhealthy(_skewed_run(-240_000, {}))} >= {"tpu.host.down"}
    assert unhealthy(_skewed_run(-240_000, {"s1-w2": 240_000})) == []


def test_a_host_stamping_ahead_is_not_judged_silent_for_it() -> None:
    # (its siblings' records were refused as late behind the slice's windows it closed: the
    # door and the windows now place its samples in the partition's time base, tested in
    # tests/faults/test_scoped_faults.py)
    assert unhealthy(_skewed_run(200_000, {"s1-w2": -200_000})) == []
