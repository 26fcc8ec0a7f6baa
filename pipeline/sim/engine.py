"""The simulation: fleet + workload + scheduled faults → events in event-time order.

Everything a fault will do is decided when the Simulation is built, so `ground_truth` is
complete before the first event is read. Streaming then walks the ticks: at each tick time
the due telemetry (GPU scrapes, TPU chip and ICI samples, quota readings) comes first, then
the discrete events (XIDs, node and capacity events) stamped before the next tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pipeline.config import SimSettings
from pipeline.model import Event
from pipeline.sim import signatures_gpu as gpu_sig
from pipeline.sim import signatures_job as job_sig
from pipeline.sim import signatures_tpu as tpu_sig
from pipeline.sim.capacity import CapacitySignals, schedule_background
from pipeline.sim.effects import TPU_KINDS, Change
from pipeline.sim.fabric import FABRIC_EFFECTS, FabricTelemetry
from pipeline.sim.faults import (
    CODES,
    FAULT_TYPE_BY_KEY,
    FAULT_TYPES,
    FaultType,
    ForcedFault,
    InjectedFault,
    fault_type,
)
from pipeline.sim.fleet import Fleet, build_fleet
from pipeline.sim.gpu import GpuTelemetry
from pipeline.sim.inject import Injector, Placement
from pipeline.sim.inventory import from_fleet
from pipeline.sim.schedule import (
    Heterogeneity,
    Rates,
    UnitRef,
    draw_arrivals,
    random_types,
    rates_for,
)
from pipeline.sim.tpu import TpuTelemetry
from pipeline.sim.workload import RUN, Workload

Signature = Callable[[Injector, Placement], int]
SIGNATURES: dict[str, Signature] = {
    "G1/lost": gpu_sig.g1_lost,
    "G1/flap": gpu_sig.g1_flap,
    "G2/fatal": gpu_sig.g2_nvlink_fatal,
    "G2/burst": gpu_sig.g2_nvlink_burst,
    "G3/pcie": gpu_sig.g3_pcie,
    "G4/xid": gpu_sig.g4_hardware_xid,
    "G5/hbm": gpu_sig.g5_hbm,
    "G6/sram": gpu_sig.g6_sram,
    "G7/gsp": gpu_sig.g7_gsp,
    "G8/thermal": gpu_sig.g8_thermal,
    "G9/sdc": gpu_sig.g9_sdc,
    "G10/xid31": gpu_sig.g10_noise,
    "G10/sbe": gpu_sig.g10_noise,
    "G10/remap": gpu_sig.g10_noise,
    "N1/nic": gpu_sig.n1_nic,
    "N2/host": gpu_sig.n2_host,
    "N3/operator": gpu_sig.n3_operator,
    "N3/cloud": gpu_sig.n3_cloud,
    "N3/cloud_slice": tpu_sig.n3_cloud_slice,
    "F1/cable": gpu_sig.f1_cable,
    "F1/tor": gpu_sig.f1_tor,
    "F2/flap": gpu_sig.f2_flap,
    "F3/gray": gpu_sig.f3_gray,
    "J1/crash": job_sig.j1_crash,
    "J2/nccl": job_sig.j2_nccl,
    "J3/user_xid": job_sig.j3_user_xid,
    "J4/restart": job_sig.j4_restart,
    "S1/failslow": gpu_sig.s1_failslow,
    "S2/comm": job_sig.s2_comm,
    "S3/compute": job_sig.s3_compute,
    "S4/workload": job_sig.s4_workload,
    "S5/diurnal": job_sig.s5_diurnal,
    "S6/reroute": tpu_sig.s6_reroute,
    "H1/lemon": job_sig.h1_lemon,
    "H2/offender": job_sig.h2_offender,
    "H3/infant": job_sig.h3_infant,
    "H4/driver_wave": job_sig.h4_driver_wave,
    "H5/hot": job_sig.h5_hot,
    "T1/host": tpu_sig.t1_host,
    "T2/ici": tpu_sig.t2_ici,
    "T3/ocs": tpu_sig.t3_ocs,
    "T4/sdc": tpu_sig.t4_sdc,
    "C1/preempt": gpu_sig.c1_preempt,
}
# fleet-level episodes: scheduled first, they modulate other rates
EPISODE_CODES = ("H4", "H5")
# drawn with the fleet, not injectable (S4 may be forced on a job)
PROPERTY_CODES = ("H1", "H2", "H3", "S5")
EXCLUSIVE_KLASSES = ("hard", "gray", "planned")
# An OCS sits outside the slice: its failure leaves the slice usable for other faults.
NON_EXCLUSIVE_CODES = ("T3",)


class Simulation:
    """A deterministic synthetic fleet. Same settings and faults → identical events and truth.

    `faults` are injected on purpose in addition to (or, with `settings.random_faults=False`,
    instead of) the random ones.
    """

    def __init__(self, settings: SimSettings, faults: Sequence[ForcedFault] = ()) -> None:
        unknown = [t for t in settings.fault_types if t not in CODES and t not in FAULT_TYPE_BY_KEY]
        if unknown:
            raise ValueError(f"unknown fault types {unknown}; known: {sorted(FAULT_TYPE_BY_KEY)}")
        self.settings = settings
        intervals = [
            settings.gpu_interval_s,
            settings.tpu_interval_s,
            settings.ici_interval_s,
            settings.capacity_interval_s,
        ]
        self.step_s = math.gcd(*intervals)
        self.n_ticks = max(1, settings.duration_s // self.step_s)
        self.start_ms = settings.start_ms
        self.end_ms = self.start_ms + self.n_ticks * self.step_s * 1000
        self.fleet: Fleet = build_fleet(settings)
        self.workload = Workload(self.fleet, settings.seed, self.start_ms, self.end_ms)
        self.hetero = Heterogeneity.draw(self.fleet, settings.seed, settings.random_faults)
        self._ctx = Injector(settings, self.fleet, self.workload, self.hetero, self.end_ms)
        self.rates: dict[str, Rates] = {}
        _inject(self, self._ctx, list(faults))
        schedule_background(self._ctx)
        self.ground_truth: list[InjectedFault] = sorted(
            self._ctx.truth, key=lambda f: (f.onset_ms, f.fault_id)
        )

    @property
    def node_days(self) -> float:
        """GPU nodes plus TPU hosts, times the run length in days (the scorer's denominator)."""
        hosts = sum(len(s.hosts) for s in self.fleet.slices)
        return (len(self.fleet.gpu_nodes) + hosts) * (self.end_ms - self.start_ms) / 86_400_000

    def ticks(self) -> Iterator[list[Event]]:
        """Events grouped per tick: the tick's samples first, then the discrete events stamped
        before the next tick; timestamps never decrease."""
        settings, step_ms = self.settings, self.step_s * 1000
        timeline = self._ctx.timeline
        gpu_effects = [
            e for e in timeline.effects if e.kind not in TPU_KINDS and e.kind not in FABRIC_EFFECTS
        ]
        tpu_effects = [e for e in timeline.effects if e.kind in TPU_KINDS]
        changes = [c for _, _, c in sorted(timeline.changes, key=lambda x: (x[0], x[1]))]
        gpu = GpuTelemetry(
            self.fleet,
            self.workload,
            gpu_effects,
            [c for c in changes if c.kind not in ("tpu_reset", "fabric_add")],
            settings.seed,
            settings.gpu_interval_s,
            settings.diurnal,
        )
        tpu = TpuTelemetry(
            self.fleet,
            self.workload,
            tpu_effects,
            _tpu_changes(changes),
            settings.seed,
            settings.diurnal,
        )
        fabric = FabricTelemetry(self.fleet, timeline.effects, changes, settings.seed)
        quotas = CapacitySignals(self.fleet, settings)
        events = [
            (ts, seq, e)
            for ts, seq, e in sorted(timeline.events, key=lambda x: (x[0], x[1]))
            if self.start_ms <= ts < self.end_ms
        ]
        next_event = 0
        for k in range(self.n_ticks):
            offset_s = k * self.step_s
            t = self.start_ms + offset_s * 1000
            out: list[Event] = []
            if k == 0:  # the owner's inventory: each node's leaf switch, for localisation
                out.extend(from_fleet(self.fleet, t))
            if offset_s % settings.gpu_interval_s == 0:
                out.extend(gpu.tick(t))
            tpu_due = offset_s % settings.tpu_interval_s == 0
            ici_due = offset_s % settings.ici_interval_s == 0
            if tpu_due or ici_due:
                tpu.advance(t)
                if tpu_due:
                    out.extend(tpu.chip_samples(t))
                if ici_due:
                    out.extend(tpu.ici_samples(t))
            if offset_s % settings.gpu_interval_s == 0:  # node_exporter, scraped with DCGM
                out.extend(fabric.tick(t))
            if offset_s % settings.capacity_interval_s == 0:
                out.extend(quotas.tick(t, gpu.node_job.tolist(), settings.capacity_interval_s))
            while next_event < len(events) and events[next_event][0] < t + step_ms:
                out.append(events[next_event][2])
                next_event += 1
            yield out

    def events(self) -> Iterator[Event]:
        """Every telemetry sample, XID, node and capacity event, in nondecreasing ts order."""
        for tick in self.ticks():
            yield from tick


def _tpu_changes(changes: list[Change]) -> list[Change]:
    return [c for c in changes if c.kind == "tpu_reset"]


def _inject(sim: Simulation, ctx: Injector, forced: list[ForcedFault]) -> None:
    settings = sim.settings
    rng = np.random.default_rng([settings.seed, 5])
    if settings.random_faults:
        for placement in job_sig.fleet_properties(ctx):
            if _wanted(settings, placement.ftype):
                SIGNATURES[placement.ftype.key](ctx, placement)
    elif settings.diurnal:
        placement = Placement(fault_type("S5"), ctx.start_ms, UnitRef(0))
        SIGNATURES["S5/diurnal"](ctx, placement)
    drawn = [ft for ft in random_types() if _wanted(settings, ft)]
    episodes = [ft for ft in drawn if ft.code in EPISODE_CODES]
    others = [ft for ft in drawn if ft.code not in EPISODE_CODES]
    _run_types(sim, ctx, episodes, [f for f in forced if f.fault_type in EPISODE_CODES], rng)
    _run_types(sim, ctx, others, [f for f in forced if f.fault_type not in EPISODE_CODES], rng)


def _wanted(settings: SimSettings, ftype: FaultType) -> bool:
    only = settings.fault_types
    return not only or ftype.code in only or ftype.key in only


def _run_types(
    sim: Simulation,
    ctx: Injector,
    types: list[FaultType],
    forced: list[ForcedFault],
    rng: np.random.Generator,
) -> None:
    """Draw arrivals for `types` (and place `forced` faults), then run them in time order."""
    arrivals: list[tuple[int, int, int, FaultType, ForcedFault | None]] = []
    for ftype in types:
        rates = rates_for(ftype, sim.fleet, sim.workload, sim.hetero, sim.settings, ctx.windows)
        sim.rates[ftype.key] = rates
        if sim.settings.random_faults:
            # each type draws from its own stream: leaving one type out changes no other
            order = FAULT_TYPES.index(ftype)
            stream = np.random.default_rng([sim.settings.seed, 6, order])
            for i, ts in enumerate(draw_arrivals(rates, ctx.start_ms, _faults_end(ctx), stream)):
                arrivals.append((ts, order, i, ftype, None))
    for i, spec in enumerate(forced):
        ftype = fault_type(spec.fault_type, spec.variant)
        if ftype.key not in sim.rates:
            sim.rates[ftype.key] = rates_for(
                ftype, sim.fleet, sim.workload, sim.hetero, sim.settings, ctx.windows
            )
        ts = ctx.start_ms + int(spec.at_s * 1000)
        arrivals.append((ts, -1, i, ftype, spec))
    arrivals.sort(key=lambda a: (a[0], a[1], a[2]))
    for seq, (ts, _, _, ftype, wanted) in enumerate(arrivals):
        placement = (
            _forced_placement(sim, ctx, ftype, ts, wanted, seq)
            if wanted is not None
            else _random_placement(sim, ctx, ftype, ts, rng, seq)
        )
        if placement is None:
            continue
        until = SIGNATURES[ftype.key](ctx, placement)
        _occupy(sim, ctx, placement, until)


def _faults_end(ctx: Injector) -> int:
    """Random faults begin before this (`faults_for_s`: a quiet tail after it)."""
    window_s = ctx.settings.faults_for_s
    return min(ctx.end_ms, ctx.start_ms + window_s * 1000) if window_s else ctx.end_ms


def _owner(sim: Simulation, ftype: FaultType, unit: UnitRef) -> tuple[str, int] | None:
    kind = ftype.unit
    if kind in ("gpu", "busy_gpu", "node", "spot_node"):
        return ("node", unit.a)
    if kind in ("job", "gpu_job"):
        return ("job", unit.a)
    if kind in ("tpu_host", "ici_cable", "cube", "chip", "slice"):
        return ("slice", unit.a)
    return None


def _exclusive(ftype: FaultType) -> bool:
    if ftype.code in NON_EXCLUSIVE_CODES:
        return False
    return (
        ftype.klass in EXCLUSIVE_KLASSES or ftype.code == "F2" or ftype.unit in ("job", "gpu_job")
    )


def _busy(ctx: Injector, owner: tuple[str, int], ts: int) -> bool:
    table = {"node": ctx.busy_node, "slice": ctx.busy_slice, "job": ctx.busy_job}[owner[0]]
    return table.get(owner[1], -1) > ts


def _available(sim: Simulation, ctx: Injector, ftype: FaultType, unit: UnitRef, ts: int) -> bool:
    job_gone = ftype.unit in ("job", "gpu_job") and (
        sim.workload.state_at(unit.a, ts) != RUN or not sim.workload.members_at(unit.a, ts)
    )
    if job_gone:
        return False
    if ftype.unit == "rack":
        return not any(
            _busy(ctx, ("node", n.index), ts) for n in sim.fleet.gpu_nodes if n.rack == unit.a
        )
    owner = _owner(sim, ftype, unit)
    if owner is None or owner[0] == "job":
        return owner is None or not _exclusive(ftype) or not _busy(ctx, owner, ts)
    # A node or slice taken out by an earlier fault gets no new one, not even noise: a host
    # that is down or being repaired writes no kernel log.
    return not _busy(ctx, owner, ts)


def _random_placement(
    sim: Simulation, ctx: Injector, ftype: FaultType, ts: int, rng: np.random.Generator, seq: int
) -> Placement | None:
    rates = sim.rates[ftype.key]
    units = rates.exposure.units
    weights = rates.max_rates()
    free = np.asarray([_available(sim, ctx, ftype, u, ts) for u in units], dtype=bool)
    weights = np.where(free, weights, 0.0)
    total = float(weights.sum())
    if total <= 0:
        return None
    index = int(rng.choice(len(units), p=weights / total))
    # thinning: the unit's rate now, against the bound the arrival was drawn with
    if rng.random() * weights[index] > rates.rate_at(index, ts):
        return None
    return Placement(ftype, ts, units[index], seq=seq)


def _forced_placement(
    sim: Simulation, ctx: Injector, ftype: FaultType, ts: int, spec: ForcedFault, seq: int
) -> Placement:
    if ftype.code in PROPERTY_CODES:
        raise ValueError(
            f"{ftype.key} is a property of the fleet drawn at creation, not an event to inject"
        )
    if not ctx.start_ms <= ts < ctx.end_ms:
        span = (ctx.end_ms - ctx.start_ms) // 1000
        raise ValueError(f"forced {ftype.key} at {spec.at_s} s lies outside the run (0-{span} s)")
    unit = _resolve_unit(sim, ftype, spec, ts)
    duration = int(spec.duration_s * 1000) if spec.duration_s is not None else None
    return Placement(ftype, ts, unit, forced=True, duration_ms=duration, seq=seq)


def _resolve_unit(sim: Simulation, ftype: FaultType, spec: ForcedFault, ts: int) -> UnitRef:
    """Where a forced fault lands: the named node, slice, job, zone or driver, or the first
    eligible unit of its kind."""
    kind, name, device = ftype.unit, spec.target, spec.device
    fleet, workload = sim.fleet, sim.workload
    if kind in ("job", "gpu_job"):
        return UnitRef(_resolve_job(sim, ftype, name, ts))
    if kind in ("zone", "driver"):
        values = list(fleet.zones if kind == "zone" else fleet.drivers)
        node = fleet.node_by_name(name) if name else None
        key = (node.zone if kind == "zone" else node.driver) if node else name
        return UnitRef(values.index(key) if key in values else 0)
    if kind in ("tpu_host", "ici_cable", "cube", "chip", "slice"):
        candidates = [s for s in fleet.slices if kind != "cube" or s.cubes]
        chosen = next((s for s in candidates if s.name == name), None) if name else None
        if chosen is None and name:
            raise ValueError(f"forced {ftype.key}: no eligible TPU slice named {name!r}")
        if chosen is None:
            if not candidates:
                raise ValueError(f"forced {ftype.key}: the fleet has no eligible TPU slice")
            chosen = candidates[0]
        return UnitRef(
            chosen.index, device if device is not None else (0 if kind != "slice" else -1)
        )
    node = fleet.node_by_name(name) if name else None
    if name and node is None:
        raise ValueError(f"forced {ftype.key}: no GPU node named {name!r}")
    if node is None:
        eligible = [
            n
            for n in fleet.gpu_nodes
            if (kind != "spot_node" or n.pool_kind == "serve")
            and (kind not in ("busy_gpu",) or workload.job_at(n.index, ts) >= 0)
        ]
        if not eligible:
            raise ValueError(f"forced {ftype.key}: the fleet has no eligible GPU node")
        # Prefer a node of a multi-node training job, where a fault shows its full effect.
        node = min(eligible, key=lambda n: _placement_preference(workload, n.index, ts))
    if kind == "rack":
        return UnitRef(node.rack)
    if kind in ("gpu", "busy_gpu"):
        return UnitRef(node.index, device if device is not None else 0)
    return UnitRef(node.index, device if device is not None else -1)


def _placement_preference(workload: Workload, node: int, ts: int) -> int:
    job = workload.job_at(node, ts)
    if job < 0:
        return 2
    return 0 if workload.jobs[job].multi_node else 1


def _resolve_job(sim: Simulation, ftype: FaultType, name: str | None, ts: int) -> int:
    workload = sim.workload
    eligible = [
        j for j in workload.jobs if j.kind == "train" and (ftype.unit == "job" or j.multi_node)
    ]
    if name:
        for job in eligible:
            if job.name == name:
                return job.index
        node = sim.fleet.node_by_name(name)
        if node is not None and workload.job_at(node.index, ts) in {j.index for j in eligible}:
            return workload.job_at(node.index, ts)
        s = sim.fleet.slice_by_name(name)
        if s is not None and workload.slice_job[s.index] in {j.index for j in eligible}:
            return workload.slice_job[s.index]
        raise ValueError(
            f"forced {ftype.key}: no eligible training job named or running on {name!r}"
        )
    if not eligible:
        raise ValueError(f"forced {ftype.key}: the fleet runs no eligible training job")
    return min(eligible, key=lambda j: (not j.multi_node, j.index)).index


def _occupy(sim: Simulation, ctx: Injector, placement: Placement, until: int) -> None:
    if not _exclusive(placement.ftype):
        return
    owner = _owner(sim, placement.ftype, placement.unit)
    if owner is None:
        return
    table = {"node": ctx.busy_node, "slice": ctx.busy_slice, "job": ctx.busy_job}[owner[0]]
    table[owner[1]] = max(table.get(owner[1], 0), until)
