"""Telemetry signatures of GPU, host and fabric faults (fault model §1.2, §1.3, S1, C1).

Each function records what one fault does (see inject.py) and returns the time until which its
node is taken. Timings and sizes marked [G] in the reference are drawn from the ranges it gives.

Fabric faults (N1, F1-F3) show in node_exporter's port state and counters (fabric.py: a port
down, a port flapping, errors rising with the link up, a NIC gone from the scrape) and, as a
DCGM view sees them, in the GPUs' PCIe traffic (GPUDirect RDMA to the NIC) and the job, which
hangs, fails or slows. Their expected outcome is a finding (the element is the network team's
to repair), except N1 (a dead NIC makes the node unusable: cordon). The truth's `device` names
the element: the port ("mlx5_2:1"), the leaf switch, or the NIC.
"""

from __future__ import annotations

import msgspec
import numpy as np

from pipeline.model import MaintenanceWindow, Target
from pipeline.sim.effects import Change, Effect
from pipeline.sim.fabric import PORTS, leaf_switch, rail_switch
from pipeline.sim.fleet import GpuNode
from pipeline.sim.gpu import HW_POWER_BRAKE
from pipeline.sim.inject import HOUR, MINUTE, Injector, Placement

SECOND = 1000
REBOOT_MS = 5 * MINUTE
LINK_DOWNED = "node_infiniband_link_downed_total"
CARRIER = "node_network_carrier_changes_total"
RECOVERY = "node_infiniband_link_error_recovery_total"


def _hard_gpu(ctx: Injector, p: Placement, median_repair_h: float, hang_ms: int) -> int:
    """Common tail of a hard GPU fault: the job loses the node, repair, reboot. Returns the
    time the node is back."""
    end = p.onset_ms + ctx.repair_ms(p, median_repair_h)
    job = ctx.take_out(p.node, p.onset_ms, end + REBOOT_MS, hang_ms)
    back = ctx.reboot(p.node, end, REBOOT_MS, f"{p.ftype.code} repaired")
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(p, node.target(), end, device=str(p.device), job=ctx.job_name(job))
    return back


def g1_lost(ctx: Injector, p: Placement) -> int:
    ctx.xid(p.onset_ms, p.node, p.device, 79)
    back = _hard_gpu(ctx, p, 8.0, ctx.collective_timeout_ms())
    ctx.effect(Effect("missing", p.onset_ms, back, p.node, p.device))
    return back


def g1_flap(ctx: Injector, p: Placement) -> int:
    # A loose riser or failing retimer: the GPU leaves the bus for seconds, the driver finds it
    # again, and the job on it dies each time; until someone reseats it.
    end = p.onset_ms + ctx.repair_ms(p, 8.0)
    node = ctx.fleet.gpu_nodes[p.node]
    first_job = ctx.workload.job_at(p.node, p.onset_ms)
    t = p.onset_ms
    while t < min(end, ctx.end_ms):
        gone = int(ctx.rng.uniform(8, 25) * SECOND)
        ctx.effect(Effect("missing", t, t + gone, p.node, p.device))
        job = ctx.workload.job_at(p.node, t)
        if job >= 0 and ctx.workload.jobs[job].kind == "train":
            ctx.workload.interrupt(job, t, 0, int(ctx.rng.uniform(3, 10) * MINUTE))
        t += int(ctx.rng.uniform(2, 15) * MINUTE)
    back = ctx.reboot(p.node, end, REBOOT_MS, "G1 repaired: GPU reseated")
    ctx.record(p, node.target(), end, device=str(p.device), job=ctx.job_name(first_job))
    return back


def g2_nvlink_fatal(ctx: Injector, p: Placement) -> int:
    crc = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    ctx.change(
        Change(p.onset_ms, "counter_add", p.node, p.device, crc, float(ctx.rng.integers(50, 5000)))
    )
    if ctx.rng.random() < 0.16:  # 16 % of NVLink events hit several GPUs (Delta)
        peer = (p.device + 1) % 8
        ctx.change(
            Change(p.onset_ms, "counter_add", p.node, peer, crc, float(ctx.rng.integers(10, 500)))
        )
    ctx.xid(p.onset_ms, p.node, p.device, 74)
    ctx.recovery_action(p.onset_ms + 1 * SECOND, p.node, p.device, 1)
    back = _hard_gpu(ctx, p, 2.0, int(ctx.rng.uniform(5, 60) * SECOND))
    ctx.effect(Effect("nvlink_bw", p.onset_ms, back, p.node, p.device, 0.0))
    return back


def g2_nvlink_burst(ctx: Injector, p: Placement) -> int:
    crc = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    t = p.onset_ms
    for _ in range(int(ctx.rng.integers(1, 4))):
        ctx.change(
            Change(t, "counter_add", p.node, p.device, crc, float(ctx.rng.integers(10, 500)))
        )
        link = int(ctx.rng.integers(0, 18))
        ctx.xid(
            t,
            p.node,
            p.device,
            74,
            f"NVLink: non-fatal error detected on link {link}"
            f"(0x0, 0x0, 0x0, 0x{int(ctx.rng.integers(1, 16)) << 8:x}, 0x0, 0x0, 0x0)",
        )
        t += int(ctx.rng.uniform(2, 25) * SECOND)
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(
        p,
        node.target(),
        t,
        device=str(p.device),
        job=ctx.job_name(ctx.workload.job_at(p.node, p.onset_ms)),
    )
    return p.onset_ms


def g3_pcie(ctx: Injector, p: Placement) -> int:
    # Replays grow first, the link then trains down (gen or width), the node turns straggler.
    end = p.onset_ms + ctx.repair_ms(p, 24.0)
    ramp = int(ctx.rng.uniform(10, 60) * MINUTE)
    ctx.effect(
        Effect(
            "rate:DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            p.onset_ms,
            end,
            p.node,
            p.device,
            float(ctx.rng.uniform(0.5, 5.0)),
            ramp,
        )
    )
    downgrade = p.onset_ms + int(ctx.rng.uniform(2, 20) * MINUTE)
    if ctx.rng.random() < 0.5:  # Gen5 trains down to Gen3, or x16 to x8
        ctx.effect(Effect("link_gen", downgrade, end, p.node, p.device, 3.0))
    else:
        ctx.effect(Effect("link_width", downgrade, end, p.node, p.device, 8.0))
    ctx.effect(Effect("speed", downgrade, end, p.node, p.device, float(ctx.rng.uniform(0.75, 0.9))))
    node = ctx.fleet.gpu_nodes[p.node]
    job = ctx.workload.job_at(p.node, p.onset_ms)
    lost = p.onset_ms + int(ctx.rng.uniform(1, 6) * HOUR)
    if ctx.rng.random() < 0.43 and lost < end:  # RSC: PCIe errors co-occur with XID 79
        ctx.xid(lost, p.node, p.device, 79)
        ctx.take_out(p.node, lost, end + REBOOT_MS, ctx.collective_timeout_ms())
        ctx.effect(Effect("missing", lost, end + REBOOT_MS, p.node, p.device))
    back = ctx.reboot(p.node, end, REBOOT_MS, "G3 repaired: GPU reseated")
    ctx.record(p, node.target(), end, device=str(p.device), job=ctx.job_name(job))
    return back


def g4_hardware_xid(ctx: Injector, p: Placement) -> int:
    # The same GPU keeps raising application-class XIDs whatever runs on it; half the time the
    # driver also asks for a reset (XID 154), which no application bug does.
    end = p.onset_ms + ctx.repair_ms(p, 12.0)
    node = ctx.fleet.gpu_nodes[p.node]
    first_job = ctx.workload.job_at(p.node, p.onset_ms)
    t = p.onset_ms
    wants_reset = ctx.rng.random() < 0.5
    while t < min(end, ctx.end_ms):
        code = int(ctx.rng.choice([13, 31]))
        ctx.xid(t, p.node, p.device, code)
        ctx.xid(t + 1 * SECOND, p.node, p.device, 43)
        ctx.xid(t + 2 * SECOND, p.node, p.device, 45)
        job = ctx.workload.job_at(p.node, t)
        if job >= 0 and ctx.workload.jobs[job].kind == "train":
            ctx.workload.interrupt(job, t + 3 * SECOND, 0, int(ctx.rng.uniform(3, 10) * MINUTE))
        t += int(ctx.rng.uniform(15, 90) * MINUTE)
    if wants_reset:
        ctx.recovery_action(p.onset_ms + 3 * SECOND, p.node, p.device, 1)
    back = ctx.reboot(p.node, end, REBOOT_MS, "G4 repaired: GPU replaced")
    ctx.record(p, node.target(), end, device=str(p.device), job=ctx.job_name(first_job))
    return back


def g5_hbm(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    t = p.onset_ms
    if ctx.rng.random() < 0.83:  # Perlmutter: most DBE GPUs logged SBEs before [G lead time]
        lead = int(ctx.rng.uniform(1, 12) * HOUR)
        ctx.effect(
            Effect(
                "rate:DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                max(ctx.start_ms, t - lead),
                t,
                p.node,
                p.device,
                float(ctx.rng.uniform(0.01, 0.2)),
                lead,
            )
        )
    ctx.change(Change(t, "counter_add", p.node, p.device, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0))
    ctx.xid(t, p.node, p.device, 48)
    remap_fails = node.model.key != "a100" and ctx.rng.random() < 0.33
    if remap_fails:
        ctx.xid(t + 200, p.node, p.device, 64)
        ctx.change(
            Change(t + 200, "gauge_set", p.node, p.device, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0)
        )
    else:
        ctx.xid(t + 200, p.node, p.device, 63)
        ctx.change(
            Change(t + 200, "gauge_set", p.node, p.device, "DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0)
        )
    ctx.change(
        Change(
            t + 200, "counter_add", p.node, p.device, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0
        )
    )
    uncontained = ctx.rng.random() < 0.58  # H100: 19 of 33 contained/uncontained were 95
    ctx.xid(t + 400, p.node, p.device, 95 if uncontained else 94)
    if uncontained:
        ctx.recovery_action(t + 600, p.node, p.device, 1)
    # P(interrupt | event) ~ 0.36: uncontained errors mostly kill the job, contained rarely.
    interrupts = ctx.rng.random() < (0.55 if uncontained else 0.1)
    end = t + ctx.repair_ms(p, 24.0 if remap_fails else 2.0)
    job = ctx.workload.job_at(p.node, t)
    if interrupts:
        ctx.take_out(p.node, t, end + REBOOT_MS, int(ctx.rng.uniform(5, 60) * SECOND))
    back = ctx.reboot(
        p.node,
        end,
        REBOOT_MS,
        "G5 repaired: " + ("GPU replaced" if remap_fails else "GPU reset, row remapped"),
    )
    code = 64 if remap_fails else 63
    ctx.record(
        p,
        node.target(),
        end,
        device=str(p.device),
        job=ctx.job_name(job),
        description=f"{p.ftype.title} (XID {code}, {95 if uncontained else 94}"
        f"{', job interrupted' if interrupts else ''})",
    )
    return back


def g6_sram(ctx: Injector, p: Placement) -> int:
    t = p.onset_ms
    ctx.change(Change(t, "counter_add", p.node, p.device, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0))
    uncontained = ctx.rng.random() < 0.6
    ctx.xid(
        t,
        p.node,
        p.device,
        95 if uncontained else 94,
        "Uncontained: SM (0x1). RST: Yes, D-RST: No"
        if uncontained
        else "Contained: SM (0x1). RST: No, D-RST: No",
    )
    ctx.recovery_action(t + 500, p.node, p.device, 1)
    return _hard_gpu(ctx, p, 2.0, int(ctx.rng.uniform(5, 60) * SECOND))


def g7_gsp(ctx: Injector, p: Placement) -> int:
    t = p.onset_ms
    ctx.xid(t, p.node, p.device, 119 if ctx.rng.random() < 0.8 else 120)
    ctx.recovery_action(t + 1500, p.node, p.device, 2)
    back = _hard_gpu(ctx, p, 2.0, ctx.collective_timeout_ms())
    # The GPU is wedged: NVML returns errors, dcgm-exporter leaves its series out.
    ctx.effect(Effect("missing", t + 2 * SECOND, back, p.node, p.device))
    return back


def g8_thermal(ctx: Injector, p: Placement) -> int:
    # The thermal interface degrades: the same power now heats the GPU more, until the driver
    # throttles its clocks to stay at the throttle temperature; the job waits on it.
    end = p.onset_ms + ctx.repair_ms(p, 48.0)
    ramp = int(ctx.rng.uniform(10, 30) * MINUTE)
    resistance = float(ctx.rng.uniform(1.3, 1.6))
    ctx.effect(Effect("thermal_r", p.onset_ms, end, p.node, p.device, resistance, ramp))
    back = ctx.reboot(p.node, end, REBOOT_MS, "G8 repaired: thermal interface redone")
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(
        p,
        node.target(),
        end,
        device=str(p.device),
        job=ctx.job_name(ctx.workload.job_at(p.node, p.onset_ms)),
    )
    return back


def g9_sdc(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(
        p,
        node.target(),
        p.onset_ms + MINUTE,
        device=str(p.device),
        job=ctx.job_name(ctx.workload.job_at(p.node, p.onset_ms)),
    )
    return p.onset_ms


def g10_noise(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    t = end = p.onset_ms
    variant = p.ftype.variant
    if variant == "xid31":
        for _ in range(int(ctx.rng.integers(2, 6))):
            ctx.xid(end, p.node, p.device, 31)
            end += int(ctx.rng.uniform(0.2, 1.0) * SECOND)
    elif variant == "sbe":
        total = min(1e5, float(ctx.rng.lognormal(3.0, 2.0)))
        steps = int(ctx.rng.integers(1, 6))
        for _ in range(steps):
            ctx.change(
                Change(
                    end,
                    "counter_add",
                    p.node,
                    p.device,
                    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                    max(1.0, float(round(total / steps))),
                )
            )
            end += int(ctx.rng.uniform(5, 15) * SECOND)
    else:
        ctx.change(
            Change(t, "counter_add", p.node, p.device, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0)
        )
    ctx.record(
        p,
        node.target(),
        end,
        device=str(p.device),
        job=ctx.job_name(ctx.workload.job_at(p.node, t)),
    )
    return t


def n1_nic(ctx: Injector, p: Placement) -> int:
    # One NIC per GPU pair on the PCIe switch: that pair's RDMA traffic stops.
    end = p.onset_ms + ctx.repair_ms(p, 12.0)
    first = 2 * int(ctx.rng.integers(0, 4)) if p.device < 0 else p.device - p.device % 2
    for gpu in (first, first + 1):
        ctx.effect(Effect("pcie_bw", p.onset_ms, end, p.node, gpu, 0.02))
    ctx.effect(Effect("fab_missing", p.onset_ms, end + REBOOT_MS, p.node, first // 2))
    job = ctx.take_out(p.node, p.onset_ms, end + REBOOT_MS, ctx.collective_timeout_ms())
    back = ctx.reboot(p.node, end, REBOOT_MS, "N1 repaired: NIC replaced")
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(
        p, node.target(), end, device=f"mlx5_{first // 2}", element=node.target(),
        job=ctx.job_name(job),
    )
    return back


def n2_host(ctx: Injector, p: Placement) -> int:
    end = p.onset_ms + ctx.repair_ms(p, 24.0)
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.effect(Effect("offline", p.onset_ms, end, p.node))
    job = ctx.take_out(p.node, p.onset_ms, end + REBOOT_MS, ctx.collective_timeout_ms())
    if ctx.rng.random() < 0.5:
        ctx.capacity(
            p.onset_ms + 30 * SECOND,
            "HOST_ERROR",
            node.zone,
            severity="critical",
            source="gcp.compute.audit",
            target=node.target(),
            accelerator_type=node.model.gke_accelerator,
            message=f"compute.instances.hostError: host of {node.name} failed; VM restarted",
        )
    back = ctx.reboot(p.node, end, REBOOT_MS, "N2 repaired: host hardware replaced")
    ctx.record(p, node.target(), end, job=ctx.job_name(job))
    return back


def n3_operator(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    target = node.target()
    actor = "ops:" + str(ctx.rng.choice(["alice", "bob", "chen", "dana"]))
    drained = p.onset_ms + int(ctx.rng.uniform(1, 5) * MINUTE)
    back = drained + 2 * MINUTE + ctx.duration(p, 30 * MINUTE, 240 * MINUTE)
    ctx.node_event(p.onset_ms, target, "cordoned", actor, "planned maintenance: firmware update")
    ctx.node_event(drained, target, "drained", actor, "planned maintenance: firmware update")
    job = ctx.take_out(p.node, drained, back, 0)
    ctx.effect(Effect("offline", drained + 2 * MINUTE, back, p.node))
    ctx.change(Change(back, "reset", p.node))
    ctx.node_event(back, target, "uncordoned", actor, "maintenance done")
    ctx.record(p, target, back, job=ctx.job_name(job))
    return back


def n3_cloud(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    target = node.target()
    notice = int(ctx.rng.uniform(15, 240) * 60) * SECOND  # whole seconds, as notice_s
    start = p.onset_ms + notice
    done = start + ctx.duration(p, 20 * MINUTE, 90 * MINUTE)
    window = MaintenanceWindow(start=start, end=done, notice_s=notice // 1000)
    job = ctx.take_out(p.node, start, done, 0)
    ctx.effect(Effect("offline", start + 30 * SECOND, done, p.node))
    ctx.change(Change(done, "reset", p.node))
    for kind, ts, severity, what in (
        (
            "MAINTENANCE_SCHEDULED",
            p.onset_ms,
            "warning",
            "scheduled (TERMINATE_ON_HOST_MAINTENANCE)",
        ),
        ("MAINTENANCE_STARTED", start, "warning", "started"),
        ("MAINTENANCE_DONE", done, "info", "done"),
    ):
        ctx.capacity(
            ts,
            kind,
            node.zone,
            severity=severity,
            target=target,
            window=window,
            accelerator_type=node.model.gke_accelerator,
            message=f"Host maintenance of {node.name} {what}",
        )
    ctx.record(p, target, done, job=ctx.job_name(job))
    return done


def f1_cable(ctx: Injector, p: Placement) -> int:
    end = p.onset_ms + ctx.repair_ms(p, 6.0)
    port = int(ctx.rng.integers(0, PORTS)) if p.device < 0 else p.device % PORTS
    _lose_network(ctx, p, p.node, end, port, _link(ctx.fleet.gpu_nodes[p.node], port))
    return end


def f1_tor(ctx: Injector, p: Placement) -> int:
    """The rack's leaf switch fails: every port of its nodes. In a rail-optimised pool the
    rack has no leaf of its own; one rail switch of its scalable unit fails instead: that
    HCA of every node of the unit, across racks."""
    end = p.onset_ms + ctx.repair_ms(p, 4.0)
    rack = [n for n in ctx.fleet.gpu_nodes if n.rack == p.unit.a]
    rails = rack[0].rail_group if rack else None
    # the rail from the onset, not the generator: the draws of every later fault stay as
    # they are with or without rail-optimised pools
    port = (p.unit.a + p.onset_ms // 1000) % PORTS if rails else -1
    struck = [n for n in ctx.fleet.gpu_nodes if n.rail_group == rails] if rails else rack
    for node in struck:
        name = rail_switch(node, port) if rails else leaf_switch(node)
        assert name is not None
        switch = msgspec.structs.replace(node.target(), kind="switch", name=name)
        _lose_network(ctx, p, node.index, end, port, switch)
        ctx.busy_node[node.index] = max(ctx.busy_node.get(node.index, 0), end)
    return end


def _link(node: GpuNode, port: int) -> Target:
    """A node's fabric port as the link target the localiser names (`node:device:port`)."""
    return msgspec.structs.replace(node.target(), kind="link", name=f"{node.name}:mlx5_{port}:1")


def _lose_network(
    ctx: Injector, p: Placement, node: int, end: int, port: int, element: Target
) -> None:
    ctx.effect(Effect("pcie_bw", p.onset_ms, end, node, -1, 0.01))
    ctx.effect(Effect("fab_down", p.onset_ms, end, node, port))
    _toggle(ctx, p.onset_ms, node, port, carrier=1.0)  # down: link_downed +1, one carrier edge
    ctx.change(Change(end, "fabric_add", node, port, CARRIER, 1.0))  # back up: the other edge
    job = ctx.take_out(node, p.onset_ms, end, ctx.collective_timeout_ms())
    device = element.name.split(":", 1)[1] if element.kind == "link" else element.name
    ctx.record(
        p, ctx.fleet.gpu_nodes[node].target(), end, device=device, element=element,
        job=ctx.job_name(job),
    )


def _toggle(ctx: Injector, ts: int, node: int, port: int, carrier: float = 2.0) -> None:
    ctx.change(Change(ts, "fabric_add", node, port, LINK_DOWNED, 1.0))
    ctx.change(Change(ts, "fabric_add", node, port, CARRIER, carrier))
    ctx.change(Change(ts, "fabric_add", node, port, RECOVERY, 1.0))


def f2_flap(ctx: Injector, p: Placement) -> int:
    t = p.onset_ms
    job = ctx.workload.job_at(p.node, t)
    port = int(ctx.rng.integers(0, PORTS)) if p.device < 0 else p.device % PORTS
    for _ in range(int(ctx.rng.integers(3, 11))):
        down = int(ctx.rng.uniform(0.5, 3) * SECOND)
        ctx.effect(Effect("fab_down", t, t + down, p.node, port))
        _toggle(ctx, t, p.node, port)
        # RDMA retransmits and NCCL retries stretch each outage well past the link's downtime;
        # a 10 s scrape sees the dip as a lower average.
        stall = down + int(ctx.rng.uniform(8, 15) * SECOND)
        ctx.effect(Effect("pcie_bw", t, t + stall, p.node, -1, 0.3))
        if job >= 0:  # every rank of the job stalls with it
            ctx.effect(Effect("job_speed", t, t + stall, job, -1, 0.6))
        t += down + int(ctx.rng.uniform(5, 30) * SECOND)
    node = ctx.fleet.gpu_nodes[p.node]
    ctx.record(
        p, node.target(), t, device=f"mlx5_{port}:1", element=_link(node, port),
        job=ctx.job_name(job),
    )
    return t


def f3_gray(ctx: Injector, p: Placement) -> int:
    # A failing optic: symbol errors and link-level retransmits (recoveries), no link-down.
    end = p.onset_ms + ctx.repair_ms(p, 48.0)
    port = int(ctx.rng.integers(0, PORTS)) if p.device < 0 else p.device % PORTS
    rate = float(ctx.rng.lognormal(np.log(2.0), 1.0))  # errors per second [G]
    ramp = int(ctx.rng.uniform(0, 10) * MINUTE)
    ctx.effect(Effect("fab_errors", p.onset_ms, end, p.node, port, rate, ramp))
    ctx.effect(Effect("pcie_bw", p.onset_ms, end, p.node, -1, float(ctx.rng.uniform(0.6, 0.85))))
    ctx.effect(Effect("speed", p.onset_ms, end, p.node, -1, float(ctx.rng.uniform(0.85, 0.95))))
    ctx.record(
        p,
        ctx.fleet.gpu_nodes[p.node].target(),
        end,
        device=f"mlx5_{port}:1",
        element=_link(ctx.fleet.gpu_nodes[p.node], port),
        job=ctx.job_name(ctx.workload.job_at(p.node, p.onset_ms)),
    )
    return end


def s1_failslow(ctx: Injector, p: Placement) -> int:
    # Step time x U(1.05, 1.5) until repaired; shows as lower clocks and power on this node.
    end = p.onset_ms + ctx.repair_ms(p, 72.0)
    factor = 1 / float(ctx.rng.uniform(1.05, 1.5))
    ctx.effect(Effect("clock", p.onset_ms, end, p.node, -1, factor))
    if ctx.rng.random() < 0.5:
        ctx.effect(Effect("power", p.onset_ms, end, p.node, -1, 0.8))
        ctx.effect(Effect("throttle", p.onset_ms, end, p.node, -1, float(HW_POWER_BRAKE)))
        ctx.effect(Effect("rate:DCGM_FI_DEV_POWER_VIOLATION", p.onset_ms, end, p.node, -1, 5e8))
    back = ctx.reboot(p.node, end, REBOOT_MS, "S1 repaired")
    ctx.record(
        p,
        ctx.fleet.gpu_nodes[p.node].target(),
        end,
        job=ctx.job_name(ctx.workload.job_at(p.node, p.onset_ms)),
        description=f"{p.ftype.title} (step time x{1 / factor:.2f})",
    )
    return back


def c1_preempt(ctx: Injector, p: Placement) -> int:
    node = ctx.fleet.gpu_nodes[p.node]
    target = node.target()
    deleted = p.onset_ms + 30 * SECOND
    back = deleted + ctx.duration(p, 10 * MINUTE, 60 * MINUTE)
    ctx.capacity(
        p.onset_ms,
        "PREEMPTION",
        node.zone,
        severity="warning",
        source="gcp.compute.preemption",
        target=target,
        accelerator_type=node.model.gke_accelerator,
        message=f"compute.instances.preempted: spot VM {node.name} is being preempted",
    )
    job = ctx.take_out(p.node, p.onset_ms, back, 0)
    ctx.node_event(deleted, target, "deleted", "gke", "spot VM preempted")
    ctx.effect(Effect("offline", deleted, back, p.node))
    ctx.change(Change(back, "reset", p.node))
    ctx.node_event(back, target, "created", "gke", "node pool scaled back up")
    ctx.record(p, target, back, job=ctx.job_name(job))
    return back
