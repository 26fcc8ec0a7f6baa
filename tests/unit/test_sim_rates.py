"""Injected fault counts agree with the configured rates; the knobs and multipliers do what
the fault model says (fleet_multiplier, intensity with its cap, lemons, heavy-tailed offenders,
hot zones, driver waves). Only schedules are built here (no telemetry), so long spans are cheap.
"""

from __future__ import annotations

import functools
import math

import msgspec
import numpy as np
import pytest

from pipeline.config import SimSettings
from pipeline.sim import FAULT_TYPES, ForcedFault, Simulation, fault_type, parse_forced
from pipeline.sim.schedule import HOUR_MS, scale_factor

DAYS = 30
LONG = SimSettings(
    duration_s=DAYS * 86_400, gpu_interval_s=600, tpu_interval_s=600, ici_interval_s=600,
    capacity_interval_s=3600, gpu_nodes=24, tpu_slices=4, intensity=10, noise_intensity=1,
    seed=21,
)


@functools.cache
def long_run() -> Simulation:
    return Simulation(LONG)


def _groups(sim: Simulation, key: str) -> int:
    code, _, variant = key.partition("/")
    return len({f.group for f in sim.ground_truth if f.fault_type == code and f.variant == variant})


# intensity per type: enough arrivals for a meaningful test, few enough that the targets are
# rarely all taken (an arrival that finds every unit busy is dropped, by design)
RATE_CASES = {
    "G1/lost": 100, "G5/hbm": 20, "G10/sbe": 1, "N2/host": 300, "S1/failslow": 100,
    "J1/crash": 1, "J4/restart": 1, "S2/comm": 1, "T1/host": 30, "T2/ici": 30, "T3/ocs": 50,
    "C1/preempt": 1, "F1/cable": 200,
}


@pytest.mark.parametrize(("key", "intensity"), sorted(RATE_CASES.items()))
def test_injected_counts_agree_with_the_rates(key: str, intensity: float) -> None:
    settings = msgspec.structs.replace(LONG, intensity=intensity, fault_types=(key,))
    sim = Simulation(settings)
    expected = sim.rates[key].expected_count(sim.start_ms, sim.end_ms)
    observed = _groups(sim, key)
    assert 15 < expected < 1000, "pick settings that make the test meaningful"
    # Poisson: mean = variance; 4.5 sigma keeps a correct model from failing by chance
    assert abs(observed - expected) <= 4.5 * math.sqrt(expected) + 1, (observed, expected)


def test_rates_hold_with_every_type_on_at_once() -> None:
    sim = long_run()
    for key in ("G10/sbe", "J1/crash", "G1/lost"):
        expected = sim.rates[key].expected_count(sim.start_ms, sim.end_ms)
        observed = _groups(sim, key)
        assert abs(observed - expected) <= 4.5 * math.sqrt(expected) + 1, (key, observed, expected)


def test_expected_count_is_reference_rate_times_knobs_times_exposure() -> None:
    # random_faults=False: no lemons, new nodes or hot zones, so every node has the same rate
    sim = Simulation(msgspec.structs.replace(LONG, random_faults=False, duration_s=36_000))
    rates = sim.rates["N2/host"]
    assert rates.windows == [] and fault_type("N2").rate_per_h == pytest.approx(1.27e-4 / 24)
    assert scale_factor(fault_type("N2"), LONG) == 10
    per_node_h = min(1.27e-4 / 24 * 10, 0.05)
    expected = len(sim.fleet.gpu_nodes) * per_node_h * 10
    assert rates.expected_count(sim.start_ms, sim.end_ms) == pytest.approx(expected)


def test_intensity_raises_rates_up_to_the_cap_and_fleet_multiplier_scales_hardware() -> None:
    base = msgspec.structs.replace(LONG, duration_s=3600, intensity=1.0)

    def expected(settings: SimSettings, key: str) -> float:
        sim = Simulation(msgspec.structs.replace(settings, random_faults=False))
        sim.rates.clear()
        from pipeline.sim.schedule import rates_for

        rates = rates_for(fault_type(*key.split("/")), sim.fleet, sim.workload, sim.hetero, settings, [])
        return float(rates.max_rates().sum())

    g1 = expected(base, "G1/lost")
    assert expected(msgspec.structs.replace(base, intensity=10), "G1/lost") == pytest.approx(10 * g1)
    assert expected(msgspec.structs.replace(base, fleet_multiplier=2.0), "G1/lost") == pytest.approx(2 * g1)
    # software types ignore the fleet multiplier; everything stops at the per-unit cap
    j1 = expected(base, "J1/crash")
    assert expected(msgspec.structs.replace(base, fleet_multiplier=2.0), "J1/crash") == pytest.approx(j1)
    capped = expected(msgspec.structs.replace(base, intensity=1e6), "J1/crash")
    jobs = sum(1 for j in Simulation(msgspec.structs.replace(base, random_faults=False)).workload.jobs if j.kind == "train")
    assert capped == pytest.approx(jobs * 0.05 * 4)  # 0.05 per node-hour x 4 node-equivalents
    assert expected(msgspec.structs.replace(base, intensity=0.5), "J1/crash") == pytest.approx(0.5 * j1)


def test_lemon_and_new_nodes_fail_more_often() -> None:
    sim = Simulation(msgspec.structs.replace(LONG, gpu_nodes=300, tpu_slices=0, duration_s=3600))
    rates = sim.rates["N2/host"]
    nodes = [u.a for u in rates.exposure.units]
    lemons = {f.target.name for f in sim.ground_truth if f.fault_type == "H1"}
    new = {f.target.name for f in sim.ground_truth if f.fault_type == "H3"}
    ordinary = min(rates.natural)
    assert lemons and new, "pick a fleet with both"
    for i, node in enumerate(nodes):
        name = sim.fleet.gpu_nodes[node].name
        factor = rates.natural[i] / ordinary
        if name in lemons:
            assert 10 <= factor / (5 if name in new else 1) <= 20
        elif name in new:
            assert factor == pytest.approx(5)
        else:
            assert factor == pytest.approx(1)
    # the reference rates are fleet averages: lemons and new nodes redistribute, not add
    assert rates.natural.mean() == pytest.approx(fault_type("N2").rate_per_h)


def test_noise_is_concentrated_on_a_few_gpus() -> None:
    # H2: a heavy-tailed per-GPU multiplier; the top 1 % of GPUs carry a large share of SBEs
    sim = Simulation(msgspec.structs.replace(LONG, gpu_nodes=64, duration_s=3600))
    rates = np.sort(sim.rates["G10/sbe"].max_rates())[::-1]
    top = max(1, len(rates) // 100)
    assert rates[:top].sum() / rates.sum() > 0.4  # "~1 % of GPUs produce >90 % of events"
    assert np.median(rates) < 0.05 * rates.mean()  # most GPUs are quiet
    offenders = [f for f in sim.ground_truth if f.fault_type == "H2"]
    assert len(offenders) == pytest.approx(len(rates) / 100, abs=2)
    assert all(f.must_not_cordon for f in offenders)


def test_a_hot_zone_raises_hardware_rates_there_during_the_window() -> None:
    settings = msgspec.structs.replace(LONG, duration_s=86_400, random_faults=False)
    sim = Simulation(settings, [ForcedFault(fault_type="H5", at_s=3600, duration_s=7200)])
    zone = next(f.target.zone for f in sim.ground_truth if f.fault_type == "H5")
    rates = sim.rates["G1/lost"]
    unit = next(i for i, z in enumerate(rates.exposure.zone) if z == zone)
    other = next(i for i, z in enumerate(rates.exposure.zone) if z != zone)
    inside = sim.start_ms + 2 * HOUR_MS
    assert rates.rate_at(unit, inside) == pytest.approx(1.5 * rates.rate_at(unit, sim.start_ms))
    assert rates.rate_at(other, inside) == pytest.approx(rates.rate_at(other, sim.start_ms))
    assert sim.rates["J1/crash"].windows == []  # software faults do not care about the heat
    hot = sum(rates.rate_at(u, inside) - rates.rate_at(u, sim.start_ms) for u in range(len(rates.exposure.units)))
    plain = sum(rates.rate_at(u, sim.start_ms) for u in range(len(rates.exposure.units)))
    total = rates.expected_count(sim.start_ms, sim.end_ms)
    assert total == pytest.approx(plain * 24 + hot * 2)


def test_fleet_properties_exist_only_with_random_faults() -> None:
    quiet = Simulation(msgspec.structs.replace(LONG, random_faults=False, duration_s=3600))
    assert {f.fault_type for f in quiet.ground_truth} <= {"S5"}
    sim = long_run()
    assert {"H2", "S5"} <= {f.fault_type for f in sim.ground_truth}
    diurnal = [f for f in sim.ground_truth if f.fault_type == "S5"]
    assert len(diurnal) == LONG.clusters and all(f.must_not_cordon for f in diurnal)


def test_every_type_in_the_fault_model_is_catalogued() -> None:
    codes = {ft.code for ft in FAULT_TYPES}
    model = {f"G{i}" for i in range(1, 11)} | {"N1", "N2", "N3", "F1", "F2", "F3"}
    model |= {f"J{i}" for i in range(1, 5)} | {f"S{i}" for i in range(1, 7)}
    model |= {f"H{i}" for i in range(1, 6)} | {"T1", "T2", "T3", "T4"}
    assert model <= codes  # T5 is a calibration target, not a fault
    for ft in FAULT_TYPES:
        if ft.klass in ("confounder", "planned", "noise"):
            assert ft.must_not_cordon or ft.code == "H4"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("G1@300", ForcedFault(fault_type="G1", at_s=300.0)),
        ("t2/ici@60:slice-a:5", ForcedFault(fault_type="T2", variant="ici", at_s=60.0, target="slice-a", device=5)),
        ("N3/cloud@1.5:node-1", ForcedFault(fault_type="N3", variant="cloud", at_s=1.5, target="node-1")),
    ],
)
def test_fault_specs_parse(spec: str, expected: ForcedFault) -> None:
    assert parse_forced(spec) == expected


@pytest.mark.parametrize("spec", ["G1", "G99@3", "G1@soon", "G2/typo@1"])
def test_bad_fault_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_forced(spec)


def test_interrupting_rates_add_up_to_the_reference_fleet() -> None:
    # fault model §1.1: B's hardware total is 3.2 per 1k node-days (GPU 2.42, host 0.48,
    # fabric 0.32) for 8-GPU H100 nodes
    from pipeline.sim.calibration import G5_INTERRUPT_SHARE, INTERRUPTING

    per_1k = 0.0
    for ft in FAULT_TYPES:
        if ft.key not in INTERRUPTING:
            continue
        share = G5_INTERRUPT_SHARE if ft.code == "G5" else 1.0
        per_node_h = {"gpu": 8.0, "node": 1.0, "rack": 1 / 4}[ft.unit] * ft.rate_per_h * share
        per_1k += per_node_h * 24 * 1000
    assert per_1k == pytest.approx(3.2, rel=0.03)


def test_a_year_of_the_fleet_matches_the_reference_interruption_rate() -> None:
    from pipeline.sim.calibration import INTERRUPTING, interruptions_per_1k_node_days

    settings = msgspec.structs.replace(
        LONG, duration_s=365 * 86_400, tpu_slices=0, intensity=5, fault_types=tuple(INTERRUPTING)
    )
    observed = interruptions_per_1k_node_days(Simulation(settings))
    # x5 intensity; the G5 share is per-GB, so the H200/A100 mix moves it a little
    assert observed == pytest.approx(5 * 3.2, rel=0.25)


def test_tpu_fleet_matches_the_t5_calibration_targets() -> None:
    from pipeline.sim.calibration import tpu_shares

    settings = msgspec.structs.replace(
        LONG, duration_s=365 * 86_400, gpu_nodes=0, tpu_slices=8, intensity=1,
        tpu_slice_types=("v5p-128:4x4x4",), fault_types=("T1", "T2", "T3", "S6"),
    )
    shares = tpu_shares(Simulation(settings))
    assert 0.03 <= shares["unavailable"] <= 0.15  # ~6.5 % of cubes unavailable (T5)
    assert 0.0 < shares["rerouted"] < 0.05  # < 2 % of jobs on rerouted paths (T5), loosely
