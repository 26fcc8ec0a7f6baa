"""Who a TPU host is: its slice identity, its chips in device order, and the worker inventory.

TPU endpoints speak in local terms: libtpu numbers the chips it drives 0..n-1 (device ordinal),
Cloud Monitoring's `tpu_worker` resource names a worker by project, location and `worker_id`
and no node at all (reference/data-shapes.md §3.1). A `TpuHost` is what turns those into the
slice-wide chip ids and node names of TpuSample; the inventory file maps `tpu_worker`s to hosts
(in a real fleet it is written from the TPU API's node list; the simulator writes its own).

Device ordinal n is the n-th chip of the host in ascending chip id (the catalog's row-major
chip ids and host blocks, pipeline.catalog.tpu).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import msgspec

from pipeline.catalog import chip_coords, host_of_chip, slice_shape
from pipeline.errors import SourceError
from pipeline.ids import stable_id
from pipeline.model import TpuChipReading, TpuSample


class TpuHost(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    node: str
    pool: str
    zone: str
    slice: str
    accelerator_type: str
    topology: str
    worker_id: int  # host index within the slice, as in TpuSample


class TpuWorker(TpuHost, frozen=True, kw_only=True):
    """A Cloud Monitoring `tpu_worker` (location = zone, instance_id = its worker_id label)."""

    instance_id: str


class TpuInventory(msgspec.Struct, frozen=True):
    workers: list[TpuWorker]


def host_chips(accelerator_type: str, topology: str, worker_id: int) -> list[tuple[int, list[int]]]:
    """(chip_id, coords) of the host's chips in device-ordinal order."""
    return [
        (chip, list(coords)) for chip, coords in _host_chips(accelerator_type, topology)[worker_id]
    ]


@functools.cache
def _host_chips(
    accelerator_type: str, topology: str
) -> dict[int, list[tuple[int, tuple[int, ...]]]]:
    shape = slice_shape(accelerator_type, topology)
    hosts: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for chip_id, coords in enumerate(chip_coords(shape)):
        hosts.setdefault(host_of_chip(shape, chip_id), []).append((chip_id, coords))
    return hosts


def tpu_sample(host: TpuHost, ts: int, chips: Mapping[int, dict[str, float]]) -> TpuSample:
    """One host's TpuSample from per-device metrics (device ordinal → chip id and coords)."""
    layout = host_chips(host.accelerator_type, host.topology, host.worker_id)
    readings = []
    for ordinal, metrics in sorted(chips.items()):
        if not 0 <= ordinal < len(layout):
            raise ValueError(f"device ordinal {ordinal}: the host has {len(layout)} chips")
        chip_id, coords = layout[ordinal]
        readings.append(TpuChipReading(chip_id=chip_id, coords=coords, metrics=metrics))
    return TpuSample(
        ts=ts,
        cluster=host.cluster,
        node=host.node,
        pool=host.pool,
        zone=host.zone,
        slice=host.slice,
        accelerator_type=host.accelerator_type,
        topology=host.topology,
        worker_id=host.worker_id,
        chips=readings,
    )


def worker_instance_id(host: TpuHost) -> str:
    """A stable GCE-instance-like numeric id for a simulated host (19 digits)."""
    digest = stable_id("tpu-worker", host.cluster, host.slice, host.worker_id)
    return str(10**18 + int(digest.rsplit("-", 1)[1], 16) % (9 * 10**18))


def load_inventory(path: Path) -> dict[tuple[str, str], TpuWorker]:
    """The inventory file as {(location, worker_id label): worker}."""
    try:
        inventory = msgspec.json.decode(path.read_bytes(), type=TpuInventory)
    except FileNotFoundError:
        raise SourceError(f"TPU inventory {path} does not exist") from None
    except msgspec.DecodeError as exc:
        raise SourceError(f"TPU inventory {path} is invalid: {exc}") from None
    return {(worker.zone, worker.instance_id): worker for worker in inventory.workers}


def save_inventory(path: Path, workers: list[TpuWorker]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(msgspec.json.encode(TpuInventory(workers)))
    tmp.replace(path)
