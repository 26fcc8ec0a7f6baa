"""What injected faults do to the fleet, written down before the run starts.

Three kinds of record, all with event-time timestamps:
- an `Effect` holds over an interval (a GPU missing, a clock factor, a counter growing at a rate,
  an ICI link's health), applied to every sample taken inside it;
- a `Change` happens once (a counter step, a gauge set, a node's counters reset by a reboot);
- an output event (XID line, node event, capacity event) is emitted as it is.
The generators in gpu.py and tpu.py read effects and changes; engine.py merges the events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.model import Event

# GPU effects: node = GPU node index, device = GPU index or -1 (every GPU of the node).
#   offline      the node does not report at all
#   missing      the GPU is absent from the node's scrape
#   speed        compute speed factor (the job waits on the slowest GPU); no clock signature
#   clock        SM clock factor; also slows compute and lowers power
#   power        power factor (power brake)
#   temp         degrees added to the temperature (warmer inlet air)
#   thermal_r    factor on the thermal resistance (a failing thermal interface): the GPU runs
#                hotter and, past its throttle temperature, the driver lowers its clocks
#   pcie_bw / nvlink_bw   factor on PCIe / NVLink traffic
#   throttle     CLOCK_THROTTLE_REASONS bits OR-ed in
#   link_gen / link_width  PCIe link generation / width capped at value
#   work         extra work on this node (workload straggler): value > 1
#   rate:<FIELD> the DCGM counter FIELD grows by value per second
#   fab_down / fab_missing / fab_errors  network port `device` (-1: every port) of the node
#                down, gone from the scrape, or logging `value` errors per second (fabric.py)
# Job effects: node = job index.
#   job_speed    the whole job runs at this factor (fabric slowness)
# TPU effects: node = slice index.
#   host_offline device = worker id
#   chip_speed   device = chip id or -1: TensorCore utilisation factor (duty cycle unchanged)
#   link_health  device = directed link index: health value (0 healthy .. 10 down)
#   link_flits   device = directed link index: flit rate factor
#   link_errors  device = directed link index: errors per second
EffectKind = Literal[
    "offline",
    "missing",
    "speed",
    "clock",
    "power",
    "temp",
    "thermal_r",
    "pcie_bw",
    "nvlink_bw",
    "throttle",
    "link_gen",
    "link_width",
    "work",
    "rate:DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "rate:DCGM_FI_DEV_THERMAL_VIOLATION",
    "rate:DCGM_FI_DEV_POWER_VIOLATION",
    "rate:DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "rate:DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "job_speed",
    "fab_down",
    "fab_missing",
    "fab_errors",
    "host_offline",
    "chip_speed",
    "link_health",
    "link_flits",
    "link_errors",
]
TPU_KINDS = frozenset({"host_offline", "chip_speed", "link_health", "link_flits", "link_errors"})
# Effects whose value is a factor (neutral 1.0); the others add to a neutral 0.
FACTOR_KINDS = frozenset(
    {
        "speed",
        "clock",
        "power",
        "pcie_bw",
        "nvlink_bw",
        "work",
        "job_speed",
        "chip_speed",
        "link_flits",
    }
)

# GPU changes: counter_add / gauge_set on `field`; reset = a reboot or GPU reset of the node
# (device -1) or one GPU: volatile counters back to zero, pending remaps applied.
# TPU changes: tpu_reset = a host reboot (node = slice, device = worker id).
# Fabric changes: fabric_add = node_exporter port counter `field` of port `device` steps.
ChangeKind = Literal["counter_add", "gauge_set", "reset", "tpu_reset", "fabric_add"]


@dataclass(frozen=True, slots=True)
class Effect:
    kind: EffectKind
    start_ms: int
    end_ms: int
    node: int
    device: int = -1
    value: float = 1.0
    ramp_ms: int = 0  # the effect grows linearly from neutral to `value` over this long

    def level(self, t_ms: int) -> float:
        neutral = 1.0 if self.kind in FACTOR_KINDS else 0.0
        if self.ramp_ms <= 0 or t_ms >= self.start_ms + self.ramp_ms:
            return self.value
        share = max(0.0, (t_ms - self.start_ms) / self.ramp_ms)
        return neutral + (self.value - neutral) * share


@dataclass(frozen=True, slots=True)
class Change:
    ts: int
    kind: ChangeKind
    node: int
    device: int = -1
    field: str = ""
    value: float = 0.0


@dataclass
class Timeline:
    """Everything the faults will do, in the order it was added (sorted by the engine)."""

    effects: list[Effect] = field(default_factory=list)
    changes: list[tuple[int, int, Change]] = field(default_factory=list)
    events: list[tuple[int, int, Event]] = field(default_factory=list)
    _seq: int = 0

    def effect(self, effect: Effect) -> None:
        if effect.end_ms > effect.start_ms:
            self.effects.append(effect)

    def change(self, change: Change) -> None:
        self._seq += 1
        self.changes.append((change.ts, self._seq, change))

    def event(self, ts: int, event: Event) -> None:
        self._seq += 1
        self.events.append((ts, self._seq, event))
