"""The fault model as data: every fault type of reference/fault-model.md §1, its rate and label.

A `FaultType` row says how often a fault happens (per unit of exposure), how it is labelled in
the ground truth (class, expected outcome, must-not-cordon) and which rate knob scales it. The
telemetry each type produces is written in pipeline/sim/signatures.py.

Rates are the reference's; [G] marks our own guesses where the reference gives none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from pipeline.model import Target

Klass = Literal["hard", "gray", "flapping", "noise", "confounder", "planned", "silent", "property"]
Expected = Literal["cordon", "repair_slice", "finding", "none"]
# What one unit of exposure is; rates are per unit per hour (converted from per-day rows).
Unit = Literal[
    "gpu",  # every GPU
    "busy_gpu",  # GPUs of nodes that run a job at the start
    "node",  # GPU nodes
    "spot_node",  # GPU nodes of serving (spot) pools
    "rack",  # top-of-rack switches (racks of GPU nodes)
    "job",  # training jobs (multi-node GPU jobs and TPU slice jobs)
    "gpu_job",  # multi-node GPU training jobs
    "tpu_host",  # TPU hosts (machines of 4 or 8 chips)
    "ici_cable",  # ICI links (undirected) inside slices
    "cube",  # 4x4x4 cubes of OCS-connected 3D slices
    "chip",  # TPU chips
    "slice",  # TPU slices
    "zone",  # zones of the fleet
    "driver",  # GPU driver versions in the fleet
]
# hardware: x fleet_multiplier x intensity; software: x intensity; noise: x fleet_multiplier x
# noise_intensity; fixed: not scaled (prevalences, and episodes lasting days, which a higher
# rate would only pile up rather than compress).
Scale = Literal["hardware", "software", "noise", "fixed"]

DAY = 24.0


@dataclass(frozen=True, slots=True)
class FaultType:
    code: str  # G1 .. T5, plus C1 (spot preemption)
    variant: str  # distinguishes rows of one code with different rates or labels
    klass: Klass
    unit: Unit
    rate_per_h: float  # per unit per hour, before scaling
    scale: Scale
    expected: Expected
    must_not_cordon: bool
    title: str

    @property
    def key(self) -> str:
        return f"{self.code}/{self.variant}"


def _t(
    code: str,
    variant: str,
    klass: Klass,
    unit: Unit,
    rate_per_h: float,
    scale: Scale,
    expected: Expected,
    must_not_cordon: bool,
    title: str,
) -> FaultType:
    return FaultType(
        code, variant, klass, unit, rate_per_h, scale, expected, must_not_cordon, title
    )


# fmt: off
FAULT_TYPES: tuple[FaultType, ...] = (
    # --- GPU side, per GPU-hour (fault-model §1.2) -------------------------------------------
    _t("G1", "lost", "hard", "gpu", 2.4e-6, "hardware", "cordon", False,
       "GPU fell off the bus: XID 79, the GPU disappears from the scrape"),
    _t("G2", "fatal", "hard", "gpu", 1.4e-6, "hardware", "cordon", False,
       "fatal NVLink error: XID 74, NVLink CRC counters step, job dies"),
    # model-dependent rate: A100 2e-4, Hopper [G] 2e-6 (see gpu_rate_factor)
    _t("G2", "burst", "flapping", "gpu", 2.0e-4, "noise", "finding", False,
       "correctable NVLink burst: XID 74 and CRC counter steps, job survives"),
    _t("G3", "pcie", "gray", "gpu", 1.0e-6, "hardware", "cordon", False,
       "PCIe link degradation: replay counter rising, link gen/width downgraded, straggler"),
    _t("G4", "xid", "hard", "gpu", 2.1e-6, "hardware", "cordon", False,
       "hardware-caused XID 13/31/43/45 sequence recurring on the same GPU across jobs"),
    # per 80 GB H100; scaled per GB by model (see gpu_rate_factor)
    _t("G5", "hbm", "hard", "gpu", 9.4e-6, "hardware", "cordon", False,
       "HBM uncorrectable error: DBE + XID 48, then XID 63/64 and 94/95, row remap"),
    _t("G6", "sram", "hard", "gpu", 9.0e-7, "hardware", "cordon", False,
       "on-die SRAM uncorrectable error: DBE + XID 94/95 without row remapping"),
    _t("G7", "gsp", "hard", "gpu", 8.0e-7, "hardware", "cordon", False,
       "GSP failure: XID 119 then 154 (reboot required), GPU stops reporting"),
    _t("G8", "thermal", "gray", "gpu", 2.8e-7, "hardware", "cordon", False,
       "thermal interface failure: +5-15 C vs peers, thermal violations, SM clock drop"),
    _t("G9", "sdc", "silent", "gpu", 2.8e-7, "hardware", "none", False,
       "silent data corruption: no DCGM or XID signal (out of telemetry scope)"),
    _t("G10", "xid31", "noise", "busy_gpu", 8.5e-4, "noise", "none", True,
       "MMU XID 31 burst (~3 s) without lasting harm"),
    _t("G10", "sbe", "noise", "gpu", 2.0e-4, "noise", "none", True,
       "single-bit ECC burst (heavy-tailed size), correctable"),
    _t("G10", "remap", "noise", "gpu", 2.0e-5, "noise", "none", True,
       "one correctable remapped row"),
    # --- node side and fabric, per node-day (§1.3) -------------------------------------------
    _t("N1", "nic", "hard", "node", 6.3e-5 / DAY, "hardware", "cordon", False,
       "NIC failure: RDMA traffic of the GPU behind it stops, the job hangs then dies"),
    _t("N2", "host", "hard", "node", 1.27e-4 / DAY, "hardware", "cordon", False,
       "host hardware failure: the whole node stops reporting"),
    _t("N3", "operator", "planned", "node", 2.89e-4 / DAY, "software", "none", True,
       "operator maintenance: cordoned and drained by a person, offline, uncordoned"),
    # [G] GPU VMs see host maintenance roughly monthly
    _t("N3", "cloud", "planned", "node", 1.0 / 30 / DAY, "software", "none", True,
       "cloud maintenance: MAINTENANCE_SCHEDULED with notice, then STARTED/DONE, offline"),
    _t("N3", "cloud_slice", "planned", "slice", 1.0 / 30 / DAY, "software", "none", True,
       "cloud maintenance of a TPU slice: notice, every host offline, done"),
    # F1 totals 3.2e-4 per node-day: a ToR switch (1.7e-5 per switch-day, 4 nodes) plus cables
    _t("F1", "cable", "hard", "node", 3.16e-4 / DAY, "hardware", "finding", False,
       "network cable down: the node loses connectivity, its job hangs then dies"),
    _t("F1", "tor", "hard", "rack", 1.7e-5 / DAY, "hardware", "finding", True,
       "top-of-rack switch down: every node of the rack loses connectivity at once"),
    _t("F2", "flap", "flapping", "node", 10 * 3.2e-4 / DAY, "hardware", "finding", True,
       "link flapping: 3-10 down/up cycles, the job's throughput dips, self-recovers"),
    _t("F3", "gray", "gray", "node", 3.2e-5 / DAY, "hardware", "finding", False,
       "silent gray loss on a link: the node's network throughput is lower, job fail-slow"),
    # --- job-level confounders, per job-day (§1.4) -------------------------------------------
    _t("J1", "crash", "confounder", "job", 1.0 / DAY, "software", "none", True,
       "software crash: every rank stops at once, restart minutes later"),
    _t("J2", "nccl", "confounder", "job", 0.13 / DAY, "software", "none", True,
       "NCCL watchdog timeout: every rank hangs, then the job dies and restarts"),
    # ByteRobust: 41 of 62 illegal-memory-access incidents were user code, so 41/21 x G4's
    # rate, per GPU-hour; expressed per job-hour for a typical 32-GPU job
    _t("J3", "user_xid", "confounder", "gpu_job", 4.1e-6 * 32, "software", "none", True,
       "user-caused XID 13/31/43 on the GPUs of one job; moves with the job"),
    _t("J4", "restart", "planned", "job", 0.22 / DAY, "software", "none", True,
       "manual restart or code change: clean stop and restart"),
    # --- slow nodes and stragglers (§1.5) -------------------------------------------------------
    _t("S1", "failslow", "gray", "node", 0.3e-3 / DAY, "hardware", "cordon", False,
       "hardware fail-slow node: lower clocks/power/tensor activity, peers wait on it"),
    _t("S2", "comm", "confounder", "gpu_job", 3.0 / DAY, "software", "none", True,
       "communication fail-slow episode: the whole job slower, no node stands out"),
    _t("S3", "compute", "gray", "gpu_job", 2.0 / DAY, "software", "finding", True,
       "transient compute fail-slow of one rank (~10 min)"),
    _t("S4", "workload", "confounder", "gpu_job", 0.0, "fixed", "none", True,
       "workload straggler tied to a rank role (last pipeline stage); moves with the job"),
    _t("S5", "diurnal", "confounder", "zone", 0.0, "fixed", "none", True,
       "diurnal environment: 1-2 % mid-day throughput dip, temperatures up fleet-wide"),
    _t("S6", "reroute", "confounder", "cube", 0.04e-2 * 48 / DAY, "software", "none", True,
       "reroute penalty: every chip of the slice slower by the same fraction, links healthy"),
    # --- heterogeneity (§1.6) -------------------------------------------------------------------
    _t("H1", "lemon", "property", "node", 0.0, "fixed", "none", False,
       "lemon node: hard-fault rates x10-20, XID noise x10"),
    _t("H2", "offender", "property", "gpu", 0.0, "fixed", "none", True,
       "concentrated offender: heavy-tailed noise multiplier in the top 1 %"),
    _t("H3", "infant", "property", "node", 0.0, "fixed", "none", False,
       "new node (infant mortality): hard-fault rates x5 for its first 14 days"),
    _t("H4", "driver_wave", "confounder", "driver", 1.0 / 90 / DAY, "fixed", "none", False,
       "driver regression wave: GSP failures x100 on every node with that driver"),
    _t("H5", "hot", "confounder", "zone", 1.0 / 30 / DAY, "fixed", "none", True,
       "hot period in a zone: +5 C room temperature, hardware rates x1.5"),
    # --- TPU (§1.7) -----------------------------------------------------------------------------
    _t("T1", "host", "hard", "tpu_host", 3.3e-5, "hardware", "repair_slice", False,
       "TPU machine failure: the host stops reporting, the slice's job dies"),
    _t("T2", "ici", "hard", "ici_cable", 2.1e-6, "hardware", "repair_slice", False,
       "ICI cable failure: link health changes at both ends (sometimes flapping first)"),
    _t("T3", "ocs", "gray", "cube", 0.04e-2 * 48 / DAY, "hardware", "finding", True,
       "OCS failure: wraparound links of one dimension down, uniform reroute penalty"),
    # [G] every 1-2 weeks at Gemini-Ultra scale (~50k chips)
    _t("T4", "sdc", "silent", "chip", 8.0e-8, "hardware", "none", False,
       "TPU silent data corruption: no hardware signal (out of telemetry scope)"),
    # --- capacity (not in the fault model; labelled so detectors are not scored on it) -------
    _t("C1", "preempt", "planned", "spot_node", 0.1 / DAY, "software", "none", True,
       "spot preemption of a serving node: PREEMPTION, node deleted, recreated later"),
    # No fleet rate in the fault model: forced only (scenarios), so random runs are unchanged.
    _t("G1", "flap", "flapping", "gpu", 0.0, "hardware", "cordon", False,
       "GPU drops off the bus for seconds and comes back, again and again (riser, retimer)"),
)
# fmt: on
# T5 (fleet-level calibration targets) is not injected: pipeline/sim/calibration.py measures a
# run against them.

FAULT_TYPE_BY_KEY = {ft.key: ft for ft in FAULT_TYPES}
CODES: tuple[str, ...] = tuple(dict.fromkeys(ft.code for ft in FAULT_TYPES))


def fault_type(code: str, variant: str | None = None) -> FaultType:
    """The row for `code` (and `variant`; the first row of the code when omitted)."""
    for ft in FAULT_TYPES:
        if ft.code == code and (variant is None or ft.variant == variant):
            return ft
    variants = [ft.key for ft in FAULT_TYPES if ft.code == code]
    msg = f"unknown fault type {code}/{variant}; known: {variants or list(CODES)}"
    raise ValueError(msg)


class InjectedFault(msgspec.Struct, frozen=True, kw_only=True):
    """One ground-truth entry: what was injected, where, when, and what should happen.

    An event that touches several targets (a job crash over 4 nodes, a rack switch) has one
    entry per target, sharing `group`. `end_ms` may lie beyond the end of the run (a hard
    fault lasts until it is repaired).
    """

    fault_id: str
    group: str
    fault_type: str
    variant: str
    klass: Klass
    target: Target
    device: str | None = None
    # What failed, when a finding should name something other than the target: the leaf
    # switch or the link (cable) of a fabric fault, the node of a NIC fault.
    element: Target | None = None
    onset_ms: int
    end_ms: int
    expected: Expected
    must_not_cordon: bool
    job: str | None = None
    forced: bool = False
    description: str = ""


class ForcedFault(msgspec.Struct, frozen=True, kw_only=True):
    """A fault injected on purpose (tests, demos): type, time and optionally where.

    `target` names a GPU node or TPU slice (None: the first eligible one); `device` is a GPU
    index, a chip id or a directed ICI link index; `duration_s` overrides the drawn duration.
    """

    fault_type: str
    at_s: float
    variant: str | None = None
    target: str | None = None
    device: int | None = None
    duration_s: float | None = None


def parse_forced(spec: str) -> ForcedFault:
    """`TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]]`, e.g. `G1@300:node-3:5`, `T2/ici@60`."""
    head, sep, rest = spec.partition("@")
    if not sep:
        msg = f"fault spec {spec!r}: expected TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]]"
        raise ValueError(msg)
    code, _, variant = head.partition("/")
    parts = rest.split(":")
    try:
        at_s = float(parts[0])
        device = int(parts[2]) if len(parts) > 2 and parts[2] else None
    except ValueError:
        msg = f"fault spec {spec!r}: SECONDS and DEVICE must be numbers"
        raise ValueError(msg) from None
    fault_type(code.upper(), variant or None)  # raises on an unknown type
    return ForcedFault(
        fault_type=code.upper(),
        variant=variant or None,
        at_s=at_s,
        target=parts[1] if len(parts) > 1 and parts[1] else None,
        device=device,
    )
