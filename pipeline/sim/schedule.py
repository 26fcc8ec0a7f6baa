"""When and where faults happen: Poisson arrivals per fault type over its units of exposure.

Each type's rate is per unit (a GPU, a node, a job, an ICI cable …) per hour, scaled by the
settings' knobs and by static per-unit multipliers (lemon and new nodes, heavy-tailed noise
offenders, per-GB HBM rates), capped per unit, and modulated in time by fleet-level episodes
(a hot zone, a driver regression wave) through thinning. Arrival times for every type are drawn
up front; the engine then walks them in time order, so a unit already taken out of service by
an earlier fault is skipped in favour of another one of the same type (the count is kept).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.config import SimSettings
from pipeline.sim.faults import FAULT_TYPES, FaultType, Unit
from pipeline.sim.fleet import GPUS_PER_NODE, Fleet
from pipeline.sim.workload import Workload

Array = npt.NDArray[Any]
HOUR_MS = 3_600_000
# How many GPU nodes one unit is worth, for the per-unit rate cap.
NODE_EQUIVALENT: dict[Unit, float] = {
    "gpu": 1 / GPUS_PER_NODE,
    "busy_gpu": 1 / GPUS_PER_NODE,
    "node": 1.0,
    "spot_node": 1.0,
    "rack": 4.0,
    "job": 4.0,
    "gpu_job": 4.0,
    "tpu_host": 0.5,
    "ici_cable": 0.1,
    "cube": 8.0,
    "chip": 1 / GPUS_PER_NODE,
    "slice": 4.0,
    "zone": 8.0,
    "driver": 8.0,
}
LEMON_SHARE = 0.012  # fault model H1: 1.2 % of nodes
NEW_NODE_SHARE = 0.05  # H3 [G]: share of nodes delivered in the last 14 days
INFANT_FACTOR = 5.0  # H3: hard-fault rates x5 for new nodes
OFFENDER_SHARE = 0.05  # H2: share of GPUs prone to noise at all
HOT_FACTOR = 1.5  # H5
DRIVER_WAVE_FACTOR = 100.0  # H4 on G7


@dataclass(frozen=True, slots=True)
class UnitRef:
    """One unit of exposure: `a` and `b` are indices whose meaning depends on the unit kind:
    gpu (node, gpu), node (node, -1), rack (rack, -1), job (job, -1), tpu_host (slice, worker),
    ici_cable (slice, directed link), cube (slice, -1), chip (slice, chip), slice (slice, -1),
    zone (zone index, -1), driver (driver index, -1)."""

    a: int
    b: int = -1


@dataclass
class Window:
    """A fleet-level episode that multiplies some rates for a while (H4, H5)."""

    start_ms: int
    end_ms: int
    zone: str | None  # H5: hardware rates of units in this zone
    driver: str | None  # H4: G7 on GPUs with this driver
    factor: float


@dataclass
class Heterogeneity:
    """Static per-node and per-GPU multipliers (fault model H1-H3, H2)."""

    lemon: Array  # [nodes] hard-fault multiplier, 1 for ordinary nodes
    new: Array  # [nodes] bool
    offender: Array  # [nodes, 8] noise multiplier, mean 1, heavy-tailed

    @property
    def hardware(self) -> Array:
        """Per-node hardware-rate multiplier, normalised to a fleet mean of 1: the reference
        rates are fleet averages that already include lemons and new nodes, so these only
        redistribute the faults, they do not add any."""
        raw = self.lemon * np.where(self.new, INFANT_FACTOR, 1.0)
        normalised: Array = raw / raw.mean() if raw.size else raw
        return normalised

    @classmethod
    def draw(cls, fleet: Fleet, seed: int, enabled: bool) -> Heterogeneity:
        n = len(fleet.gpu_nodes)
        rng = np.random.default_rng([seed, 3])
        lemon = np.where(rng.random(n) < LEMON_SHARE, rng.uniform(10, 20, n), 1.0)
        new = rng.random(n) < NEW_NODE_SHARE
        # H2: only ~5 % of GPUs ever show SBEs (Delta), and among those the counts are
        # heavy-tailed (log-normal, sigma 2): a handful of GPUs carry most of the noise.
        shape = (n, GPUS_PER_NODE)
        susceptible = rng.random(shape) < OFFENDER_SHARE
        offender = np.where(susceptible, np.exp(rng.normal(0.0, 2.0, shape)), 0.01)
        offender = offender / offender.mean() if offender.size else offender
        if not enabled:
            return cls(np.ones(n), np.zeros(n, dtype=bool), np.ones((n, GPUS_PER_NODE)))
        return cls(lemon, new, offender)


@dataclass
class Exposure:
    units: list[UnitRef]
    weight: Array  # static multiplier per unit
    zone: list[str]  # where each unit is (for H5)
    driver: list[str | None]  # GPU units' driver (for H4)


@dataclass
class Arrival:
    ts: int
    ftype: FaultType
    order: int  # tie-break: position in FAULT_TYPES, then draw order
    seq: int = 0


@dataclass
class Rates:
    """Per-unit rates of one fault type, and how fleet-level windows change them.

    Knobs above 1 (`boost`) raise a unit's natural rate up to `cap` but never lower it: a unit
    whose natural rate is already above the cap (a heavy-tailed noise offender) keeps it.
    """

    ftype: FaultType
    exposure: Exposure
    natural: Array  # per unit per hour: reference rate x static multipliers
    boost: float
    cap: float
    windows: list[Window] = field(default_factory=list)

    def rate_at(self, unit: int, t_ms: int) -> float:
        factor = 1.0
        for w in self.windows:
            if w.start_ms <= t_ms < w.end_ms and self._touches(w, unit):
                factor *= w.factor
        return float(self._boosted(self.natural[unit] * factor))

    def max_rates(self) -> Array:
        factor = np.ones(len(self.exposure.units))
        for w in self.windows:
            touched = np.asarray([self._touches(w, u) for u in range(len(factor))], dtype=bool)
            factor = np.where(touched, factor * w.factor, factor)
        rates: Array = self._boosted(self.natural * factor)
        return rates

    def _boosted(self, natural: Any) -> Any:
        if self.boost <= 1.0:  # turning a knob down scales every unit down, cap or not
            return natural * self.boost
        return np.maximum(natural, np.minimum(natural * self.boost, self.cap))

    def expected_count(self, start_ms: int, end_ms: int) -> float:
        """Expected arrivals over [start, end), integrating the windows exactly."""
        edges = sorted(
            {start_ms, end_ms}
            | {min(max(t, start_ms), end_ms) for w in self.windows for t in (w.start_ms, w.end_ms)}
        )
        total = 0.0
        for lo, hi in itertools.pairwise(edges):
            rates = [self.rate_at(u, lo) for u in range(len(self.exposure.units))]
            total += sum(rates) * (hi - lo) / HOUR_MS
        return total

    def _touches(self, w: Window, unit: int) -> bool:
        if w.zone is not None:
            return self.ftype.scale == "hardware" and self.exposure.zone[unit] == w.zone
        return self.ftype.code == "G7" and self.exposure.driver[unit] == w.driver


def scale_factor(ftype: FaultType, settings: SimSettings) -> float:
    if ftype.scale == "hardware":
        return settings.fleet_multiplier * settings.intensity
    if ftype.scale == "software":
        return settings.intensity
    if ftype.scale == "noise":
        return settings.fleet_multiplier * settings.noise_intensity
    return 1.0


def rates_for(
    ftype: FaultType,
    fleet: Fleet,
    workload: Workload,
    hetero: Heterogeneity,
    settings: SimSettings,
    windows: list[Window],
) -> Rates:
    exposure = exposure_for(ftype, fleet, workload, hetero)
    natural = ftype.rate_per_h * exposure.weight
    cap = settings.max_rate_per_node_h * NODE_EQUIVALENT[ftype.unit]
    relevant = [
        w
        for w in windows
        if (w.zone is not None and ftype.scale == "hardware")
        or (w.driver is not None and ftype.code == "G7")
    ]
    return Rates(
        ftype=ftype,
        exposure=exposure,
        natural=natural,
        boost=scale_factor(ftype, settings),
        cap=cap,
        windows=relevant,
    )


def draw_arrivals(rates: Rates, start_ms: int, end_ms: int, rng: np.random.Generator) -> list[int]:
    """Candidate arrival times at the maximum rate; thinning happens when a unit is chosen."""
    total = float(rates.max_rates().sum())
    if total <= 0:
        return []
    count = int(rng.poisson(total * (end_ms - start_ms) / HOUR_MS))
    return sorted(int(t) for t in rng.integers(start_ms, end_ms, count))


def exposure_for(
    ftype: FaultType, fleet: Fleet, workload: Workload, hetero: Heterogeneity
) -> Exposure:
    unit = ftype.unit
    nodes = fleet.gpu_nodes
    if unit in ("gpu", "busy_gpu"):
        busy = {n for n in range(len(nodes)) if workload.job_at(n, workload.start_ms) >= 0}
        refs = [
            UnitRef(n.index, g)
            for n in nodes
            for g in range(GPUS_PER_NODE)
            if unit == "gpu" or n.index in busy
        ]
        weight = np.asarray([_gpu_weight(ftype, fleet, hetero, r) for r in refs])
        return Exposure(
            refs, weight, [nodes[r.a].zone for r in refs], [nodes[r.a].driver for r in refs]
        )
    if unit in ("node", "spot_node"):
        chosen = [n for n in nodes if unit == "node" or n.pool_kind == "serve"]
        weight = np.asarray([_node_weight(ftype, hetero, n.index) for n in chosen])
        return Exposure(
            [UnitRef(n.index) for n in chosen],
            weight,
            [n.zone for n in chosen],
            [n.driver for n in chosen],
        )
    if unit == "rack":
        zones = {n.rack: n.zone for n in nodes}
        return _plain(
            [UnitRef(r) for r in range(fleet.racks)], [zones.get(r, "") for r in range(fleet.racks)]
        )
    if unit in ("job", "gpu_job"):
        jobs = [j for j in workload.jobs if j.kind == "train" and (unit == "job" or j.multi_node)]
        return _plain(
            [UnitRef(j.index) for j in jobs],
            [_job_zone(fleet, j.platform, j.members) for j in jobs],
        )
    return _tpu_exposure(unit, fleet)


def _tpu_exposure(unit: Unit, fleet: Fleet) -> Exposure:
    slices = fleet.slices
    if unit == "tpu_host":
        refs = [UnitRef(s.index, h.worker_id) for s in slices for h in s.hosts]
    elif unit == "ici_cable":
        refs = [
            UnitRef(s.index, i) for s in slices for i in range(len(s.links)) if i < s.reverse[i]
        ]
    elif unit == "cube":
        refs = [UnitRef(s.index) for s in slices if s.cubes]
        zones = [slices[r.a].zone for r in refs]
        weight = np.asarray([float(slices[r.a].cubes) for r in refs])
        return Exposure(refs, weight, zones, [None] * len(refs))
    elif unit == "chip":
        refs = [UnitRef(s.index, c) for s in slices for c in range(s.shape.chips)]
    elif unit == "slice":
        refs = [UnitRef(s.index) for s in slices]
    elif unit == "zone":
        return _plain([UnitRef(i) for i in range(len(fleet.zones))], list(fleet.zones))
    else:  # driver
        return _plain([UnitRef(i) for i in range(len(fleet.drivers))], [""] * len(fleet.drivers))
    return _plain(refs, [slices[r.a].zone for r in refs])


def _plain(refs: list[UnitRef], zones: list[str]) -> Exposure:
    return Exposure(refs, np.ones(len(refs)), zones, [None] * len(refs))


def _job_zone(fleet: Fleet, platform: str, members: tuple[int, ...]) -> str:
    if platform == "tpu":
        return fleet.slices[members[0]].zone
    return fleet.gpu_nodes[members[0]].zone


def _node_weight(ftype: FaultType, hetero: Heterogeneity, node: int) -> float:
    if ftype.scale != "hardware":
        return 1.0
    return float(hetero.hardware[node])


def _gpu_weight(ftype: FaultType, fleet: Fleet, hetero: Heterogeneity, ref: UnitRef) -> float:
    model = fleet.gpu_nodes[ref.a].model
    weight = 1.0
    if ftype.code == "G5":  # per-GB HBM rates: H100 1.17e-7/GB-h, A100 8.8e-8/GB-h (Delta)
        per_gb = 8.8e-8 if model.key == "a100" else 1.17e-7
        weight = per_gb * model.hbm_gb / ftype.rate_per_h
    elif ftype.key == "G2/burst":  # A100 2e-4 per GPU-h; Hopper ~0 (GH200 saw none) [G 1 %]
        weight = 1.0 if model.key == "a100" else 0.01
    if ftype.scale == "hardware":
        weight *= _node_weight(ftype, hetero, ref.a)
    elif ftype.scale == "noise":
        lemon_noise = 10.0 if hetero.lemon[ref.a] > 1 else 1.0  # H1: XID noise x10 on lemons
        weight *= lemon_noise * float(hetero.offender[ref.a, ref.b])
    return weight


def random_types() -> list[FaultType]:
    """Types drawn at random rates (prevalence-only and fleet-level-property types excluded)."""
    return [ft for ft in FAULT_TYPES if ft.rate_per_h > 0]
