"""The fleet simulator: a synthetic GPU/TPU fleet with workloads, faults and ground truth.

    sim = Simulation(SimSettings(duration_s=600, intensity=500))
    sim.ground_truth            # every injected fault, known before streaming
    for event in sim.events():  # Gpu/Tpu/IciSample, XidEvent, NodeEvent, CapacityEvent
        consume(event)

Deterministic: the same settings (and forced faults) give byte-identical output. The stand-in
endpoints in `pipeline.sim.endpoints` serve these events the way the real sources would.
"""

from pipeline.sim.engine import SIGNATURES, Simulation
from pipeline.sim.faults import (
    CODES,
    FAULT_TYPES,
    FaultType,
    ForcedFault,
    InjectedFault,
    fault_type,
    parse_forced,
)
from pipeline.sim.output import produce_kafka, read_truth, truth_path, write_jsonl
from pipeline.wire.topics import record_key

__all__ = [
    "CODES",
    "FAULT_TYPES",
    "SIGNATURES",
    "FaultType",
    "ForcedFault",
    "InjectedFault",
    "Simulation",
    "fault_type",
    "parse_forced",
    "produce_kafka",
    "read_truth",
    "record_key",
    "truth_path",
    "write_jsonl",
]
