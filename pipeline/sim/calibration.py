"""How a simulated run compares with the fleet-level figures of the fault model.

- GPU fleets: job-interrupting hardware faults per 1000 node-days; the reference fleet "B"
  (Llama 3, H100) has 3.2 (GPU 2.42 + host 0.48 + fabric 0.32), times `fleet_multiplier`.
- TPU (fault model T5): share of slice-time lost to machine and ICI-cable faults (~6.5 % of
  cubes unavailable at any moment in a large pod) and share of slice-time spent on rerouted
  paths after OCS faults (< 2 % of jobs).

Pure functions of the ground truth: nothing here reads telemetry.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.sim.engine import Simulation
from pipeline.sim.faults import InjectedFault

REFERENCE_INTERRUPTIONS_PER_1K_NODE_DAYS = 3.2
# Rows of the reference total: hard GPU faults, host faults incl. unplanned maintenance, fabric.
INTERRUPTING = {
    "G1/lost",
    "G2/fatal",
    "G3/pcie",
    "G4/xid",
    "G5/hbm",
    "G6/sram",
    "G7/gsp",
    "G8/thermal",
    "G9/sdc",
    "N1/nic",
    "N2/host",
    "N3/operator",
    "F1/cable",
    "F1/tor",
}
G5_INTERRUPT_SHARE = 0.36  # Llama 3 HBM3: interrupting 3.4e-6 of 9.4e-6 events per GPU-h


def interruptions_per_1k_node_days(sim: Simulation) -> float:
    """Job-interrupting hardware faults per 1000 GPU-node-days of the run (one per event, a
    ToR switch counting once; G5 only when it interrupted the job)."""
    node_days = len(sim.fleet.gpu_nodes) * (sim.end_ms - sim.start_ms) / 86_400_000
    groups = {
        f.group
        for f in sim.ground_truth
        if f"{f.fault_type}/{f.variant}" in INTERRUPTING
        and (f.fault_type != "G5" or "job interrupted" in f.description)
    }
    return 1000 * len(groups) / node_days if node_days else 0.0


def tpu_shares(sim: Simulation) -> dict[str, float]:
    """Chip-weighted shares of slice-time: `unavailable` (a machine or ICI cable down until
    repaired, T1/T2) and `rerouted` (running on rerouted paths, T3/S6)."""
    span = sim.end_ms - sim.start_ms
    chips = {s.name: s.shape.chips for s in sim.fleet.slices}
    total = sum(chips.values()) * span
    if not total:
        return {"unavailable": 0.0, "rerouted": 0.0}
    down = _covered(sim, [f for f in sim.ground_truth if f.fault_type in ("T1", "T2")])
    rerouted = _covered(sim, [f for f in sim.ground_truth if f.fault_type in ("T3", "S6")])
    return {
        "unavailable": sum(chips[n] * ms for n, ms in down.items()) / total,
        "rerouted": sum(chips[n] * ms for n, ms in rerouted.items()) / total,
    }


def _covered(sim: Simulation, faults: Iterable[InjectedFault]) -> dict[str, int]:
    """Per slice, the milliseconds of the run covered by at least one of `faults`."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for fault in faults:
        lo, hi = max(fault.onset_ms, sim.start_ms), min(fault.end_ms, sim.end_ms)
        if hi > lo:
            spans.setdefault(fault.target.name, []).append((lo, hi))
    covered = {}
    for name, intervals in spans.items():
        total, reach = 0, sim.start_ms
        for lo, hi in sorted(intervals):
            if hi > reach:
                total += hi - max(lo, reach)
                reach = hi
        covered[name] = total
    return covered
