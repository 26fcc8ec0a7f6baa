"""Jobs on the fleet: synchronous training, diurnal serving, idle allocations, empty nodes.

Placement and every change of it (a serving job ending, a node leaving a job after a hard
fault, a job hanging or crashing) are recorded as timestamped operations before the run starts;
the generators replay them in event time. Whole nodes belong to one job; a TPU slice runs at
most one job.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipeline.ids import stable_id
from pipeline.sim.fleet import Fleet

JobKind = Literal["train", "serve", "idle"]
RUN, HANG, DOWN = 0, 1, 2
MINUTE = 60_000
HOUR = 60 * MINUTE
# TPU slices cycle through these (a run with four slices gets three training jobs and one
# idle allocation; "empty" holds no job).
SLICE_KINDS: tuple[str, ...] = ("train", "train", "idle", "train", "empty")


@dataclass
class Job:
    index: int
    name: str
    kind: JobKind
    platform: Literal["gpu", "tpu"]
    members: tuple[int, ...]  # GPU node indices, or the slice index
    start_ms: int
    straggler: int | None = None  # S4: the node holding the last pipeline stage

    @property
    def multi_node(self) -> bool:
        return self.platform == "gpu" and len(self.members) > 1


class Workload:
    """Jobs and the timestamped operations that place them and change their state."""

    def __init__(self, fleet: Fleet, seed: int, start_ms: int, end_ms: int) -> None:
        self.fleet = fleet
        self.start_ms, self.end_ms = start_ms, end_ms
        self.jobs: list[Job] = []
        self.slice_job: list[int] = []
        # per GPU node: sorted (ts, seq, job or -1); per job: sorted (ts, seq, state)
        self.node_ops: list[list[tuple[int, int, int]]] = [[] for _ in fleet.gpu_nodes]
        self.state_ops: list[list[tuple[int, int, int]]] = []
        self._seq = 0
        self._seed = seed
        rng = np.random.default_rng([seed, 2])
        self._place_gpu_jobs(rng)
        self._place_tpu_jobs()

    # --- queries ----------------------------------------------------------------------------

    def job_at(self, node: int, ts: int) -> int:
        ops = self.node_ops[node]
        i = bisect.bisect_right(ops, (ts, 1 << 62, 0))
        return ops[i - 1][2] if i else -1

    def members_at(self, job: int, ts: int) -> list[int]:
        record = self.jobs[job]
        if record.platform == "tpu":
            return list(record.members)
        return [n for n in record.members if self.job_at(n, ts) == job]

    def state_at(self, job: int, ts: int) -> int:
        ops = self.state_ops[job]
        i = bisect.bisect_right(ops, (ts, 1 << 62, 0))
        return ops[i - 1][2] if i else RUN

    def training_jobs(self) -> list[int]:
        return [j.index for j in self.jobs if j.kind == "train"]

    # --- changes made by faults -------------------------------------------------------------

    def set_state(self, job: int, ts: int, state: int) -> None:
        self._seq += 1
        bisect.insort(self.state_ops[job], (ts, self._seq, state))

    def vacate(self, node: int, ts: int, until: int, rejoin: int | None = None) -> None:
        """The node leaves whatever job it runs at `ts` and takes no new one before `until`;
        then it rejoins job `rejoin` (a training job gets its repaired node back)."""
        ops = [op for op in self.node_ops[node] if not ts <= op[0] < until]
        self._seq += 1
        ops.append((ts, self._seq, -1))
        if rejoin is not None:
            self._seq += 1
            ops.append((until, self._seq, rejoin))
        self.node_ops[node] = sorted(ops)

    def interrupt(self, job: int, at: int, hang_ms: int, down_ms: int) -> int:
        """Hang for `hang_ms` (ranks wait in a collective), then down for `down_ms`, then
        run again. Returns the restart time. Single-node jobs simply end instead."""
        crash = at + hang_ms
        if hang_ms > 0:
            self.set_state(job, at, HANG)
        self.set_state(job, crash, DOWN)
        restart = crash + down_ms
        self.set_state(job, restart, RUN)
        return restart

    # --- placement --------------------------------------------------------------------------

    def _new_job(
        self, kind: JobKind, platform: Literal["gpu", "tpu"], members: tuple[int, ...], start: int
    ) -> Job:
        index = len(self.jobs)
        prefix = {"train": "train", "serve": "serve", "idle": "notebook"}[kind]
        name = stable_id(prefix, self._seed, index)[: len(prefix) + 9]
        job = Job(
            index=index, name=name, kind=kind, platform=platform, members=members, start_ms=start
        )
        self.jobs.append(job)
        self.state_ops.append([])
        return job

    def _assign(self, node: int, ts: int, job: int) -> None:
        self._seq += 1
        self.node_ops[node].append((ts, self._seq, job))

    def _place_gpu_jobs(self, rng: np.random.Generator) -> None:
        by_pool: dict[tuple[str, str], list[int]] = {}
        for node in self.fleet.gpu_nodes:
            by_pool.setdefault((node.cluster, node.pool), []).append(node.index)
        for members in by_pool.values():
            if self.fleet.gpu_nodes[members[0]].pool_kind == "train":
                self._place_training_pool(members, rng)
            else:
                for index in members:
                    self._churn_serving_node(index, rng)
        for ops in self.node_ops:
            ops.sort()

    def _place_training_pool(self, members: list[int], rng: np.random.Generator) -> None:
        i = 0
        while i < len(members):
            roll = rng.random()
            if roll < 0.08:
                job = self._new_job("idle", "gpu", (members[i],), self.start_ms)
                self._assign(members[i], self.start_ms, job.index)
                i += 1
            elif roll < 0.15:
                i += 1  # an empty node: no job at all
            else:
                size = min(len(members) - i, int(rng.choice([2, 4, 4, 8])))
                group = tuple(members[i : i + size])
                job = self._new_job(
                    "train", "gpu", group, self.start_ms - int(rng.integers(1, 48)) * HOUR
                )
                if size > 1 and rng.random() < 0.425:  # S4: OSDI'25, 42.5 % of large jobs
                    job.straggler = group[-1]
                for node in group:
                    self._assign(node, self.start_ms, job.index)
                i += size

    def _churn_serving_node(self, node: int, rng: np.random.Generator) -> None:
        # Serving pools turn over: jobs of a few hours, gaps of minutes, some idle holders.
        t = self.start_ms
        first = True
        while t < self.end_ms:
            roll = rng.random()
            kind: JobKind | None = "serve" if roll < 0.65 else "idle" if roll < 0.8 else None
            mean_h = 6.0 if kind == "serve" else 3.0
            length = int(max(20 * MINUTE, rng.exponential(mean_h * HOUR)))
            if first:
                length = int(rng.uniform(0.2, 1.0) * length)  # already running at the start
            if kind is None:
                length = int(rng.uniform(5, 60) * MINUTE)
            else:
                job = self._new_job(kind, "gpu", (node,), t if not first else t - length)
                self._assign(node, t, job.index)
                self._assign(node, t + length, -1)
            t += length + (int(rng.uniform(2, 30) * MINUTE) if kind is not None else 0)
            first = False

    def _place_tpu_jobs(self) -> None:
        for s in self.fleet.slices:
            kind = SLICE_KINDS[s.index % len(SLICE_KINDS)]
            if kind == "empty":
                self.slice_job.append(-1)
                continue
            job = self._new_job(
                "train" if kind == "train" else "idle", "tpu", (s.index,), self.start_ms - 6 * HOUR
            )
            self.slice_job.append(job.index)
