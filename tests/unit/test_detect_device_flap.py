"""Device flapping: a GPU or TPU chip that drops out of its host's scrape and comes back is
watched on the first return, acted on when it keeps doing it, and let go after a quiet window;
a device back after a long absence (repaired) is not a flap."""

from __future__ import annotations

from pipeline.detect import detect_gpu, detect_tpu
from pipeline.detect.gpu import GpuNodeState
from pipeline.detect.tpu import TpuSliceState
from pipeline.model import Finding
from tests.detect_fixture import SETTINGS, STEP_MS, T0, checks, gpu_sample, tpu_sample, unhealthy

ALL_BUT_3 = [0, 1, 2, 4, 5, 6, 7]
WINDOW_STEPS = SETTINGS.device_flap_window_s * 1000 // STEP_MS


def gpus(steps: range, without_3: set[int], state: GpuNodeState | None = None
         ) -> tuple[GpuNodeState, list[Finding]]:
    found: list[Finding] = []
    for step in steps:
        sample = gpu_sample(step, gpus=ALL_BUT_3 if step in without_3 else range(8))
        state, out = detect_gpu(state, sample, SETTINGS)
        found += out
    assert state is not None
    return state, found


def test_one_scrape_away_and_back_is_watched_not_acted_on() -> None:
    _, found = gpus(range(40), without_3={20})
    (flap,) = unhealthy(found)  # one scrape is below missing_samples: no gpu.missing
    assert (flap.check, flap.entity.device, flap.recommended_action) == ("gpu.flap", "3", "watch")
    assert flap.evidence is not None and flap.evidence.value == 2 * STEP_MS / 1000


def test_a_gpu_that_keeps_dropping_out_is_acted_on() -> None:
    _, found = gpus(range(80), without_3={20, 40, 60})
    flapping = [f for f in unhealthy(found) if f.check == "gpu.flap.persistent"]
    assert [(f.entity.device, f.severity, f.recommended_action) for f in flapping] == [
        ("3", "critical", "reboot")
    ]
    assert flapping[0].ts == T0 + 61 * STEP_MS
    assert [f.check for f in unhealthy(found)] == ["gpu.flap", "gpu.flap.persistent"]


def test_returns_spread_wider_than_the_window_never_persist() -> None:
    gap = WINDOW_STEPS // 2 + 5
    _, found = gpus(range(4 * gap), without_3={gap, 2 * gap, 3 * gap})
    assert "gpu.flap.persistent" not in {f.check for f in found}


def test_flapping_clears_after_a_quiet_window() -> None:
    state, _ = gpus(range(80), without_3={20, 40, 60})
    _, later = gpus(range(80, 62 + WINDOW_STEPS + 2), set(), state)
    assert checks(later) == [("gpu.flap.persistent", "3", True), ("gpu.flap", "3", True)]


def test_a_gpu_back_after_a_long_absence_is_not_a_flap() -> None:
    away = set(range(20, 22 + WINDOW_STEPS))
    _, found = gpus(range(30 + WINDOW_STEPS), without_3=away)
    assert checks(found) == [("gpu.missing", "3", False), ("gpu.missing", "3", True)]


def test_a_gpu_back_after_its_node_rebooted_is_not_a_flap() -> None:
    state, found = gpus(range(20), without_3={18, 19})  # gone, then the node goes quiet
    _, back = gpus(range(80, 90), set(), state)  # rebooted: every GPU back
    assert checks(found + back) == [("gpu.missing", "3", False), ("gpu.missing", "3", True)]


def test_a_tpu_chip_that_keeps_dropping_out_is_acted_on_for_the_slice() -> None:
    state: TpuSliceState | None = None
    found: list[Finding] = []
    for step in range(80):
        for host in range(4):
            gone = [9] if step in (20, 40, 60) and host == 2 else []
            state, out = detect_tpu(state, tpu_sample(step, host, missing=gone), SETTINGS)
            found += out
    assert [(f.check, f.entity.device, f.recommended_action) for f in unhealthy(found)] == [
        ("tpu.chip.flap", "9", "watch"),
        ("tpu.chip.flap.persistent", "9", "repair_slice"),
    ]
    assert unhealthy(found)[1].entity.target.kind == "slice"

