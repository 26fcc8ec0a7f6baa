"""GPU telemetry: one dcgm-exporter-style scrape per node per tick, vectorised over the fleet.

Every metric is an array of shape [nodes, 8] computed with numpy per tick; only the final step
(building the msgspec objects) loops in Python. The model, per GPU:
- the node's job sets the load (training: synchronous, everyone waits on the slowest GPU;
  serving: diurnal; idle allocation: memory held, nothing running; no job: idle);
- active fault effects change speed, clocks, power, temperature, traffic and counters;
- power follows activity and clocks, temperature follows power with a thermal lag;
- counters only grow, except that a reboot or GPU reset sets the volatile ones back to zero.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.model import GpuReading, GpuSample
from pipeline.sim.effects import Change, Effect
from pipeline.sim.fleet import GPUS_PER_NODE, LOCAL_HOUR_OFFSET, Fleet
from pipeline.sim.workload import DOWN, HANG, RUN, Workload

Array = npt.NDArray[Any]
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Exported fields, in DCGM field-id order, and how many decimals each keeps (None: integer).
FIELDS: tuple[tuple[str, int | None], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", None),
    ("DCGM_FI_DEV_MEM_CLOCK", None),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", None),
    ("DCGM_FI_DEV_MEMORY_TEMP", None),
    ("DCGM_FI_DEV_GPU_TEMP", None),
    ("DCGM_FI_DEV_POWER_USAGE", 3),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", None),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", None),
    ("DCGM_FI_DEV_GPU_UTIL", None),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", None),
    ("DCGM_FI_DEV_ENC_UTIL", None),
    ("DCGM_FI_DEV_DEC_UTIL", None),
    ("DCGM_FI_DEV_XID_ERRORS", None),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", None),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", None),
    ("DCGM_FI_DEV_POWER_VIOLATION", None),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", None),
    ("DCGM_FI_DEV_FB_FREE", None),
    ("DCGM_FI_DEV_FB_USED", None),
    ("DCGM_FI_DEV_FB_RESERVED", None),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", None),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", None),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", None),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", None),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", None),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", None),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", None),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 3),
    ("DCGM_FI_PROF_SM_ACTIVE", 3),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 3),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 3),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", None),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", None),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", None),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", None),
    ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", None),
)
FIELD_NAMES: tuple[str, ...] = tuple(name for name, _ in FIELDS)
COUNTERS: tuple[str, ...] = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
)
# Remapped-row counts live in the InfoROM and survive a reset; the rest start again from zero.
PERSISTENT_COUNTERS = frozenset(
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"}
)
GAUGES: tuple[str, ...] = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
)
# CLOCK_THROTTLE_REASONS bits (dcgm-exporter clock_event names)
GPU_IDLE, SW_POWER_CAP, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x20, 0x40, 0x80
# Background counter noise per GPU per second (a healthy fleet is not perfectly silent).
BACKGROUND_RATES = {
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 2e-6,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 5e-6,
}
KIND_CODE = {"train": 0, "serve": 1, "idle": 2}
STEP = "step_compute_s"  # not a DCGM field: the job's own per-rank figure (GpuReading)
STEP_PUBLISHING_SHARE = 0.6  # of training jobs: the others publish no step time
THERMAL_TAU_S = 45.0
INLET_C = 27.0


def diurnal_dip(t_ms: int, hour_offset: float) -> float:
    """Fault model S5: the share of throughput lost to mid-day heat, 0 .. 0.015."""
    local_h = (t_ms / HOUR_MS + hour_offset) % 24
    return 0.015 * max(0.0, math.sin(2 * math.pi * (local_h - 6) / 24))


def serving_load(t_ms: int, hour_offset: float) -> float:
    """Requests follow the day: lowest before dawn, highest mid-afternoon (0.15 .. 0.75)."""
    local_h = (t_ms / HOUR_MS + hour_offset) % 24
    return 0.45 + 0.3 * math.sin(2 * math.pi * (local_h - 10) / 24)


class GpuTelemetry:
    """Holds the per-GPU state between ticks and produces one GpuSample per reporting node."""

    def __init__(
        self,
        fleet: Fleet,
        workload: Workload,
        effects: list[Effect],
        changes: list[Change],
        seed: int,
        interval_s: int,
        diurnal: bool,
    ) -> None:
        self.fleet, self.workload = fleet, workload
        self.interval_s = interval_s
        self.diurnal = diurnal
        self.rng = np.random.default_rng([seed, 10])
        self.seed = seed
        self._effects = sorted(effects, key=lambda e: (e.start_ms, e.node, e.device))
        self._next_effect = 0
        self._active: list[Effect] = []
        self._changes = changes
        self._next_change = 0
        self._node_ops = sorted(
            (ts, seq, node, job)
            for node, ops in enumerate(workload.node_ops)
            for ts, seq, job in ops
        )
        self._next_node_op = 0
        self._state_ops = sorted(
            (ts, seq, job, state)
            for job, ops in enumerate(workload.state_ops)
            for ts, seq, state in ops
        )
        self._next_state_op = 0
        self._static(fleet, workload)
        self._init_state()
        self._last_ms: int | None = None

    # --- set-up -----------------------------------------------------------------------------

    def _static(self, fleet: Fleet, workload: Workload) -> None:
        nodes = fleet.gpu_nodes
        n = len(nodes)

        def column(values: list[float]) -> Array:
            return np.asarray(values, dtype=np.float64).reshape(n, 1)

        self.tdp = column([x.model.tdp_w for x in nodes])
        self.idle_w = column([x.model.idle_w for x in nodes])
        self.max_sm = column([x.model.max_sm_mhz for x in nodes])
        self.idle_sm = column([x.model.idle_sm_mhz for x in nodes])
        self.mem_mhz = column([x.model.mem_mhz for x in nodes])
        self.fb_total = column([x.model.fb_total_mib for x in nodes])
        self.fb_reserved = column([x.model.fb_reserved_mib for x in nodes])
        self.pcie_gen = column([float(x.model.pcie_gen) for x in nodes])
        self.temp_per_w = column([x.model.temp_per_w for x in nodes])
        self.throttle_c = column([x.model.throttle_c for x in nodes])
        self.hour_offset = [float(LOCAL_HOUR_OFFSET.get(x.region, 0)) for x in nodes]
        self.temp_offset = self.rng.normal(0.0, 1.5, (n, GPUS_PER_NODE))
        self.power_eff = self.rng.normal(1.0, 0.02, (n, GPUS_PER_NODE))
        # Per-job arrays carry one padding job at the end (kind -1, never running), so nodes
        # without a job index them like the others.
        jobs = workload.jobs
        self.job_kind = np.asarray([KIND_CODE[j.kind] for j in jobs] + [-1], dtype=np.int64)
        self.job_fb = np.append(self.rng.uniform(0.85, 0.97, len(jobs)), 0.0)
        self.job_scale = np.append(self.rng.uniform(0.6, 1.2, len(jobs)), 0.0)
        self.job_names = [j.name for j in jobs]
        # Some training jobs publish each rank's step compute time (job_step_compute_seconds).
        # Its own generator, so the DCGM series are the same with or without it.
        step_rng = np.random.default_rng([self.seed, 11])
        self.step_rng = step_rng
        self.job_step_s = np.append(step_rng.uniform(0.3, 2.0, len(jobs)), 1.0)
        publishes = step_rng.random(len(jobs)) < STEP_PUBLISHING_SHARE
        self.job_publishes = np.append(publishes, False) & (self.job_kind == KIND_CODE["train"])
        self.static_reading = [
            [(g, x.uuids[g], x.pci_bus_ids[g], x.model.name) for g in range(GPUS_PER_NODE)]
            for x in nodes
        ]

    def _init_state(self) -> None:
        n = len(self.fleet.gpu_nodes)
        shape = (n, GPUS_PER_NODE)
        self.counters: dict[str, Array] = {name: np.zeros(shape) for name in COUNTERS}
        # The driver has been up for days already: energy and a few old counts are not zero.
        uptime_s = self.rng.uniform(1, 30, (n, 1)) * 86_400
        self.counters["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = np.floor(
            uptime_s * 350.0 * 1000 * self.rng.uniform(0.8, 1.2, shape)
        )
        self.counters["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = (
            self.rng.random(shape) < 0.03
        ) * self.rng.integers(1, 4, shape)
        self.counters["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = np.floor(
            self.rng.exponential(0.5, shape) * (self.rng.random(shape) < 0.2)
        )
        self.gauges: dict[str, Array] = {name: np.zeros(shape) for name in GAUGES}
        self.temp: Array | None = None
        # clock factor the driver applies to hold a hot GPU at its throttle temperature
        self.thermal_cf = np.ones(shape)
        self.node_job = np.full(n, -1, dtype=np.int64)
        self.job_state = np.full(len(self.workload.jobs) + 1, RUN, dtype=np.int64)
        self.job_state[-1] = DOWN

    # --- per tick ---------------------------------------------------------------------------

    def tick(self, t_ms: int) -> list[GpuSample]:
        dt = self.interval_s if self._last_ms is None else (t_ms - self._last_ms) / 1000
        self._last_ms = t_ms
        self._replay_ops(t_ms)
        self._apply_changes(t_ms)
        self._update_active(t_ms)
        mods = self._modifiers(t_ms)
        metrics = self._metrics(t_ms, dt, mods)
        return self._samples(t_ms, metrics, mods["offline"], mods["missing"])

    def _replay_ops(self, t_ms: int) -> None:
        ops = self._node_ops
        while self._next_node_op < len(ops) and ops[self._next_node_op][0] <= t_ms:
            _, _, node, job = ops[self._next_node_op]
            self.node_job[node] = job
            self._next_node_op += 1
        states = self._state_ops
        while self._next_state_op < len(states) and states[self._next_state_op][0] <= t_ms:
            _, _, job, state = states[self._next_state_op]
            self.job_state[job] = state
            self._next_state_op += 1

    def _apply_changes(self, t_ms: int) -> None:
        changes = self._changes
        while self._next_change < len(changes) and changes[self._next_change].ts <= t_ms:
            change = changes[self._next_change]
            self._next_change += 1
            where = (change.node, slice(None) if change.device < 0 else change.device)
            if change.kind == "counter_add":
                self.counters[change.field][where] += change.value
            elif change.kind == "gauge_set":
                self.gauges[change.field][where] = change.value
            elif change.kind == "reset":
                for name, values in self.counters.items():
                    if name not in PERSISTENT_COUNTERS:
                        values[where] = 0.0
                for name in GAUGES:
                    if name != "DCGM_FI_DEV_ROW_REMAP_FAILURE":  # needs an RMA, not a reset
                        self.gauges[name][where] = 0.0

    def _update_active(self, t_ms: int) -> None:
        effects = self._effects
        while self._next_effect < len(effects) and effects[self._next_effect].start_ms <= t_ms:
            self._active.append(effects[self._next_effect])
            self._next_effect += 1
        self._active = [e for e in self._active if e.end_ms > t_ms]

    def _modifiers(self, t_ms: int) -> dict[str, Array]:
        n = len(self.fleet.gpu_nodes)
        shape = (n, GPUS_PER_NODE)
        mods: dict[str, Array] = {
            "speed": np.ones(shape),
            "clock": np.ones(shape),
            "power": np.ones(shape),
            "temp": np.zeros(shape),
            "thermal_r": np.ones(shape),
            "pcie_bw": np.ones(shape),
            "nvlink_bw": np.ones(shape),
            "throttle": np.zeros(shape, dtype=np.int64),
            "link_gen": np.broadcast_to(self.pcie_gen, shape).copy(),
            "link_width": np.full(shape, 16.0),
            "work": np.ones(n),
            "offline": np.zeros(n, dtype=bool),
            "missing": np.zeros(shape, dtype=bool),
            "job_speed": np.ones(len(self.workload.jobs) + 1),
        }
        dt = self.interval_s
        for effect in self._active:
            kind = effect.kind
            value = effect.level(t_ms)
            if kind == "job_speed":
                mods["job_speed"][effect.node] *= value
                continue
            if kind in ("offline", "work"):
                if kind == "offline":
                    mods["offline"][effect.node] = True
                else:
                    mods["work"][effect.node] *= value
                continue
            where = (effect.node, slice(None) if effect.device < 0 else effect.device)
            if kind == "missing":
                mods["missing"][where] = True
            elif kind == "throttle":
                mods["throttle"][where] |= int(value)
            elif kind in ("link_gen", "link_width"):
                mods[kind][where] = np.minimum(mods[kind][where], value)
            elif kind == "temp":
                mods["temp"][where] += value
            elif kind.startswith("rate:"):
                counts = np.shape(self.counters[kind[5:]][where])
                self.counters[kind[5:]][where] += self.rng.poisson(value * dt, counts)
            else:
                mods[kind][where] *= value
        return mods

    def _metrics(self, t_ms: int, dt: float, mods: dict[str, Array]) -> dict[str, Array]:
        noise = self.rng.standard_normal((8, len(self.fleet.gpu_nodes), GPUS_PER_NODE))
        dip = self._diurnal(t_ms)
        view = self._job_view()
        clock = mods["clock"] * self.thermal_cf
        busy = self._busy(view, mods, clock, dip)
        load = self._serving_load(t_ms, view)
        out = self._activity(view, busy, load, clock, noise)
        out.update(self._framebuffer(view))
        out.update(self._power_and_heat(out, clock, mods, dip, dt, noise))
        out.update(self._traffic(view, busy, load, mods, noise))
        out[STEP] = self._step_compute(view, mods, clock)
        out["DCGM_FI_DEV_PCIE_LINK_GEN"] = mods["link_gen"]
        out["DCGM_FI_DEV_PCIE_LINK_WIDTH"] = mods["link_width"]
        out.update(self.counters)
        out.update(self.gauges)
        return out

    def _diurnal(self, t_ms: int) -> Array:
        dips = [diurnal_dip(t_ms, h) if self.diurnal else 0.0 for h in self.hour_offset]
        return np.asarray(dips).reshape(-1, 1)

    def _job_view(self) -> dict[str, Array]:
        """Per node: its job's index (the padding job when none), kind and state, as [n, 1]
        columns that broadcast over the node's GPUs."""
        job = np.where(self.node_job >= 0, self.node_job, len(self.workload.jobs))
        kind, state = self.job_kind[job], self.job_state[job]
        running = state == RUN
        return {
            "job": job,
            "train": (running & (kind == 0)).reshape(-1, 1),
            "serve": (running & (kind == 1)).reshape(-1, 1),
            "hang": (state == HANG).reshape(-1, 1),
            "holds_memory": ((kind >= 0) & (state != DOWN)) | (kind == 2),
            "kind": kind,
        }

    def _busy(
        self, view: dict[str, Array], mods: dict[str, Array], clock: Array, dip: Array
    ) -> Array:
        """Share of time each GPU computes. Synchronous jobs run at the pace of their slowest
        GPU (extra work on a node counts as slowness); the faster ones wait."""
        n = len(self.fleet.gpu_nodes)
        capacity = mods["speed"] * clock / mods["work"].reshape(n, 1)
        job_pace = np.full(len(self.job_kind), np.inf)
        members = view["train"][:, 0] | view["serve"][:, 0]
        np.minimum.at(job_pace, view["job"][members], capacity.min(axis=1)[members])
        job_pace = np.where(np.isfinite(job_pace), job_pace, 1.0) * mods["job_speed"]
        pace = job_pace[view["job"]].reshape(n, 1) * (1 - dip)
        busy: Array = np.clip(pace / capacity, 0.0, 1.0)
        return busy

    def _step_compute(self, view: dict[str, Array], mods: dict[str, Array], clock: Array) -> Array:
        """Seconds each rank of a publishing training job computed its last step: the job's
        step over the GPU's own capacity (slow clocks, a slow GPU, extra work on its stage all
        lengthen it; waiting for a slower rank does not), ±1.5 %. NaN: nothing published."""
        n = len(self.fleet.gpu_nodes)
        capacity = mods["speed"] * clock / mods["work"].reshape(n, 1)
        noise = 1 + 0.015 * self.step_rng.standard_normal((n, GPUS_PER_NODE))
        compute = self.job_step_s[view["job"]].reshape(n, 1) / capacity * noise
        publishing = view["train"] & self.job_publishes[view["job"]].reshape(n, 1)
        step: Array = np.where(publishing, compute, np.nan)
        return step

    def _serving_load(self, t_ms: int, view: dict[str, Array]) -> Array:
        serving = np.asarray([serving_load(t_ms, h) for h in self.hour_offset])
        load: Array = (serving * self.job_scale[view["job"]]).reshape(-1, 1)
        return load

    def _activity(
        self, view: dict[str, Array], busy: Array, load: Array, clock: Array, noise: Array
    ) -> dict[str, Array]:
        train, serve, hang = view["train"], view["serve"], view["hang"]
        shape = busy.shape
        sm = np.where(train, 0.9 * busy, np.where(serve, 0.75 * load * busy, 0.0))
        sm = np.where(hang, 0.02, sm)  # ranks spin in a collective that never completes
        sm = np.clip(sm + 0.01 * noise[0] * (sm > 0), 0.0, 1.0)
        tensor = np.where(train, 0.55 * busy * clock**1.5, np.where(serve, 0.4 * load * busy, 0.0))
        tensor = np.clip(tensor + 0.01 * noise[1] * (tensor > 0), 0.0, 1.0)
        dram = np.clip(np.where(train, 0.45 * busy, np.where(serve, 0.3 * load, 0.0)), 0.0, 1.0)
        # GPU_UTIL counts time with any kernel running: a hung collective reads ~100 %
        util = np.where(train | hang, 99.0 + noise[2].clip(-1, 1), 0.0)
        util = np.where(serve, 120.0 * load + 3 * noise[2], util)
        zeros = np.zeros(shape)
        return {
            "DCGM_FI_PROF_SM_ACTIVE": sm,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
            "DCGM_FI_PROF_DRAM_ACTIVE": dram,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": np.where(hang, 0.99, np.minimum(1.0, sm * 1.08)),
            "DCGM_FI_DEV_GPU_UTIL": np.clip(util, 0.0, 100.0) * np.ones(shape),
            "DCGM_FI_DEV_MEM_COPY_UTIL": 100 * dram,
            "DCGM_FI_DEV_ENC_UTIL": zeros,
            "DCGM_FI_DEV_DEC_UTIL": zeros,
        }

    def _framebuffer(self, view: dict[str, Array]) -> dict[str, Array]:
        # training holds most of HBM, serving its weights and KV cache, a notebook a little
        share = np.where(view["kind"] == 1, 0.6, self.job_fb[view["job"]])
        share = np.where(view["kind"] == 2, 0.1, share)
        share = np.where(view["holds_memory"], share, 0.0).reshape(-1, 1)
        usable = self.fb_total - self.fb_reserved
        used = np.floor(usable * share) + (share == 0)  # the driver's own MiB
        used = used * np.ones((len(share), GPUS_PER_NODE))
        return {
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_FREE": usable - used,
            "DCGM_FI_DEV_FB_RESERVED": self.fb_reserved * np.ones_like(used),
            "DCGM_FI_DEV_MEM_CLOCK": self.mem_mhz * np.ones_like(used),
        }

    def _power_and_heat(
        self,
        out: dict[str, Array],
        clock: Array,
        mods: dict[str, Array],
        dip: Array,
        dt: float,
        noise: Array,
    ) -> dict[str, Array]:
        util, sm = out["DCGM_FI_DEV_GPU_UTIL"], out["DCGM_FI_PROF_SM_ACTIVE"]
        span = self.tdp * 0.95 - self.idle_w
        power = self.idle_w + span * (0.12 * util / 100 + 0.88 * sm * clock**2)
        power = power * self.power_eff * mods["power"] * (1 + 0.01 * noise[3])
        power = np.clip(power, 0.8 * self.idle_w, self.tdp)
        resistance = self.temp_per_w * mods["thermal_r"]
        target = INLET_C + self.temp_offset + resistance * power + mods["temp"] + 130 * dip
        throttled = self._thermal_control(target)
        if self.temp is None:
            self.temp = target.copy()
        self.temp = self.temp + (target - self.temp) * (1 - math.exp(-dt / THERMAL_TAU_S))
        temp = self.temp + 0.3 * noise[4]

        active = (util > 0) | (sm > 0.01)
        capped = power > 0.93 * self.tdp
        ceiling = self.max_sm * clock
        sm_clock = np.minimum(ceiling * (1 - dip) * (1 - 0.03 * capped) + 8 * noise[5], ceiling)
        throttle = (
            mods["throttle"]
            | np.where(active, 0, GPU_IDLE)
            | np.where(capped, SW_POWER_CAP, 0)
            | np.where(throttled, SW_THERMAL, 0)
            | np.where(self.thermal_cf < 0.9, HW_THERMAL, 0)
        )
        counters = self.counters
        counters["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += np.floor(power * dt * 1000)
        counters["DCGM_FI_DEV_POWER_VIOLATION"] += np.where(capped, dt * 1e9 * 0.2, 0.0)
        counters["DCGM_FI_DEV_THERMAL_VIOLATION"] += np.where(throttled, dt * 1e9, 0.0)
        for name, rate in BACKGROUND_RATES.items():
            counters[name] += self.rng.poisson(rate * dt, power.shape)
        return {
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_GPU_TEMP": temp,
            "DCGM_FI_DEV_MEMORY_TEMP": temp + 4 + 3 * out["DCGM_FI_PROF_DRAM_ACTIVE"],
            "DCGM_FI_DEV_SM_CLOCK": np.where(active, np.floor(sm_clock / 15) * 15, self.idle_sm),
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": throttle,
        }

    def _traffic(
        self,
        view: dict[str, Array],
        busy: Array,
        load: Array,
        mods: dict[str, Array],
        noise: Array,
    ) -> dict[str, Array]:
        train, serve, hang = view["train"], view["serve"], view["hang"]
        # what the PCIe link can carry at its current generation and width
        link = 2.0 ** (mods["link_gen"] - 1) * 4.0e9 * mods["link_width"] / 16
        pcie = np.where(train, 8e9 * busy, np.where(serve, 1.5e9 * load, np.where(hang, 1e6, 2e4)))
        pcie = np.minimum(pcie * mods["pcie_bw"] * (1 + 0.05 * noise[6]).clip(0.5), link)
        nvlink = np.where(train, 6e10 * busy, np.where(serve, 2e9 * load, 0.0))
        nvlink = nvlink * mods["nvlink_bw"] * (1 + 0.05 * noise[7]).clip(0.5)
        return {
            "DCGM_FI_PROF_PCIE_TX_BYTES": pcie,
            "DCGM_FI_PROF_PCIE_RX_BYTES": pcie * 0.9,
            "DCGM_FI_PROF_NVLINK_TX_BYTES": nvlink,
            "DCGM_FI_PROF_NVLINK_RX_BYTES": nvlink,
        }

    def _thermal_control(self, target: Array) -> Array:
        """The driver's thermal slowdown: past the throttle temperature the clock factor for
        the next tick drops in proportion to the excess, and creeps back once cool. Returns
        which GPUs are throttled now."""
        over = target - self.throttle_c
        throttled = self.thermal_cf < 0.999
        self.thermal_cf = np.where(
            over > 0,
            np.clip(self.thermal_cf * (1 - 0.02 * over), 0.5, 1.0),
            np.minimum(1.0, self.thermal_cf + 0.005 * np.maximum(-over, 0.0)),
        )
        return throttled | (over > 0)

    def _samples(
        self, t_ms: int, metrics: dict[str, Array], offline: Array, missing: Array
    ) -> list[GpuSample]:
        n = len(self.fleet.gpu_nodes)
        columns = []
        for name, decimals in FIELDS:
            values = np.broadcast_to(metrics[name], (n, GPUS_PER_NODE))
            columns.append(np.rint(values) if decimals is None else np.round(values, decimals))
        table = np.stack(columns, axis=-1).astype(np.float64).tolist()
        samples = []
        names = FIELD_NAMES
        offline_list = offline.tolist()
        missing_list = missing.tolist()
        node_job = self.node_job.tolist()
        steps = np.round(metrics[STEP], 4).tolist()
        for i, node in enumerate(self.fleet.gpu_nodes):
            if offline_list[i]:
                continue
            job = self.job_names[node_job[i]] if node_job[i] >= 0 else None
            statics = self.static_reading[i]
            rows = table[i]
            gone = missing_list[i]
            gpus = [
                GpuReading(
                    index=g,
                    uuid=uuid,
                    pci_bus_id=bus,
                    model=model,
                    job=job,
                    metrics=dict(zip(names, rows[g], strict=True)),
                    step_compute_s=None if math.isnan(steps[i][g]) else steps[i][g],
                )
                for g, uuid, bus, model in statics
                if not gone[g]
            ]
            samples.append(
                GpuSample(
                    ts=t_ms,
                    cluster=node.cluster,
                    node=node.name,
                    pool=node.pool,
                    zone=node.zone,
                    driver=node.driver,
                    gpus=gpus,
                )
            )
        return samples
