"""Signatures of TPU faults (fault model §1.7: T1-T4, S6) and TPU slice maintenance.

A bad host or cable makes the whole slice the repair target; an OCS fault outside the slice's
own hardware reroutes traffic instead (no repair, a uniform slowdown).
"""

from __future__ import annotations

from pipeline.model import MaintenanceWindow
from pipeline.sim.effects import Change, Effect
from pipeline.sim.inject import HOUR, MINUTE, Injector, Placement

SECOND = 1000
REBOOT_MS = 5 * MINUTE


def _link_down(ctx: Injector, slice_index: int, link: int, start: int, end: int) -> None:
    ctx.effect(Effect("link_health", start, end, slice_index, link, 10.0))
    ctx.effect(Effect("link_flits", start, end, slice_index, link, 0.0))


def _repaired(ctx: Injector, slice_index: int, at: int, workers: list[int], reason: str) -> int:
    back = at + REBOOT_MS
    s = ctx.fleet.slices[slice_index]
    for worker in workers:
        ctx.effect(Effect("host_offline", at, back, slice_index, worker))
        ctx.change(Change(back, "tpu_reset", slice_index, worker))
    ctx.node_event(back, s.target(), "repaired", "field-service", reason)
    return back


def t1_host(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    worker = p.device if p.device >= 0 else 0
    # the cube stays out until the machine is repaired: ~5 days (fault model §2.5)
    end = p.onset_ms + ctx.repair_ms(p, 96.0)
    ctx.effect(Effect("host_offline", p.onset_ms, end, s.index, worker))
    chips = set(s.hosts[worker].chips)
    # The neighbours see their links into the dead host go down.
    for i, (chip, _, peer) in enumerate(s.links):
        if peer in chips and chip not in chips:
            _link_down(ctx, s.index, i, p.onset_ms, end)
    crash = p.onset_ms + int(ctx.rng.uniform(20, 60) * SECOND)  # mesh failure, job torn down
    back = _repaired(ctx, s.index, end, [worker], "T1 repaired: TPU machine replaced")
    ctx.slice_job_down(s.index, crash, back)
    if ctx.rng.random() < 0.5:
        ctx.capacity(
            p.onset_ms + 30 * SECOND,
            "HOST_ERROR",
            s.zone,
            severity="critical",
            source="gcp.tpu.node",
            target=s.target(),
            accelerator_type=s.accelerator_type,
            message=f"TPU worker {worker} of {s.name} is unhealthy (UNHEALTHY_MAINTENANCE)",
        )
    ctx.record(
        p, s.target(), end, device=f"w{worker}", job=ctx.job_name(ctx.workload.slice_job[s.index])
    )
    return back


def t2_ici(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    link = p.device if p.device >= 0 else 0
    ends = (link, s.reverse[link])
    t = p.onset_ms
    if ctx.rng.random() < 0.5:  # retries and flapping before the link gives up [G]
        stop = t + int(ctx.rng.uniform(2, 10) * MINUTE)
        for i in ends:
            ctx.effect(Effect("link_errors", t, stop, s.index, i, float(ctx.rng.uniform(5, 50))))
        while t < stop:
            bad = float(ctx.rng.integers(3, 8))
            for i in ends:
                ctx.effect(Effect("link_health", t, min(stop, t + MINUTE), s.index, i, bad))
            t += 2 * MINUTE
        t = stop
    end = t + ctx.repair_ms(p, 24.0)
    for i in ends:
        _link_down(ctx, s.index, i, t, end)
    crash = t + int(ctx.rng.uniform(10, 60) * SECOND)
    back = _repaired(ctx, s.index, end, [], "T2 repaired: ICI cable replaced")
    ctx.slice_job_down(s.index, crash, back)
    chip, port, _ = s.links[link]
    ctx.record(
        p,
        s.target(),
        end,
        device=f"{chip}:{port}",
        job=ctx.job_name(ctx.workload.slice_job[s.index]),
    )
    return back


def t3_ocs(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    dim = int(ctx.rng.integers(0, len(s.shape.dims)))
    size = s.shape.dims[dim]
    end = p.onset_ms + ctx.duration(p, 2 * HOUR, 24 * HOUR)
    for i, (chip, port, _) in enumerate(s.links):
        coord = s.coords[chip][dim]
        crosses_edge = (port == 2 * dim and coord == 0) or (
            port == 2 * dim + 1 and coord == size - 1
        )
        if crosses_edge:  # the wraparound links of this dimension go through the OCS
            _link_down(ctx, s.index, i, p.onset_ms, end)
    penalty = float(ctx.rng.uniform(0.005, 0.086))  # 0.5-8.6 % step-time penalty (S6)
    ctx.effect(Effect("chip_speed", p.onset_ms, end, s.index, -1, 1 - penalty))
    ctx.record(
        p,
        s.target(),
        end,
        device=f"dim{dim}",
        job=ctx.job_name(ctx.workload.slice_job[s.index]),
        description=f"{p.ftype.title} (dimension {dim}, penalty {100 * penalty:.1f} %)",
    )
    return end


def s6_reroute(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    end = p.onset_ms + ctx.duration(p, 2 * HOUR, 24 * HOUR)
    penalty = float(ctx.rng.uniform(0.005, 0.086))
    ctx.effect(Effect("chip_speed", p.onset_ms, end, s.index, -1, 1 - penalty))
    ctx.record(
        p,
        s.target(),
        end,
        job=ctx.job_name(ctx.workload.slice_job[s.index]),
        description=f"{p.ftype.title} (penalty {100 * penalty:.1f} %)",
    )
    return p.onset_ms  # the slice itself is fine; other faults may still land on it


def t4_sdc(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    ctx.record(
        p,
        s.target(),
        p.onset_ms + MINUTE,
        device=str(p.device),
        job=ctx.job_name(ctx.workload.slice_job[s.index]),
    )
    return p.onset_ms


def n3_cloud_slice(ctx: Injector, p: Placement) -> int:
    s = ctx.fleet.slices[p.node]
    target = s.target()
    notice = int(ctx.rng.uniform(15, 240) * 60) * SECOND  # whole seconds, as notice_s
    start = p.onset_ms + notice
    done = start + ctx.duration(p, 20 * MINUTE, 90 * MINUTE)
    window = MaintenanceWindow(start=start, end=done, notice_s=notice // 1000)
    for kind, ts, severity in (
        ("MAINTENANCE_SCHEDULED", p.onset_ms, "warning"),
        ("MAINTENANCE_STARTED", start, "warning"),
        ("MAINTENANCE_DONE", done, "info"),
    ):
        ctx.capacity(
            ts,
            kind,
            s.zone,
            severity=severity,
            source="gcp.tpu.node",
            target=target,
            accelerator_type=s.accelerator_type,
            window=window,
            message=f"{kind.lower().replace('_', ' ')} for TPU slice {s.name}",
        )
    for host in s.hosts:
        ctx.effect(Effect("host_offline", start + 30 * SECOND, done, s.index, host.worker_id))
        ctx.change(Change(done, "tpu_reset", s.index, host.worker_id))
    ctx.slice_job_down(s.index, start, done)
    ctx.record(p, target, done, job=ctx.job_name(ctx.workload.slice_job[s.index]))
    return done
