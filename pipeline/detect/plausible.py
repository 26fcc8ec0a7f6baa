"""Values a working device cannot report are missing data, not evidence of a fault.

An exporter or ingest bug (every metric of a GPU read 0 for a quarter of an hour) or a scrape of
a half-initialised device reads values no working device reports: a PCIe link of width or
generation 0, an InfiniBand port state outside the enum, every metric of a GPU 0 at once. Read
as measurements they are a link downgrade on every GPU and a dead NIC on every node (both
fatal), in every node the bug touches. So before detection such values are taken out of the
record, as if the exporter had not reported them: the detectors judge what is left, the device
still counts as present (its absence would be a fault too), and the number screened out is
counted (`impossible_values` in the runtime's counts and on the worker's /metrics).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from pipeline.detect import gpu_metrics as gm
from pipeline.model import FabricPort, FabricSample, GpuReading, GpuSample

# A GPU reporting at least this many metrics, all 0: the exporter's, not the GPU's, reading
# (a working GPU is never at 0 degrees and 0 W with its clocks stopped).
ALL_ZERO_MIN_METRICS = 3
# PCIe link generation and width: 0 is no link at all, which a GPU answering NVML cannot have
NONZERO_GPU = (gm.PCIE_GEN, gm.PCIE_WIDTH)
# node_exporter's infiniband collector: state 1..4 (DOWN, INIT, ARMED, ACTIVE), physical state
# 1..7 (Sleep .. PhyTest; 5 LinkUp); netdev up 0 or 1
PORT_ENUMS: dict[str, frozenset[float]] = {
    "node_infiniband_state_id": frozenset({1.0, 2.0, 3.0, 4.0}),
    "node_infiniband_physical_state_id": frozenset({1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0}),
    "node_network_up": frozenset({0.0, 1.0}),
}


def _outside(allowed: frozenset[float]) -> Callable[[float], bool]:
    return lambda value: value not in allowed


def _is_zero(value: float) -> bool:
    return value == 0.0


_NO_LINK = dict.fromkeys(NONZERO_GPU, _is_zero)
_OFF_ENUM = {name: _outside(allowed) for name, allowed in PORT_ENUMS.items()}


def screen_gpu(sample: GpuSample) -> tuple[GpuSample, int]:
    """The sample without the values no working GPU reports, and how many there were. A GPU
    whose every metric reads 0 is left as it is, for the detector to pass over (`unread`): it is
    listed, so it is not missing, and none of its readings is judged."""
    gpus: list[GpuReading] = []
    impossible = 0
    for gpu in sample.gpus:
        if unread(gpu.metrics):
            impossible += len(gpu.metrics)
            gpus.append(gpu)
            continue
        kept = _without(gpu.metrics, _NO_LINK)
        impossible += len(gpu.metrics) - len(kept)
        gpus.append(gpu if kept is gpu.metrics else msgspec.structs.replace(gpu, metrics=kept))
    if not impossible:
        return sample, 0
    return msgspec.structs.replace(sample, gpus=gpus), impossible


def unread(metrics: dict[str, float]) -> bool:
    """Every metric of a GPU at 0: the exporter's reading, not the GPU's."""
    return len(metrics) >= ALL_ZERO_MIN_METRICS and all(v == 0.0 for v in metrics.values())


def screen_fabric(sample: FabricSample) -> tuple[FabricSample, int]:
    """The sample without port states outside their enums, and how many were taken out."""
    ports: list[FabricPort] = []
    impossible = 0
    for port in sample.ports:
        kept = _without(port.metrics, _OFF_ENUM)
        impossible += len(port.metrics) - len(kept)
        ports.append(port if kept is port.metrics else msgspec.structs.replace(port, metrics=kept))
    if not impossible:
        return sample, 0
    return msgspec.structs.replace(sample, ports=ports), impossible


def _without(
    metrics: dict[str, float], bad: Mapping[str, Callable[[float], bool]]
) -> dict[str, float]:
    """`metrics` itself when none of the metrics `bad` names has a bad value (nearly every
    sample: a few lookups, no copy), else a copy without those."""
    dropped = [name for name, is_bad in bad.items() if name in metrics and is_bad(metrics[name])]
    if not dropped:
        return metrics
    return {name: value for name, value in metrics.items() if name not in dropped}
