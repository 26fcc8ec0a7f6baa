"""The injection context: what a fault signature needs to write effects, events and truth.

A signature (signatures_*.py) gets an `Injector` and a `Placement` (which fault, when, where)
and records, before the run starts, everything the fault will do: effects on telemetry,
one-off counter changes, XID lines, node and capacity events, changes to the jobs, and one
ground-truth entry per target it concerns. It returns the time until which the target is
taken (another fault of an exclusive kind is placed elsewhere meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import SimSettings
from pipeline.ids import stable_id
from pipeline.model import (
    CapacityEvent,
    MaintenanceWindow,
    NodeEvent,
    QuotaInfo,
    Target,
    XidEvent,
    host_kind,
)
from pipeline.sim.effects import Change, Effect, Timeline
from pipeline.sim.faults import Expected, FaultType, InjectedFault, Klass
from pipeline.sim.fleet import Fleet, region_of
from pipeline.sim.messages import recovery_text, xid_line, xid_text
from pipeline.sim.schedule import Heterogeneity, UnitRef, Window
from pipeline.sim.workload import DOWN, RUN, Workload
from pipeline.wire.codec import normalize_pci

MINUTE = 60_000
HOUR = 60 * MINUTE


@dataclass(frozen=True, slots=True)
class Placement:
    ftype: FaultType
    onset_ms: int
    unit: UnitRef
    forced: bool = False
    duration_ms: int | None = None  # forced faults may fix how long the fault lasts
    seq: int = 0

    @property
    def node(self) -> int:
        return self.unit.a

    @property
    def device(self) -> int:
        return self.unit.b


class Injector:
    def __init__(
        self,
        settings: SimSettings,
        fleet: Fleet,
        workload: Workload,
        hetero: Heterogeneity,
        end_ms: int,
    ) -> None:
        self.settings, self.fleet, self.workload, self.hetero = settings, fleet, workload, hetero
        self.start_ms, self.end_ms = settings.start_ms, end_ms
        self.rng = np.random.default_rng([settings.seed, 4])
        self.timeline = Timeline()
        self.truth: list[InjectedFault] = []
        self.busy_node: dict[int, int] = {}
        self.busy_slice: dict[int, int] = {}
        self.busy_job: dict[int, int] = {}
        self.windows: list[Window] = []  # fleet-level episodes that modulate rates (H4, H5)
        self._events = 0

    # --- ground truth -------------------------------------------------------------------------

    def group(self, p: Placement) -> str:
        return stable_id(
            "grp", self.settings.seed, p.ftype.key, p.onset_ms, p.unit.a, p.unit.b, p.seq
        )

    def record(
        self,
        p: Placement,
        target: Target,
        end_ms: int,
        *,
        onset_ms: int | None = None,
        device: str | None = None,
        element: Target | None = None,
        job: str | None = None,
        description: str = "",
        klass: Klass | None = None,
        expected: Expected | None = None,
    ) -> None:
        group = self.group(p)
        self.truth.append(
            InjectedFault(
                fault_id=stable_id("flt", group, target.cluster, target.name, device),
                group=group,
                fault_type=p.ftype.code,
                variant=p.ftype.variant,
                klass=klass or p.ftype.klass,
                target=target,
                device=device,
                element=element,
                onset_ms=p.onset_ms if onset_ms is None else onset_ms,
                end_ms=max(end_ms, p.onset_ms if onset_ms is None else onset_ms),
                expected=expected or p.ftype.expected,
                must_not_cordon=p.ftype.must_not_cordon,
                job=job,
                forced=p.forced,
                description=description or p.ftype.title,
            )
        )

    # --- draws --------------------------------------------------------------------------------

    def duration(self, p: Placement, low_ms: float, high_ms: float) -> int:
        if p.duration_ms is not None:
            return p.duration_ms
        return int(self.rng.uniform(low_ms, high_ms))

    def repair_ms(self, p: Placement, median_h: float) -> int:
        """Hard faults last until someone repairs them: hours to days [G]."""
        if p.duration_ms is not None:
            return p.duration_ms
        return int(max(0.5, self.rng.lognormal(np.log(median_h), 0.8)) * HOUR)

    def collective_timeout_ms(self) -> int:
        """How long peers wait before a dead rank fails the job: PyTorch 10 min or NCCL 30 min."""
        return 10 * MINUTE if self.rng.random() < 0.7 else 30 * MINUTE

    # --- telemetry and events -----------------------------------------------------------------

    def effect(self, effect: Effect) -> None:
        self.timeline.effect(effect)

    def change(self, change: Change) -> None:
        self.timeline.change(change)

    def xid(self, ts: int, node: int, gpu: int, code: int, text: str = "") -> None:
        record = self.fleet.gpu_nodes[node]
        job = self.workload.job_at(node, ts)
        job_name = self.workload.jobs[job].name if job >= 0 else None
        pid = process = None
        if job >= 0 and code not in (79, 119, 120, 154):
            pid = 1000 + int(stable_id("pid", job_name, node)[-6:], 16) % 4_000_000
            process = "pt_main_thread" if self.workload.jobs[job].kind == "train" else "python3"
        body = text or xid_text(code, self.rng)
        self.timeline.event(
            ts,
            XidEvent(
                ts=ts,
                cluster=record.cluster,
                node=record.name,
                pool=record.pool,
                zone=record.zone,
                pci_bus_id=normalize_pci(record.pci_bus_ids[gpu]),
                gpu_index=gpu,
                uuid=record.uuids[gpu],
                xid=code,
                pid=pid,
                process=process,
                job=job_name,
                message=xid_line(code, record.pci_bus_ids[gpu], body, pid, process),
                source="simulator",
            ),
        )
        self.change(Change(ts, "gauge_set", node, gpu, "DCGM_FI_DEV_XID_ERRORS", float(code)))

    def recovery_action(self, ts: int, node: int, gpu: int, new: int, old: int = 0) -> None:
        self.xid(ts, node, gpu, 154, recovery_text(old, new))
        self.change(
            Change(ts, "gauge_set", node, gpu, "DCGM_FI_DEV_GPU_RECOVERY_ACTION", float(new))
        )

    def node_event(self, ts: int, target: Target, kind: str, actor: str, reason: str) -> None:
        self.timeline.event(
            ts,
            NodeEvent(
                ts=ts,
                cluster=target.cluster,
                target_kind=host_kind(target),
                target=target.name,
                pool=target.pool,
                zone=target.zone,
                kind=kind,  # type: ignore[arg-type]
                actor=actor,
                reason=reason,
            ),
        )

    def capacity(
        self,
        ts: int,
        kind: str,
        zone: str,
        *,
        severity: str = "info",
        source: str = "gcp.compute.maintenance",
        target: Target | None = None,
        accelerator_type: str | None = None,
        quota: QuotaInfo | None = None,
        window: MaintenanceWindow | None = None,
        state: str | None = None,
        previous_state: str | None = None,
        error_code: str | None = None,
        message: str = "",
    ) -> None:
        self._events += 1
        self.timeline.event(
            ts,
            CapacityEvent(
                event_id=stable_id("cap", self.settings.seed, source, kind, zone, ts, self._events),
                ts=ts,
                provider="gcp",
                source=source,
                kind=kind,  # type: ignore[arg-type]
                severity=severity,  # type: ignore[arg-type]
                region=region_of(zone),
                zone=zone,
                cluster=target.cluster if target else None,
                pool=target.pool if target else None,
                target_kind=host_kind(target) if target else None,
                target=target.name if target else None,
                accelerator_type=accelerator_type,
                quota=quota,
                window=window,
                state=state,
                previous_state=previous_state,
                error_code=error_code,
                message=message,
            ),
        )

    # --- what faults do to nodes and jobs -----------------------------------------------------

    def take_out(self, node: int, at: int, until: int, hang_ms: int) -> int | None:
        """The node's job loses this node at `at`: a multi-node training job hangs for
        `hang_ms` (peers wait in a collective), fails, and restarts minutes later on its other
        nodes; a single-node job just ends. The node takes no new job before `until`, when a
        training node rejoins its job. Returns the job index that was hit, if any."""
        job = self.workload.job_at(node, at)
        record = self.workload.jobs[job] if job >= 0 else None
        rejoin = job if record is not None and record.kind == "train" else None
        if record is not None and record.multi_node and record.kind == "train":
            crash = at + hang_ms
            others = [n for n in self.workload.members_at(job, crash) if n != node]
            self.workload.vacate(node, crash, until, rejoin)
            if others:
                restart = self.workload.interrupt(
                    job, at, hang_ms, int(self.rng.uniform(5, 15) * MINUTE)
                )
                self.busy_job[job] = max(self.busy_job.get(job, 0), restart)
            else:  # it was the last node: the job waits for it to come back
                self.workload.set_state(job, crash, DOWN)
                self.workload.set_state(job, until, RUN)
                self.busy_job[job] = max(self.busy_job.get(job, 0), until)
        else:
            self.workload.vacate(node, at, until, rejoin)
        return job if job >= 0 else None

    def reboot(self, node: int, at: int, offline_ms: int, reason: str) -> int:
        """Repair ends with a reboot: offline a few minutes, counters reset, node event."""
        back = at + offline_ms
        self.effect(Effect("offline", at, back, node))
        self.change(Change(back, "reset", node))
        self.node_event(
            back, self.fleet.gpu_nodes[node].target(), "repaired", "field-service", reason
        )
        return back

    def slice_job_down(self, slice_index: int, at: int, until: int) -> None:
        job = self.workload.slice_job[slice_index]
        if job >= 0:
            self.workload.set_state(job, at, DOWN)
            self.workload.set_state(job, until, RUN)
            self.busy_job[job] = max(self.busy_job.get(job, 0), until)

    def job_name(self, job: int | None) -> str | None:
        return self.workload.jobs[job].name if job is not None and job >= 0 else None
