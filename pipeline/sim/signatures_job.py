"""Signatures of job-level confounders and fleet-level effects (J1-J4, S2-S5, H1-H5).

None of these is a fault of the node it shows on: every ground-truth entry written here is
labelled must-not-cordon (except the H1/H3 properties and the H4 wave, which only document the
run). A job-level event gets one entry per node (or slice) the job ran on at the time.
"""

from __future__ import annotations

import numpy as np

from pipeline.model import Target
from pipeline.sim.effects import Effect
from pipeline.sim.faults import fault_type
from pipeline.sim.fleet import GPUS_PER_NODE
from pipeline.sim.inject import HOUR, MINUTE, Injector, Placement
from pipeline.sim.schedule import DRIVER_WAVE_FACTOR, HOT_FACTOR, UnitRef, Window
from pipeline.sim.workload import DOWN, HANG, RUN

SECOND = 1000
DAY = 24 * HOUR


def _job_targets(ctx: Injector, job: int, ts: int) -> list[Target]:
    record = ctx.workload.jobs[job]
    if record.platform == "tpu":
        return [ctx.fleet.slices[record.members[0]].target()]
    return [ctx.fleet.gpu_nodes[n].target() for n in ctx.workload.members_at(job, ts)]


def _record_job(ctx: Injector, p: Placement, job: int, end: int, description: str = "") -> None:
    for target in _job_targets(ctx, job, p.onset_ms):
        ctx.record(p, target, end, job=ctx.workload.jobs[job].name, description=description)


def j1_crash(ctx: Injector, p: Placement) -> int:
    job = p.unit.a
    restart = p.onset_ms + ctx.duration(p, 5 * MINUTE, 15 * MINUTE)
    ctx.workload.set_state(job, p.onset_ms, DOWN)
    ctx.workload.set_state(job, restart, RUN)
    _record_job(ctx, p, job, restart)
    return restart


def j2_nccl(ctx: Injector, p: Placement) -> int:
    job = p.unit.a
    crash = p.onset_ms + ctx.collective_timeout_ms()
    restart = crash + int(ctx.rng.uniform(3, 10) * MINUTE)
    ctx.workload.set_state(job, p.onset_ms, HANG)
    ctx.workload.set_state(job, crash, DOWN)
    ctx.workload.set_state(job, restart, RUN)
    _record_job(ctx, p, job, restart)
    return restart


def j3_user_xid(ctx: Injector, p: Placement) -> int:
    # An illegal memory access in the user's code: XID 13 on the ranks that hit it, channel
    # cleanup (43, 45), the job dies and is restarted; the bug may strike again after the
    # restart, on other ranks: it follows the job, not a GPU.
    job = p.unit.a
    t = p.onset_ms
    end = t
    for attempt in range(2):
        members = ctx.workload.members_at(job, t)
        if not members or (attempt and ctx.rng.random() >= 0.5):
            break
        node = int(ctx.rng.choice(members))
        gpus = (
            range(GPUS_PER_NODE)
            if ctx.rng.random() < 0.4
            else [int(ctx.rng.integers(0, GPUS_PER_NODE))]
        )
        for i, gpu in enumerate(gpus):
            ctx.xid(t + 5 * i, node, gpu, int(ctx.rng.choice([13, 13, 31])))
            ctx.xid(t + 1 * SECOND + 5 * i, node, gpu, 43)
            ctx.xid(t + 2 * SECOND + 5 * i, node, gpu, 45)
        end = ctx.workload.interrupt(job, t + 3 * SECOND, 0, int(ctx.rng.uniform(3, 10) * MINUTE))
        t = end + int(ctx.rng.uniform(10, 60) * MINUTE)
    _record_job(ctx, p, job, end)
    return end


def j4_restart(ctx: Injector, p: Placement) -> int:
    job = p.unit.a
    restart = p.onset_ms + ctx.duration(p, 2 * MINUTE, 10 * MINUTE)
    ctx.workload.set_state(job, p.onset_ms, DOWN)
    ctx.workload.set_state(job, restart, RUN)
    _record_job(ctx, p, job, restart)
    return restart


def s2_comm(ctx: Injector, p: Placement) -> int:
    job = p.unit.a
    length = p.duration_ms or int(
        np.clip(ctx.rng.exponential(24 * MINUTE), 5 * MINUTE, 60 * MINUTE)
    )
    factor = float(ctx.rng.uniform(0.66, 0.9))  # 10-34 % slower steps (GREYHOUND)
    ctx.effect(Effect("job_speed", p.onset_ms, p.onset_ms + length, job, -1, factor))
    _record_job(ctx, p, job, p.onset_ms + length, f"{p.ftype.title} (x{factor:.2f})")
    return p.onset_ms + length


def s3_compute(ctx: Injector, p: Placement) -> int:
    job = p.unit.a
    members = ctx.workload.members_at(job, p.onset_ms)
    if not members:
        return p.onset_ms
    node = int(ctx.rng.choice(members))
    end = p.onset_ms + ctx.duration(p, 5 * MINUTE, 15 * MINUTE)
    ctx.effect(Effect("clock", p.onset_ms, end, node, -1, float(ctx.rng.uniform(0.75, 0.9))))
    ctx.record(p, ctx.fleet.gpu_nodes[node].target(), end, job=ctx.workload.jobs[job].name)
    return end


def s4_workload(ctx: Injector, p: Placement) -> int:
    job = ctx.workload.jobs[p.unit.a]
    if job.straggler is None:  # forced on a job drawn without one: its last node then
        job.straggler = job.members[-1]
    extra = float(ctx.rng.uniform(1.1, 1.35))  # the last pipeline stage does more work
    ctx.effect(Effect("work", p.onset_ms, ctx.end_ms, job.straggler, -1, extra))
    for node in job.members:
        ctx.record(
            p,
            ctx.fleet.gpu_nodes[node].target(),
            ctx.end_ms,
            job=job.name,
            description=f"{p.ftype.title}: stage on {ctx.fleet.gpu_nodes[job.straggler].name} "
            f"does x{extra:.2f} the work",
        )
    return p.onset_ms


def s5_diurnal(ctx: Injector, p: Placement) -> int:
    # Fleet-wide, so not any one node's fault: one entry per cluster with a pseudo-target
    # that no action can hit (the scorer then neither credits nor blames it).
    clusters = dict.fromkeys(n.cluster for n in ctx.fleet.gpu_nodes)
    for cluster in clusters:
        zone = next(n.zone for n in ctx.fleet.gpu_nodes if n.cluster == cluster)
        target = Target(cluster=cluster, kind="node", name="fleet-wide", pool="all", zone=zone)
        ctx.record(p, target, ctx.end_ms)
    return p.onset_ms


def h1_lemon(ctx: Injector, p: Placement) -> int:
    factor = float(ctx.hetero.lemon[p.node])
    ctx.record(
        p,
        ctx.fleet.gpu_nodes[p.node].target(),
        ctx.end_ms,
        description=f"{p.ftype.title} (hard-fault rates x{factor:.1f})",
    )
    return p.onset_ms


def h2_offender(ctx: Injector, p: Placement) -> int:
    factor = float(ctx.hetero.offender[p.node, p.device])
    ctx.record(
        p,
        ctx.fleet.gpu_nodes[p.node].target(),
        ctx.end_ms,
        device=str(p.device),
        description=f"{p.ftype.title} (noise x{factor:.0f})",
    )
    return p.onset_ms


def h3_infant(ctx: Injector, p: Placement) -> int:
    ctx.record(p, ctx.fleet.gpu_nodes[p.node].target(), ctx.end_ms)
    return p.onset_ms


def h4_driver_wave(ctx: Injector, p: Placement) -> int:
    driver = ctx.fleet.drivers[p.unit.a]
    end = p.onset_ms + ctx.duration(p, 1 * DAY, 3 * DAY)
    ctx.windows.append(Window(p.onset_ms, end, None, driver, DRIVER_WAVE_FACTOR))
    nodes = [n for n in ctx.fleet.gpu_nodes if n.driver == driver]
    if nodes:
        ctx.record(
            p,
            nodes[0].target(),
            end,
            description=f"{p.ftype.title}: driver {driver} on {len(nodes)} nodes",
        )
    return end


def h5_hot(ctx: Injector, p: Placement) -> int:
    zone = ctx.fleet.zones[p.unit.a]
    end = p.onset_ms + ctx.duration(p, 6 * HOUR, 48 * HOUR)
    ctx.windows.append(Window(p.onset_ms, end, zone, None, HOT_FACTOR))
    for node in ctx.fleet.gpu_nodes:
        if node.zone == zone:
            ctx.effect(Effect("temp", p.onset_ms, end, node.index, -1, 5.0, 20 * MINUTE))
            ctx.record(p, node.target(), end, description=f"{p.ftype.title} ({zone})")
    return end


def fleet_properties(ctx: Injector) -> list[Placement]:
    """Placements of the properties fixed at fleet creation (H1-H3, S4, S5)."""
    t0 = ctx.start_ms
    out = [
        Placement(fault_type("H1"), t0, UnitRef(n))
        for n in np.flatnonzero(ctx.hetero.lemon > 1).tolist()
    ]
    out += [
        Placement(fault_type("H3"), t0, UnitRef(n)) for n in np.flatnonzero(ctx.hetero.new).tolist()
    ]
    offender = ctx.hetero.offender
    if offender.size:
        threshold = np.quantile(offender, 0.99)
        top = np.argwhere(offender >= threshold)
        out += [Placement(fault_type("H2"), t0, UnitRef(int(a), int(b))) for a, b in top.tolist()]
    out += [
        Placement(fault_type("S4"), t0, UnitRef(j.index))
        for j in ctx.workload.jobs
        if j.straggler is not None
    ]
    if ctx.settings.diurnal:
        out.append(Placement(fault_type("S5"), t0, UnitRef(0)))
    return out
