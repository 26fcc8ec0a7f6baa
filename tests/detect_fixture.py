"""Builders for the detector tests: GPU node scrapes, XID lines, TPU chip and ICI samples.

Shapes follow schemas/samples/*.json; values are those of a healthy busy H100 node unless a
test overrides them. Every builder is deterministic (noise comes from a seeded Random).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import msgspec

from pipeline.config import DetectSettings, Settings, load_settings
from pipeline.model import (
    Event,
    Finding,
    GpuReading,
    GpuSample,
    IciLink,
    IciSample,
    TpuChipReading,
    TpuSample,
    XidEvent,
)
from pipeline.sim import Simulation

T0 = 1_764_424_800_000
STEP_MS = 10_000
SETTINGS = DetectSettings()
DOWN_SETTINGS = DetectSettings(node_down_s=120)  # node.down on (needs announcements wired)

HEALTHY: dict[str, float] = {
    "DCGM_FI_DEV_GPU_TEMP": 62.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_POWER_USAGE": 640.0,
    "DCGM_FI_DEV_GPU_UTIL": 99.0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3.0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
    "DCGM_FI_DEV_PCIE_LINK_GEN": 5.0,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 0.0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0,
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": 0.0,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 8e9,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 7e9,
}

# A per-GPU change to the healthy metrics: (gpu index, step number) -> metric overrides.
Change = Callable[[int, int], dict[str, float]]


def no_change(gpu: int, step: int) -> dict[str, float]:
    return {}


def uuid(gpu: int) -> str:
    return f"GPU-0000000{gpu}-aaaa-bbbb-cccc-00000000000{gpu}"


def gpu_sample(
    step: int,
    change: Change = no_change,
    *,
    node: str = "n1",
    gpus: Iterable[int] = range(8),
    job: str | None = "job-a",
    seed: int = 0,
    jitter: bool = True,
) -> GpuSample:
    """The scrape of `node` at step `step` (ts = T0 + step * 10 s) with small noise."""
    rng = random.Random(seed * 1_000_003 + step)
    readings = []
    for gpu in gpus:
        metrics = dict(HEALTHY)
        if jitter:
            metrics["DCGM_FI_DEV_GPU_TEMP"] += gpu * 0.5 + round(rng.gauss(0, 0.5))
            metrics["DCGM_FI_DEV_SM_CLOCK"] -= 15 * rng.randrange(2)
            metrics["DCGM_FI_DEV_POWER_USAGE"] *= 1 + rng.gauss(0, 0.01)
        metrics.update(change(gpu, step))
        readings.append(
            GpuReading(
                index=gpu,
                uuid=uuid(gpu),
                pci_bus_id=f"00000000:{0x10 + gpu:02x}:00.0",
                model="NVIDIA H100 80GB HBM3",
                job=job,
                metrics=metrics,
            )
        )
    return GpuSample(
        ts=T0 + step * STEP_MS,
        cluster="c1",
        node=node,
        pool="p1",
        zone="z1",
        driver="580.105.08",
        gpus=readings,
    )


def xid(
    code: int,
    seconds: float,
    *,
    gpu: int | None = 0,
    job: str | None = "job-a",
    node: str = "n1",
    message: str = "",
) -> XidEvent:
    return XidEvent(
        ts=T0 + int(seconds * 1000),
        cluster="c1",
        node=node,
        pool="p1",
        zone="z1",
        pci_bus_id=f"0000:{0x10 + (gpu or 0):02x}:00",
        gpu_index=gpu,
        uuid=uuid(gpu) if gpu is not None else None,
        xid=code,
        pid=4242,
        process="python",
        job=job,
        message=message or f"NVRM: Xid (PCI:0000:10:00): {code}, pid=4242",
        source="kernel_log",
    )


def tpu_sample(
    step: int,
    host: int,
    duty: Callable[[int], float] = lambda chip: 97.0,
    *,
    chips_per_host: int = 4,
    missing: Iterable[int] = (),
    slice_name: str = "s1",
    job: str | None = "train-1",
) -> TpuSample:
    """Host `host` of a v5p slice (4 chips per host) reporting chips host*4 .. host*4+3."""
    gone = set(missing)
    chips = [
        TpuChipReading(
            chip_id=c,
            coords=[c % 4, c // 4, 0],
            job=job,
            metrics={"duty_cycle_pct": duty(c), "tensorcore_util": 0.6 * duty(c)},
        )
        for c in range(host * chips_per_host, (host + 1) * chips_per_host)
        if c not in gone
    ]
    return TpuSample(
        ts=T0 + step * STEP_MS,
        cluster="c1",
        node=f"{slice_name}-w{host}",
        pool="tp",
        zone="z1",
        slice=slice_name,
        accelerator_type="v5p-32",
        topology="4x4x1",
        worker_id=host,
        chips=chips,
    )


def ici_sample(
    step: int,
    host: str,
    links: list[tuple[int, int, int, int]],
    *,
    slice_name: str = "s1",
    flits: int | None = None,
) -> IciSample:
    """`links` are (chip, port, peer, health); flit counters grow 1e9 per step unless down."""
    count = flits if flits is not None else step * 1_000_000_000
    return IciSample(
        ts=T0 + step * STEP_MS,
        cluster="c1",
        node=host,
        pool="tp",
        zone="z1",
        slice=slice_name,
        links=[
            IciLink(
                chip_id=c,
                port=p,
                peer_chip_id=q,
                health=h,
                flits_tx=count if h < 10 else 0,
                flits_rx=count if h < 10 else 0,
                errors=0,
            )
            for c, p, q, h in links
        ],
    )


def unhealthy(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.healthy and f.check != "heartbeat"]


def checks(findings: Iterable[Finding]) -> list[tuple[str, str | None, bool]]:
    """(check, device, healthy) of every non-heartbeat finding, in order."""
    return [(f.check, f.entity.device, f.healthy) for f in findings if f.check != "heartbeat"]


def quiet_fleet(minutes: int) -> tuple[Settings, list[Event]]:
    """The default settings running the quiet 12-node GPU fleet of seed 3 (no random faults,
    the diurnal dip on) for `minutes`, and that fleet's events: the stream the scenario tests
    edit to inject a condition the simulator has no fault for."""
    base = load_settings(environ={})
    sim_settings = msgspec.structs.replace(
        base.sim, gpu_nodes=12, clusters=1, tpu_slices=0, duration_s=minutes * 60,
        random_faults=False, diurnal=True, seed=3,
    )  # fmt: skip
    return msgspec.structs.replace(base, sim=sim_settings), list(
        Simulation(sim_settings, []).events()
    )
