"""MIG as dcgm-exporter prints it: every field of a MIG-enabled GPU comes once per GPU instance
(labels GPU_I_ID, GPU_I_PROFILE and the instance's pod), GPU-wide fields (temperature, power,
ECC, XID, clocks, PCIe, NVLink) with the same value on each. They are one GPU reading, not one
per instance; the instance's own fields (DCGM_FI_PROF_*, its framebuffer) stay per instance.
Label sets from the dcgm-exporter README's MIG example and reference/data-shapes.md §1.6."""

from __future__ import annotations

import random
from typing import Any

from pipeline.model import GpuSample
from pipeline.sources.prometheus import parse_series
from pipeline.sources.prometheus_series import Identity

TS = 1764424800.0
A100 = {"gpu": "0", "UUID": "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f", "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": "gpu-node-1",
        "pci_bus_id": "00000000:07:00.0", "DCGM_FI_DRIVER_VERSION": "535.104.05"}  # fmt: skip
GPU_WIDE = {"DCGM_FI_DEV_GPU_TEMP": 34.0, "DCGM_FI_DEV_POWER_USAGE": 88.5,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0, "DCGM_FI_DEV_XID_ERRORS": 0.0,
            "DCGM_FI_DEV_SM_CLOCK": 1410.0}  # fmt: skip


def instance(gpu_i: str, profile: str, pod: str) -> dict[str, str]:
    return A100 | {"GPU_I_ID": gpu_i, "GPU_I_PROFILE": profile, "pod": pod, "namespace": "ml"}


def series(labels: dict[str, str], name: str, value: float) -> dict[str, Any]:
    return {"metric": {"__name__": name, **labels}, "values": [[TS, str(value)]]}


def exposition() -> list[dict[str, Any]]:
    """A100 0 in three instances (3g.20gb, 2g.10gb, 1g.5gb), each with the GPU-wide fields and
    its own activity and framebuffer."""
    out = []
    for gpu_i, profile, pod, active in (("1", "3g.20gb", "train-a", 0.9),
                                        ("5", "2g.10gb", "infer-b", 0.3),
                                        ("13", "1g.5gb", "", 0.0)):  # fmt: skip
        labels = instance(gpu_i, profile, pod)
        out += [series(labels, name, value) for name, value in GPU_WIDE.items()]
        out += [series(labels, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", active),
                series(labels, "DCGM_FI_DEV_FB_USED", 1000.0 * int(gpu_i))]  # fmt: skip
    return out


def readings(results: list[dict[str, Any]]) -> dict[str, tuple[str | None, dict[str, float]]]:
    parsed = parse_series(results, Identity("c1", "p1", "z1"))
    assert parsed.bad == []
    (sample,) = parsed.events
    assert isinstance(sample, GpuSample)
    return {g.device: (g.job, g.metrics) for g in sample.gpus}


def test_gpu_wide_fields_of_a_mig_gpu_are_one_reading() -> None:
    got = readings(exposition())
    assert got == {
        "0": (None, GPU_WIDE),  # once: one temperature, one DBE count, no job of its own
        "0/mig1": ("train-a", {"DCGM_FI_DEV_FB_USED": 1000.0,
                               "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9}),
        "0/mig5": ("infer-b", {"DCGM_FI_DEV_FB_USED": 5000.0,
                               "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.3}),
        "0/mig13": (None, {"DCGM_FI_DEV_FB_USED": 13000.0,
                           "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0}),
    }  # fmt: skip


def test_the_series_order_does_not_matter() -> None:
    results = exposition()
    want = readings(results)
    for seed in range(5):
        random.Random(seed).shuffle(results)
        assert readings(results) == want


def test_instances_that_disagree_give_the_lowest_instances_value() -> None:
    # a scrape that straddles an update: instance 5 already has the new temperature
    results = [series(instance("5", "2g.10gb", "b"), "DCGM_FI_DEV_GPU_TEMP", 36.0),
               series(instance("1", "3g.20gb", "a"), "DCGM_FI_DEV_GPU_TEMP", 35.0)]  # fmt: skip
    assert readings(results) == {"0": (None, {"DCGM_FI_DEV_GPU_TEMP": 35.0})}


def test_a_whole_gpus_series_and_its_instances_repeat_are_one_value() -> None:
    results = [series(A100, "DCGM_FI_DEV_GPU_TEMP", 40.0),
               series(instance("1", "3g.20gb", "a"), "DCGM_FI_DEV_GPU_TEMP", 41.0)]  # fmt: skip
    assert readings(results) == {"0": (None, {"DCGM_FI_DEV_GPU_TEMP": 40.0})}
