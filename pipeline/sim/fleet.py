"""The simulated fleet: clusters, zones, pools, racks, GPU nodes and TPU slices.

Everything is derived from the settings and the seed, never from the clock, so two runs with
the same settings describe the same fleet (names, UUIDs, PCI ids, driver versions).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipeline.catalog import chip_coords, host_of_chip, ici_neighbours, slice_shape
from pipeline.catalog.tpu import SliceShape
from pipeline.config import SimSettings
from pipeline.model import Target

GPUS_PER_NODE = 8
RACKS_PER_SU = 2  # racks per scalable unit (rail group) of a rail-optimised pool
REGIONS = ("us-central1", "us-east5", "europe-west4", "asia-southeast1")
# HGX H100/H200 baseboards put the eight GPUs on these PCI buses (DCGM form uses upper case).
PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# A100 SXM4 (DGX A100) buses.
PCI_BUSES_A100 = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
LOCAL_HOUR_OFFSET = {"us-central1": -6, "us-east5": -5, "europe-west4": 1, "asia-southeast1": 8}


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # DCGM modelName
    gke_accelerator: str
    tdp_w: float
    idle_w: float
    max_sm_mhz: float
    idle_sm_mhz: float
    mem_mhz: float
    fb_total_mib: float
    fb_reserved_mib: float
    hbm_gb: int
    pcie_gen: int
    temp_per_w: float  # steady-state degrees above the inlet per watt
    throttle_c: float  # the driver slows the clocks to keep the GPU at or below this [G]
    pci_buses: tuple[str, ...]
    drivers: tuple[str, ...]


GPU_MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel(
            key="h100",
            name="NVIDIA H100 80GB HBM3",
            gke_accelerator="nvidia-h100-80gb",
            tdp_w=700.0,
            idle_w=70.0,
            max_sm_mhz=1980.0,
            idle_sm_mhz=345.0,
            mem_mhz=2619.0,
            fb_total_mib=81559.0,
            fb_reserved_mib=527.0,
            hbm_gb=80,
            pcie_gen=5,
            temp_per_w=0.074,
            throttle_c=83.0,
            pci_buses=PCI_BUSES,
            drivers=("550.90.07", "535.183.01"),
        ),
        GpuModel(
            key="h200",
            name="NVIDIA H200",
            gke_accelerator="nvidia-h200-141gb",
            tdp_w=700.0,
            idle_w=75.0,
            max_sm_mhz=1980.0,
            idle_sm_mhz=345.0,
            mem_mhz=3201.0,
            fb_total_mib=143771.0,
            fb_reserved_mib=551.0,
            hbm_gb=141,
            pcie_gen=5,
            temp_per_w=0.072,
            throttle_c=83.0,
            pci_buses=PCI_BUSES,
            drivers=("560.35.03", "550.90.07"),
        ),
        GpuModel(
            key="a100",
            name="NVIDIA A100-SXM4-80GB",
            gke_accelerator="nvidia-a100-80gb",
            tdp_w=400.0,
            idle_w=55.0,
            max_sm_mhz=1410.0,
            idle_sm_mhz=210.0,
            mem_mhz=1593.0,
            fb_total_mib=81920.0,
            fb_reserved_mib=589.0,
            hbm_gb=80,
            pcie_gen=4,
            temp_per_w=0.098,
            throttle_c=80.0,
            pci_buses=PCI_BUSES_A100,
            drivers=("535.183.01", "525.147.05"),
        ),
    )
}

PoolKind = Literal["train", "serve"]
# (name suffix, model, workload kind); pools of a cluster cycle through these.
POOL_KINDS: tuple[tuple[str, str, PoolKind], ...] = (
    ("h100-train", "h100", "train"),
    ("h200-train", "h200", "train"),
    ("a100-serve", "a100", "serve"),
)


@dataclass(frozen=True, slots=True)
class GpuNode:
    index: int
    name: str
    cluster: str
    pool: str
    pool_kind: PoolKind
    zone: str
    region: str
    rack: int  # fleet-wide rack index (top-of-rack switch)
    model: GpuModel
    driver: str
    uuids: tuple[str, ...]
    pci_bus_ids: tuple[str, ...]  # DCGM form 00000000:18:00.0
    # Rail-optimised fabric (the pools of every second cluster): the node's scalable unit,
    # whose rail switch k takes NIC k of each of its nodes; None: one leaf switch per rack.
    rail_group: str | None = None

    def target(self) -> Target:
        return Target(
            cluster=self.cluster, kind="node", name=self.name, pool=self.pool, zone=self.zone
        )


@dataclass(frozen=True, slots=True)
class TpuHost:
    worker_id: int
    node: str
    chips: tuple[int, ...]  # chip ids (row-major over the topology) on this host


@dataclass(frozen=True, slots=True)
class TpuSlice:
    index: int
    name: str
    cluster: str
    pool: str
    zone: str
    region: str
    shape: SliceShape
    hosts: tuple[TpuHost, ...]
    coords: tuple[tuple[int, ...], ...]
    # directed ICI links (chip, port, peer), ordered by chip then port, and the index of the
    # same cable seen from the peer's end
    links: tuple[tuple[int, int, int], ...]
    reverse: tuple[int, ...]
    cubes: int  # OCS-connected 4x4x4 cubes (0 for 2D slices and 3D slices without wraparound)

    @property
    def accelerator_type(self) -> str:
        return self.shape.accelerator_type

    @property
    def topology(self) -> str:
        return self.shape.topology

    def target(self) -> Target:
        return Target(
            cluster=self.cluster, kind="slice", name=self.name, pool=self.pool, zone=self.zone
        )


@dataclass(frozen=True, slots=True)
class Fleet:
    gpu_nodes: tuple[GpuNode, ...]
    slices: tuple[TpuSlice, ...]
    zones: tuple[str, ...]
    racks: int

    def node_by_name(self, name: str) -> GpuNode | None:
        return next((node for node in self.gpu_nodes if node.name == name), None)

    def slice_by_name(self, name: str) -> TpuSlice | None:
        return next((s for s in self.slices if s.name == name), None)

    @property
    def drivers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(node.driver for node in self.gpu_nodes))


def build_fleet(settings: SimSettings) -> Fleet:
    rng = np.random.default_rng([settings.seed, 1])
    clusters = [_cluster(i) for i in range(settings.clusters)]
    pools = [(c, k) for c in range(settings.clusters) for k in range(len(POOL_KINDS))]
    nodes = _gpu_nodes(settings, clusters, pools, rng)
    slices = tuple(
        _slice(settings, i, clusters[i % len(clusters)]) for i in range(settings.tpu_slices)
    )
    zones = tuple(dict.fromkeys([n.zone for n in nodes] + [s.zone for s in slices]))
    racks = 1 + max((n.rack for n in nodes), default=-1)
    return Fleet(gpu_nodes=nodes, slices=slices, zones=zones, racks=racks)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _cluster(index: int) -> tuple[str, str]:
    region = REGIONS[index % len(REGIONS)]
    suffix = "" if index < len(REGIONS) else f"-{index // len(REGIONS)}"
    return f"fp-{region}{suffix}", region


def _gpu_nodes(
    settings: SimSettings,
    clusters: list[tuple[str, str]],
    pools: list[tuple[int, int]],
    rng: np.random.Generator,
) -> tuple[GpuNode, ...]:
    # Nodes fill pools in contiguous blocks, so racks and multi-node jobs stay inside a pool.
    sizes = [settings.gpu_nodes // len(pools)] * len(pools)
    for i in range(settings.gpu_nodes % len(pools)):
        sizes[i] += 1
    nodes: list[GpuNode] = []
    rack = 0
    for (cluster_index, kind_index), size in zip(pools, sizes, strict=True):
        cluster, region = clusters[cluster_index]
        suffix, model_key, kind = POOL_KINDS[kind_index]
        model = GPU_MODELS[model_key]
        zone = f"{region}-{'abc'[kind_index % 3]}"
        pool = suffix
        for j in range(size):
            if j and j % settings.nodes_per_rack == 0:
                rack += 1
            name = f"{cluster}-{pool}-{j:03d}"
            # A rolling upgrade leaves about a quarter of a pool on the older driver.
            driver = model.drivers[1] if rng.random() < 0.25 else model.drivers[0]
            unit = j // (settings.nodes_per_rack * RACKS_PER_SU)
            rails = f"{cluster}-{pool}-su{unit:02d}" if cluster_index % 2 else None
            nodes.append(
                GpuNode(
                    index=len(nodes),
                    name=name,
                    cluster=cluster,
                    pool=pool,
                    pool_kind=kind,
                    zone=zone,
                    region=region,
                    rack=rack,
                    model=model,
                    driver=driver,
                    uuids=tuple(_uuid(settings.seed, name, g) for g in range(GPUS_PER_NODE)),
                    pci_bus_ids=tuple(f"00000000:{bus}:00.0" for bus in model.pci_buses),
                    rail_group=rails,
                )
            )
        if size:
            rack += 1
    return tuple(nodes)


def _uuid(seed: int, node: str, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}/{node}/{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _slice(settings: SimSettings, index: int, cluster: tuple[str, str]) -> TpuSlice:
    accelerator_type, _, topology = settings.tpu_slice_types[
        index % len(settings.tpu_slice_types)
    ].partition(":")
    shape = slice_shape(accelerator_type, topology)
    name = f"{cluster[0]}-tpu-{accelerator_type}-{index:02d}"
    zone = f"{cluster[1]}-{'abc'[index % 3]}"
    owners = [host_of_chip(shape, chip) for chip in range(shape.chips)]
    hosts = tuple(
        TpuHost(
            worker_id=w,
            node=f"{name}-w{w}",
            chips=tuple(c for c in range(shape.chips) if owners[c] == w),
        )
        for w in range(shape.hosts)
    )
    links = tuple(
        (chip, port, peer)
        for chip in range(shape.chips)
        for port, peer in ici_neighbours(shape, chip)
    )
    position = {(chip, peer, port // 2): i for i, (chip, port, peer) in enumerate(links)}
    reverse = tuple(position[(peer, chip, port // 2)] for chip, port, peer in links)
    three_d = len(shape.dims) == 3 and all(shape.wraparound)
    return TpuSlice(
        index=index,
        name=name,
        cluster=cluster[0],
        pool=f"tpu-{accelerator_type}-{index:02d}",
        zone=zone,
        region=cluster[1],
        shape=shape,
        hosts=hosts,
        coords=tuple(chip_coords(shape)),
        links=links,
        reverse=reverse,
        cubes=shape.chips // 64 if three_d else 0,
    )
