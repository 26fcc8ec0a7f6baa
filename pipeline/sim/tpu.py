"""TPU telemetry: chip metrics (TpuSample) and ICI link counters (IciSample) per host per tick.

A slice runs one synchronous job: every chip moves together, at the pace of the slowest. ICI
links are directed (chip, port → peer); the flits one end sends are the flits the other end
receives, and a link that is down carries nothing in either direction.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.model import IciLink, IciSample, TpuChipReading, TpuSample
from pipeline.sim.effects import Change, Effect
from pipeline.sim.fleet import LOCAL_HOUR_OFFSET, Fleet, TpuSlice
from pipeline.sim.gpu import diurnal_dip
from pipeline.sim.workload import DOWN, HANG, RUN, Workload

Array = npt.NDArray[Any]
GIB = 1 << 30
FLITS_PER_S = 1.5e9  # per busy link direction [G]: ~100 GB/s per port at ~64 B per flit
BACKGROUND_FLITS_PER_S = 2e3  # keep-alives on an idle link
BACKGROUND_ERRORS_PER_S = 1e-6


class _SliceState:
    def __init__(self, s: TpuSlice, rng: np.random.Generator) -> None:
        self.slice = s
        chips, links = s.shape.chips, len(s.links)
        self.hbm_total = float(s.shape.generation.hbm_gib * GIB)
        self.tx = np.floor(rng.uniform(1e12, 5e13, links))  # hosts have been up for days
        self.rx = self.tx[np.asarray(s.reverse, dtype=np.int64)] if links else np.zeros(0)
        self.errors = np.zeros(links)
        self.link_chip = np.asarray([chip for chip, _, _ in s.links], dtype=np.int64)
        owner = np.zeros(chips, dtype=np.int64)
        for host in s.hosts:
            owner[list(host.chips)] = host.worker_id
        self.link_host = owner[self.link_chip] if links else np.zeros(0, dtype=np.int64)
        self.host_links = [np.flatnonzero(self.link_host == h.worker_id).tolist() for h in s.hosts]
        self.host_link_ends = [[(i, *s.links[i]) for i in links] for links in self.host_links]
        self.hbm_frac = rng.uniform(0.75, 0.92)
        self.base_util = rng.uniform(40.0, 60.0)
        # filled per tick
        self.duty = np.zeros(chips)
        self.util = np.zeros(chips)
        self.hbm_used = np.zeros(chips)
        self.bandwidth = np.zeros(chips)
        self.health = np.zeros(links, dtype=np.int64)
        self.offline = np.zeros(len(s.hosts), dtype=bool)


class TpuTelemetry:
    def __init__(
        self,
        fleet: Fleet,
        workload: Workload,
        effects: list[Effect],
        changes: list[Change],
        seed: int,
        diurnal: bool = True,
    ) -> None:
        self.fleet, self.workload = fleet, workload
        self.diurnal = diurnal
        self.rng = np.random.default_rng([seed, 11])
        self.slices = [_SliceState(s, self.rng) for s in fleet.slices]
        self._effects = sorted(effects, key=lambda e: (e.start_ms, e.node, e.device))
        self._next_effect = 0
        self._active: list[Effect] = []
        self._changes = changes
        self._next_change = 0
        self._state_ops = sorted(
            (ts, seq, job, state)
            for job, ops in enumerate(workload.state_ops)
            if workload.jobs[job].platform == "tpu"
            for ts, seq, state in ops
        )
        self._next_state_op = 0
        self.job_state = {j.index: RUN for j in workload.jobs if j.platform == "tpu"}
        self._last_ms: int | None = None

    def advance(self, t_ms: int) -> None:
        """Bring every slice to event time `t_ms` (counters grow by the time since last call)."""
        dt = 0.0 if self._last_ms is None else (t_ms - self._last_ms) / 1000
        self._last_ms = t_ms
        self._replay(t_ms)
        for state in self.slices:
            self._step_slice(state, t_ms, dt)

    def _replay(self, t_ms: int) -> None:
        ops = self._state_ops
        while self._next_state_op < len(ops) and ops[self._next_state_op][0] <= t_ms:
            _, _, job, value = ops[self._next_state_op]
            self.job_state[job] = value
            self._next_state_op += 1
        changes = self._changes
        while self._next_change < len(changes) and changes[self._next_change].ts <= t_ms:
            change = changes[self._next_change]
            self._next_change += 1
            if change.kind == "tpu_reset":
                state = self.slices[change.node]
                links = state.host_links[change.device]
                state.tx[links] = 0.0
                state.rx[links] = 0.0
                state.errors[links] = 0.0
        effects = self._effects
        while self._next_effect < len(effects) and effects[self._next_effect].start_ms <= t_ms:
            self._active.append(effects[self._next_effect])
            self._next_effect += 1
        self._active = [e for e in self._active if e.end_ms > t_ms]

    def _step_slice(self, state: _SliceState, t_ms: int, dt: float) -> None:
        s = state.slice
        chips, links = s.shape.chips, len(s.links)
        speed = np.ones(chips)
        flit_factor = np.ones(links)
        error_rate = np.full(links, BACKGROUND_ERRORS_PER_S)
        health = np.zeros(links, dtype=np.int64)
        offline = np.zeros(len(s.hosts), dtype=bool)
        for effect in self._active:
            if effect.node != s.index:
                continue
            value = effect.level(t_ms)
            where = slice(None) if effect.device < 0 else effect.device
            if effect.kind == "host_offline":
                offline[where] = True
            elif effect.kind == "chip_speed":
                speed[where] *= value
            elif effect.kind == "link_health":
                health[where] = np.maximum(health[where], round(value))
            elif effect.kind == "link_flits":
                flit_factor[where] *= value
            elif effect.kind == "link_errors":
                error_rate[where] += value
        job = self.workload.slice_job[s.index]
        kind = self.workload.jobs[job].kind if job >= 0 else None
        run_state = self.job_state.get(job, DOWN) if job >= 0 else DOWN
        noise = self.rng.standard_normal((3, chips))
        pace = float(speed.min()) * (1 - self._dip(s, t_ms))
        training = kind == "train"
        if training and run_state == RUN:
            duty = np.clip(97.5 + 1.0 * noise[0], 0.0, 100.0)
            util = np.clip(state.base_util * pace + 1.0 * noise[1], 0.0, 100.0)
            activity = pace
        elif training and run_state == HANG:
            duty = np.clip(99.0 + 0.5 * noise[0], 0.0, 100.0)
            util = np.zeros(chips)
            activity = 0.0
        else:
            duty = np.zeros(chips)
            util = np.zeros(chips)
            activity = 0.0
        holds_memory = (training and run_state != DOWN) or kind == "idle"
        frac = state.hbm_frac if training else 0.3
        state.duty, state.util = duty, util
        state.hbm_used = np.full(chips, np.floor(state.hbm_total * frac) if holds_memory else 0.0)
        state.bandwidth = np.clip(40.0 * activity + 2.0 * noise[2] * activity, 0.0, 100.0)
        down = health >= 10
        rate = (FLITS_PER_S * activity + BACKGROUND_FLITS_PER_S) * flit_factor * ~down
        sent = np.floor(rate * dt * self.rng.uniform(0.98, 1.02, links)) if links else rate
        state.tx += sent
        if links:
            state.rx += sent[np.asarray(s.reverse, dtype=np.int64)]
            state.errors += self.rng.poisson(error_rate * dt)
        state.health = health
        state.offline = offline

    def _dip(self, s: TpuSlice, t_ms: int) -> float:
        if not self.diurnal:
            return 0.0
        return diurnal_dip(t_ms, float(LOCAL_HOUR_OFFSET.get(s.region, 0)))

    def chip_samples(self, t_ms: int) -> list[TpuSample]:
        samples = []
        for state in self.slices:
            s = state.slice
            rows = np.stack(
                [
                    np.round(state.duty, 2),
                    np.round(state.util, 2),
                    state.hbm_used,
                    np.full(s.shape.chips, state.hbm_total),
                    np.round(state.bandwidth, 2),
                ],
                axis=-1,
            ).tolist()
            job = self.workload.slice_job[s.index]
            job_name = self.workload.jobs[job].name if job >= 0 else None
            for host in s.hosts:
                if state.offline[host.worker_id]:
                    continue
                chips = [
                    TpuChipReading(
                        chip_id=c,
                        coords=list(s.coords[c]),
                        job=job_name,
                        metrics=dict(zip(CHIP_METRICS, rows[c], strict=True)),
                    )
                    for c in host.chips
                ]
                samples.append(
                    TpuSample(
                        ts=t_ms,
                        cluster=s.cluster,
                        node=host.node,
                        pool=s.pool,
                        zone=s.zone,
                        slice=s.name,
                        accelerator_type=s.accelerator_type,
                        topology=s.topology,
                        worker_id=host.worker_id,
                        chips=chips,
                    )
                )
        return samples

    def ici_samples(self, t_ms: int) -> list[IciSample]:
        samples = []
        for state in self.slices:
            s = state.slice
            tx, rx = state.tx.astype(np.int64).tolist(), state.rx.astype(np.int64).tolist()
            errors = state.errors.astype(np.int64).tolist()
            health = state.health.tolist()
            for host in s.hosts:
                if state.offline[host.worker_id]:
                    continue
                links = [
                    IciLink(
                        chip_id=chip,
                        port=port,
                        peer_chip_id=peer,
                        health=health[i],
                        flits_tx=tx[i],
                        flits_rx=rx[i],
                        errors=errors[i],
                    )
                    for i, chip, port, peer in state.host_link_ends[host.worker_id]
                ]
                samples.append(
                    IciSample(
                        ts=t_ms,
                        cluster=s.cluster,
                        node=host.node,
                        pool=s.pool,
                        zone=s.zone,
                        slice=s.name,
                        links=links,
                    )
                )
        return samples


CHIP_METRICS = (
    "duty_cycle_pct",
    "tensorcore_util",
    "hbm_used_bytes",
    "hbm_total_bytes",
    "memory_bandwidth_util",
)
