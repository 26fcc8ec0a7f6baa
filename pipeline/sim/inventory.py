"""The simulated fleet's inventory, as its owner would list it: what `fleetpulse simulate` writes
to inventory.jsonl (read back by pipeline/sources/inventory_file.py), what the simulator puts on
the inventory topic, and what the demo loads; the inventory, enforced by default, lists every
target a recording can remove."""

from __future__ import annotations

from pipeline.model import Inventory
from pipeline.sim.fabric import leaf_switch
from pipeline.sim.fleet import Fleet


def from_fleet(fleet: Fleet, ts: int) -> list[Inventory]:
    """Every GPU node and TPU slice of a simulated fleet, as its owner would list it (GPU
    nodes with their leaf switch or rail group, for fabric localisation)."""
    nodes = [
        Inventory(
            ts=ts,
            cluster=node.cluster,
            kind="node",
            name=node.name,
            pool=node.pool,
            zone=node.zone,
            accelerator=node.model.gke_accelerator,
            capacity=len(node.uuids),
            leaf_switch=leaf_switch(node),
            rail=node.rail_group,
            source="simulator",
        )
        for node in fleet.gpu_nodes
    ]
    slices = [
        Inventory(
            ts=ts,
            cluster=tpu.cluster,
            kind="slice",
            name=tpu.name,
            pool=tpu.pool,
            zone=tpu.zone,
            accelerator=tpu.accelerator_type,
            capacity=len(tpu.coords),
            source="simulator",
        )
        for tpu in fleet.slices
    ]
    return nodes + slices
