"""The GPU node detector: hard faults, gray faults against peers and history, confounders,
counter resets, gaps, duplicates, staleness, ids and state round trips."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.detect import GpuNodeState, check_stale_gpu, detect_gpu, note_event
from pipeline.model import Finding, GpuSample, NodeEvent
from tests.detect_fixture import (
    DOWN_SETTINGS,
    SETTINGS,
    STEP_MS,
    T0,
    Change,
    checks,
    gpu_sample,
    no_change,
    unhealthy,
)


def run(
    change: Change = no_change, steps: int = 60, state: GpuNodeState | None = None, **kw: object
) -> tuple[GpuNodeState, list[Finding]]:
    findings: list[Finding] = []
    for step in range(steps):
        state, out = detect_gpu(state, gpu_sample(step, change, **kw), SETTINGS)  # type: ignore[arg-type]
        findings.extend(out)
    assert state is not None
    return state, findings


def on_gpu(gpu: int, start: int, metrics: dict[str, float]) -> Change:
    """Override `metrics` on one GPU from step `start` on."""
    return lambda g, step: metrics if g == gpu and step >= start else {}


def everywhere(start: int, metrics: dict[str, float]) -> Change:
    return lambda g, step: metrics if step >= start else {}


def test_healthy_node_gives_only_heartbeats_once_a_minute() -> None:
    state, findings = run(steps=120)  # 20 minutes of 10 s scrapes
    assert unhealthy(findings) == []
    beats = [f for f in findings if f.check == "heartbeat"]
    assert len(beats) == 20
    assert {f.entity.kind for f in beats} == {"node"}
    assert all(f.healthy and f.recommended_action == "none" for f in beats)
    assert state.dropped == 0


# --- hard faults: counters, flags, the driver's verdict, missing GPUs ----------------------

HARD = [
    # (name, change, check, action, fatal)
    (
        "dbe",
        on_gpu(2, 30, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0}),
        "gpu.ecc.dbe",
        "reset_gpu",
        True,
    ),
    (
        "remap failure",
        on_gpu(2, 30, {"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0}),
        "gpu.row_remap.failure",
        "replace",
        True,
    ),
    (
        "remap pending",
        on_gpu(2, 30, {"DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0}),
        "gpu.row_remap.pending",
        "reset_gpu",
        False,
    ),
    (
        "recovery: reset",
        on_gpu(2, 30, {"DCGM_FI_DEV_GPU_RECOVERY_ACTION": 1.0}),
        "gpu.recovery_action",
        "reset_gpu",
        True,
    ),
    (
        "recovery: reboot",
        on_gpu(2, 30, {"DCGM_FI_DEV_GPU_RECOVERY_ACTION": 2.0}),
        "gpu.recovery_action",
        "reboot",
        True,
    ),
]


@pytest.mark.parametrize(
    ("change", "check", "action", "fatal"), [h[1:] for h in HARD], ids=[h[0] for h in HARD]
)
def test_hard_fault_opens_at_once(change: Change, check: str, action: str, fatal: bool) -> None:
    _, findings = run(change, steps=40)
    (finding,) = unhealthy(findings)
    assert (finding.check, finding.entity.device, finding.entity.kind) == (check, "2", "gpu")
    assert finding.ts == T0 + 30 * STEP_MS
    assert (finding.recommended_action, finding.fatal) == (action, fatal)
    assert finding.entity.target.kind == "node" and finding.entity.target.name == "n1"
    assert finding.evidence is not None


def test_dbe_counter_reset_is_not_an_error_and_a_new_one_after_it_is() -> None:
    def dbe(gpu: int, step: int) -> dict[str, float]:
        value = 5.0 if step < 20 else 0.0 if step < 30 else 1.0  # came up with 5, reset, +1
        return {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": value} if gpu == 1 else {}

    _, findings = run(dbe, steps=40)
    assert [(f.check, f.ts) for f in unhealthy(findings)] == [("gpu.ecc.dbe", T0 + 30 * STEP_MS)]


def test_dbe_episode_clears_after_a_quiet_spell() -> None:
    quiet = SETTINGS.counter_quiet_s * 1000 // STEP_MS
    _, findings = run(on_gpu(2, 10, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0}), steps=quiet + 20)
    assert checks(findings) == [("gpu.ecc.dbe", "2", False), ("gpu.ecc.dbe", "2", True)]
    opened, cleared = [f for f in findings if f.check == "gpu.ecc.dbe"]
    assert cleared.ts - opened.ts == quiet * STEP_MS
    assert cleared.finding_id != opened.finding_id


def test_missing_gpu_opens_after_two_scrapes_and_clears_when_back() -> None:
    state, findings = run(steps=20)
    for step in range(20, 30):
        state, out = detect_gpu(state, gpu_sample(step, gpus=[0, 1, 2, 4, 5, 6, 7]), SETTINGS)
        findings += out
    state, out = detect_gpu(state, gpu_sample(30), SETTINGS)
    findings += out
    assert checks(findings) == [
        ("gpu.missing", "3", False),
        ("gpu.missing", "3", True),
        ("gpu.flap", "3", False),  # back by itself, the node reporting all along: watched
    ]
    missing = unhealthy(findings)[0]
    assert missing.ts == T0 + 21 * STEP_MS
    assert missing.fatal and missing.severity == "critical"


def test_gpu_listed_without_core_metrics_counts_as_missing() -> None:
    def blank(gpu: int, step: int) -> dict[str, float]:
        return {}

    state, findings = run(steps=20)
    sample = gpu_sample(20)
    readings = [
        msgspec.structs.replace(r, metrics={"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3.0})
        if r.index == 5
        else r
        for r in sample.gpus
    ]
    for step in (20, 21):
        scrape = msgspec.structs.replace(sample, ts=T0 + step * STEP_MS, gpus=readings)
        state, out = detect_gpu(state, scrape, SETTINGS)
        findings += out
    assert checks(findings) == [("gpu.missing", "5", False)]


# --- counter rates --------------------------------------------------------------------------


def test_pcie_replays_pile_up_into_a_finding_a_few_retries_do_not() -> None:
    few = on_gpu(4, 30, {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3.0})
    assert unhealthy(run(few)[1]) == []

    def ramp(gpu: int, step: int) -> dict[str, float]:
        return {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": max(0, step - 30) * 2.0} if gpu == 4 else {}

    _, findings = run(ramp)
    (finding,) = unhealthy(findings)
    assert (finding.check, finding.entity.device) == ("gpu.pcie.replay_rate", "4")
    assert finding.ts == T0 + 35 * STEP_MS  # 2 + 2 + 2 + 2 + 2 = 10 replays within the window


def test_pcie_link_width_downgrade() -> None:
    _, findings = run(on_gpu(6, 30, {"DCGM_FI_DEV_PCIE_LINK_WIDTH": 8.0}))
    assert checks(findings)[0] == ("gpu.pcie.link_downgrade", "6", False)


def test_one_nvlink_burst_is_noise_errors_in_several_scrapes_are_not() -> None:
    burst = on_gpu(1, 30, {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 400.0})
    assert unhealthy(run(burst)[1]) == []

    def three_steps(gpu: int, step: int) -> dict[str, float]:  # a burst over three scrapes
        return (
            {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 100.0 * min(max(step - 29, 0), 3)}
            if gpu == 1
            else {}
        )

    assert unhealthy(run(three_steps)[1]) == []

    def creeping(gpu: int, step: int) -> dict[str, float]:
        return (
            {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": max(0, step - 30) * 5.0}
            if gpu == 1
            else {}
        )

    (finding,) = unhealthy(run(creeping)[1])
    assert finding.check == "gpu.nvlink.crc_rate" and finding.recommended_action == "cordon"


def test_sbe_storm_is_watched_never_cordoned() -> None:
    storm = on_gpu(0, 30, {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 90_000.0})
    (finding,) = unhealthy(run(storm)[1])
    assert (finding.check, finding.recommended_action, finding.severity) == (
        "gpu.ecc.sbe_rate",
        "watch",
        "info",
    )
    assert unhealthy(run(on_gpu(0, 30, {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 300.0}))[1]) == []


def test_energy_like_counter_reset_on_reboot_gives_no_spurious_rates() -> None:
    def reboot(gpu: int, step: int) -> dict[str, float]:
        # every counter back to zero at step 30 (volatile counters after a reboot)
        base = 1000.0 if step < 30 else 0.0
        return {
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": base,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": base,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": base,
        }

    assert unhealthy(run(reboot)[1]) == []


# --- gray faults against peers and history, and confounders ----------------------------------


def test_hot_gpu_against_its_peers() -> None:
    _, findings = run(on_gpu(3, 30, {"DCGM_FI_DEV_GPU_TEMP": 75.0}))
    (finding,) = unhealthy(findings)
    assert (finding.check, finding.entity.device) == ("gpu.temp.peer", "3")
    assert finding.ts == T0 + (30 + SETTINGS.gray_persist_samples - 1) * STEP_MS


def test_whole_node_warmer_diurnal_or_hot_room_is_not_a_fault() -> None:
    def warmer(gpu: int, step: int) -> dict[str, float]:
        return {"DCGM_FI_DEV_GPU_TEMP": 62.0 + gpu * 0.5 + min(step, 60) * 0.2}

    assert unhealthy(run(warmer, steps=90)[1]) == []


def test_throttled_gpu_clock_below_peers() -> None:
    _, findings = run(on_gpu(5, 30, {"DCGM_FI_DEV_SM_CLOCK": 1650.0}))
    assert [c for c in checks(findings) if not c[2]] == [("gpu.clock.throttle", "5", False)]


def test_whole_node_power_brake_is_a_throttle_finding_on_every_gpu() -> None:
    brake = everywhere(
        30, {"DCGM_FI_DEV_SM_CLOCK": 1650.0, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 128.0}
    )
    found = unhealthy(run(brake)[1])
    assert {f.check for f in found} == {"gpu.clock.throttle"}
    assert sorted(f.entity.device or "" for f in found) == [str(g) for g in range(8)]


def test_whole_node_slower_without_evidence_is_watched_then_escalated() -> None:
    slow = everywhere(30, {"DCGM_FI_DEV_SM_CLOCK": 1650.0})
    escalate = SETTINGS.slow_escalate_s * 1000 // STEP_MS
    _, findings = run(slow, steps=30 + escalate + 10)
    first = [f for f in unhealthy(findings) if f.entity.device == "0"]
    assert [(f.check, f.recommended_action) for f in first] == [
        ("gpu.clock.slow", "watch"),
        ("gpu.clock.throttle", "cordon"),
    ]
    assert first[1].ts - first[0].ts >= (escalate - SETTINGS.gray_persist_samples) * STEP_MS


def test_a_gpu_slow_whenever_busy_escalates_across_idle_spells_a_normal_busy_scrape_resets() -> None:
    # A serving node: busy at peaks, idle between them; slow at every peak. Idle scrapes say
    # nothing about the clock, so they neither end the slow run nor count against it.
    escalate = SETTINGS.slow_escalate_s * 1000 // STEP_MS

    def peaks(normal_at: int | None) -> Callable[[int, int], dict[str, float]]:
        def load(gpu: int, step: int) -> dict[str, float]:
            if step < 30:
                return {}
            if step % 20 >= 12:  # idle between peaks
                return {"DCGM_FI_DEV_GPU_UTIL": 5.0, "DCGM_FI_DEV_SM_CLOCK": 300.0}
            return {} if step == normal_at else {"DCGM_FI_DEV_SM_CLOCK": 1650.0}

        return load

    _, findings = run(peaks(None), steps=30 + 2 * escalate)
    assert ("gpu.clock.throttle", "0", False) in checks(findings)
    # one busy scrape at its usual clock in every stretch shorter than slow_escalate_s: never
    _, findings = run(peaks(30 + escalate // 2), steps=30 + escalate + 10)
    assert ("gpu.clock.throttle", "0", False) not in checks(findings)


def test_a_gpu_slowed_by_about_the_threshold_escalates_though_some_scrapes_dip_under_it() -> None:
    # 11 % below its usual clock, every 7th scrape only 8 % (under clock_own_frac): each dip
    # used to restart the slow run, so it was watched for ever
    escalate = SETTINGS.slow_escalate_s * 1000 // STEP_MS

    def load(gpu: int, step: int) -> dict[str, float]:
        if step < 30:
            return {}
        return {"DCGM_FI_DEV_SM_CLOCK": 1980.0 * (0.92 if step % 7 == 0 else 0.89)}

    everyone = {c for c in checks(run(load, steps=30 + escalate + 20)[1]) if not c[2]}
    assert ("gpu.clock.slow", "0", False) in everyone
    assert ("gpu.clock.throttle", "0", False) in everyone


def test_a_new_job_resets_the_clock_history() -> None:
    def new_job_lower_clocks(gpu: int, step: int) -> dict[str, float]:
        return {"DCGM_FI_DEV_SM_CLOCK": 1650.0} if step >= 30 else {}

    state, findings = run(steps=30)
    for step in range(30, 90):
        state, out = detect_gpu(
            state, gpu_sample(step, new_job_lower_clocks, job="job-b"), SETTINGS
        )
        findings += out
    assert unhealthy(findings) == []  # the new job just runs at other clocks


def test_workload_straggler_drawing_more_power_is_not_a_fault() -> None:
    busier = on_gpu(7, 30, {"DCGM_FI_DEV_POWER_USAGE": 700.0, "DCGM_FI_DEV_GPU_TEMP": 66.0})
    assert unhealthy(run(busier)[1]) == []


def test_low_power_without_hardware_evidence_needs_a_second_job() -> None:
    low = on_gpu(2, 30, {"DCGM_FI_DEV_POWER_USAGE": 420.0})
    assert unhealthy(run(low)[1]) == []
    state, findings = run(low, steps=50)
    for step in range(50, 80):
        state, out = detect_gpu(state, gpu_sample(step, low, job="job-b"), SETTINGS)
        findings += out
    assert [(f.check, f.entity.device) for f in unhealthy(findings)] == [("gpu.power.peer", "2")]


def test_low_power_with_thermal_throttling_is_a_straggler_finding() -> None:
    hot = on_gpu(
        2, 30, {"DCGM_FI_DEV_POWER_USAGE": 420.0, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 32.0}
    )
    assert ("gpu.power.peer", "2", False) in checks(run(hot)[1])


def test_pcie_traffic_collapse_on_a_gpu_pair_points_at_the_nic() -> None:
    def nic(gpu: int, step: int) -> dict[str, float]:
        dead = {"DCGM_FI_PROF_PCIE_TX_BYTES": 1e6, "DCGM_FI_PROF_PCIE_RX_BYTES": 1e6}
        return dead if gpu in (2, 3) and step >= 30 else {}

    found = unhealthy(run(nic)[1])
    assert sorted((f.check, f.entity.device) for f in found) == [
        ("gpu.pcie.traffic", "2"),
        ("gpu.pcie.traffic", "3"),
    ]


def test_idle_gpus_are_not_judged_on_clocks() -> None:
    idle = on_gpu(
        1,
        30,
        {
            "DCGM_FI_DEV_GPU_UTIL": 0.0,
            "DCGM_FI_DEV_SM_CLOCK": 345.0,
            "DCGM_FI_DEV_POWER_USAGE": 90.0,
        },
    )
    assert unhealthy(run(idle)[1]) == []


def test_no_statistical_finding_before_warmup() -> None:
    # a GPU that is odd from the first scrape, but only by what its history would show
    odd = on_gpu(3, 0, {"DCGM_FI_DEV_GPU_TEMP": 70.0, "DCGM_FI_DEV_POWER_USAGE": 500.0})
    _, findings = run(odd, steps=SETTINGS.warmup_samples)
    assert unhealthy(findings) == []


# --- input hygiene: duplicates, out of order, gaps, missing metrics -------------------------


def test_duplicates_and_out_of_order_scrapes_are_dropped_and_counted() -> None:
    state, _ = run(steps=10)
    state, out = detect_gpu(state, gpu_sample(9), SETTINGS)
    assert out == []
    state, out = detect_gpu(
        state, gpu_sample(3, on_gpu(1, 0, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 9.0})), SETTINGS
    )
    assert out == []
    assert state.dropped == 2


def test_a_long_gap_does_not_invent_rates() -> None:
    state, findings = run(on_gpu(0, 0, {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 100.0}), steps=30)
    later = on_gpu(0, 0, {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 104.0})
    for step in range(400, 420):  # an hour later, 4 replays over the gap
        state, out = detect_gpu(state, gpu_sample(step, later), SETTINGS)
        findings += out
    assert unhealthy(findings) == []


def test_absent_metrics_are_skipped_without_error() -> None:
    def sparse(gpu: int, step: int) -> dict[str, float]:
        return {}

    state, findings = run(steps=30)
    sample = gpu_sample(30)
    thin = [
        msgspec.structs.replace(r, metrics={"DCGM_FI_DEV_POWER_USAGE": 600.0}) for r in sample.gpus
    ]
    state, out = detect_gpu(state, msgspec.structs.replace(sample, gpus=thin), SETTINGS)
    assert unhealthy(findings + out) == []


# --- staleness, announcements, ids, state ------------------------------------------------------


def test_silent_node_is_stale_with_an_id_independent_of_when_checked() -> None:
    state, _ = run(steps=10)
    last = T0 + 9 * STEP_MS
    assert check_stale_gpu(state, last + 35_000, SETTINGS)[1] == []
    a_state = msgspec.json.decode(msgspec.json.encode(state), type=GpuNodeState)
    _, early = check_stale_gpu(state, last + 41_000, SETTINGS)
    _, late = check_stale_gpu(a_state, last + 55_000, SETTINGS)
    assert [f.check for f in early] == ["node.stale"] and early[0].recommended_action == "reboot"
    assert early[0].finding_id == late[0].finding_id
    assert check_stale_gpu(state, last + 60_000, SETTINGS)[1] == []  # open once
    state, out = detect_gpu(state, gpu_sample(20), SETTINGS)
    assert ("node.stale", None, True) in checks(out)


def test_long_silence_is_node_down_and_fatal() -> None:
    state, _ = run(steps=10)
    last = T0 + 9 * STEP_MS
    off = msgspec.structs.replace(SETTINGS, node_down_s=0)
    assert [f.check for f in check_stale_gpu(state, last + 3_600_000, off)[1]] == [
        "node.stale"
    ]  # node_down_s=0 turns it off
    state, _ = run(steps=10)
    _, out = check_stale_gpu(state, last + DOWN_SETTINGS.node_down_s * 1000 + 1, DOWN_SETTINGS)
    assert [(f.check, f.fatal) for f in out] == [("node.stale", False), ("node.down", True)]
    _, back = detect_gpu(state, gpu_sample(40), SETTINGS)
    assert {c for c, _, healthy in checks(back) if healthy} == {"node.stale", "node.down"}


def test_announced_absence_is_watched_not_repaired() -> None:
    state, _ = run(steps=10)
    deleted = NodeEvent(
        ts=T0 + 95_000,
        cluster="c1",
        target_kind="node",
        target="n1",
        pool="p1",
        zone="z1",
        kind="deleted",
        actor="gke",
        reason="spot VM preempted",
    )
    state = note_event(state, deleted)
    _, out = check_stale_gpu(state, T0 + 9 * STEP_MS + 45_000, SETTINGS)
    assert [(f.check, f.recommended_action, f.severity) for f in out] == [
        ("node.stale", "watch", "info")
    ]


def test_an_ended_announcement_still_explains_the_silence_it_covered() -> None:
    state, _ = run(steps=10)
    for kind, seconds in (("deleted", 95), ("created", 3600)):
        event = NodeEvent(
            ts=T0 + seconds * 1000,
            cluster="c1",
            target_kind="node",
            target="n1",
            pool="p1",
            zone="z1",
            kind=kind,
            actor="gke",
        )  # type: ignore[arg-type]
        state = note_event(state, event)
    _, out = check_stale_gpu(state, T0 + 3_605_000, DOWN_SETTINGS)
    assert [(f.check, f.recommended_action) for f in out] == [("node.stale", "watch")]
    other = NodeEvent(
        ts=T0 + 95_000,
        cluster="c1",
        target_kind="node",
        target="n2",
        pool="p1",
        zone="z1",
        kind="deleted",
        actor="gke",
    )
    fresh, _ = run(steps=10)
    _, out = check_stale_gpu(note_event(fresh, other), T0 + 3_605_000, DOWN_SETTINGS)
    assert [(f.check, f.fatal) for f in out] == [("node.stale", False), ("node.down", True)]


def test_same_inputs_give_the_same_findings_and_ids() -> None:
    fault = on_gpu(3, 30, {"DCGM_FI_DEV_GPU_TEMP": 80.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0})
    ids_a = [f.finding_id for f in run(fault)[1]]
    ids_b = [f.finding_id for f in run(fault)[1]]
    assert ids_a == ids_b and len(set(ids_a)) == len(ids_a)


def test_state_survives_a_serialisation_round_trip() -> None:
    fault = on_gpu(3, 40, {"DCGM_FI_DEV_GPU_TEMP": 80.0, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 50.0})
    _, straight = run(fault, steps=70)
    state, first = run(fault, steps=35)
    restored = msgspec.json.decode(msgspec.json.encode(state), type=GpuNodeState)
    rest: list[Finding] = []
    for step in range(35, 70):
        restored, out = detect_gpu(restored, gpu_sample(step, fault), SETTINGS)
        rest += out
    assert [f.finding_id for f in first + rest] == [f.finding_id for f in straight]


def test_replaying_a_burst_gives_the_same_id() -> None:
    fault = on_gpu(2, 30, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0})
    state, findings = run(fault, steps=31)
    (opened,) = unhealthy(findings)
    state, out = detect_gpu(state, gpu_sample(30, fault), SETTINGS)  # the same scrape again
    assert out == [] and state.dropped == 1
    _, again = run(fault, steps=31)
    assert unhealthy(again)[0].finding_id == opened.finding_id


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 7), st.floats(30, 95), st.floats(900, 2000)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 3),
)
def test_property_determinism_and_quiet_warmup(
    edits: list[tuple[int, float, float]], seed: int
) -> None:
    def change(gpu: int, step: int) -> dict[str, float]:
        index, temp, clock = edits[step % len(edits)]
        return {"DCGM_FI_DEV_GPU_TEMP": temp, "DCGM_FI_DEV_SM_CLOCK": clock} if gpu == index else {}

    samples: list[GpuSample] = [
        gpu_sample(s, change, seed=seed) for s in range(SETTINGS.warmup_samples)
    ]
    outputs = []
    for _ in range(2):
        state = None
        found: list[Finding] = []
        for sample in samples:
            state, out = detect_gpu(state, sample, SETTINGS)
            found += out
        outputs.append([(f.finding_id, f.check) for f in found])
    assert outputs[0] == outputs[1]
    statistical = {"gpu.power.peer", "gpu.clock.slow", "gpu.pcie.traffic"}
    assert not [c for _, c in outputs[0] if c in statistical]


# --- MIG: each GPU instance is its own device ------------------------------------------------


def _mig(sample: GpuSample, dbe_on_instance_2: float = 0.0) -> GpuSample:
    """GPU 0 split into GPU instances 1 and 2 (same uuid and index); instance 2 may count DBEs."""
    whole = sample.gpus[0]
    instances = [
        msgspec.structs.replace(
            whole,
            mig_instance=i,
            mig_profile="3g.40gb",
            metrics=whole.metrics
            | ({"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": dbe_on_instance_2} if i == 2 else {}),
        )
        for i in (1, 2)
    ]
    return msgspec.structs.replace(sample, gpus=instances + sample.gpus[1:])


def test_mig_instances_are_separate_devices() -> None:
    state: GpuNodeState | None = None
    findings: list[Finding] = []
    for step in range(40):
        sample = _mig(gpu_sample(step), dbe_on_instance_2=3.0 if step >= 30 else 0.0)
        state, out = detect_gpu(state, sample, SETTINGS)
        findings += out
    assert state is not None and {"0/mig1", "0/mig2", "1"} <= set(state.devices)
    bad = unhealthy(findings)
    assert bad and {f.entity.device for f in bad} == {"0/mig2"}
