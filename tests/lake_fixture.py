"""A small lake whose every analysis answer is known by construction (tests of sql/ and report).

Four hours from T0 of one-minute windows:

- pool `train`, zone `z-a`: nodes g1, g2 with two NVIDIA H100 GPUs each, all allocated to jobs;
  GPUs run at BUSY % except g2/1, which idles at IDLE % while allocated.
- pool `infer`, zone `z-b`: node g3, two NVIDIA A100 80GB GPUs, unallocated, at 0 %.
- pool `tpu`, zone `z-b`: slice s1 (v5litepod-4) on hosts h0, h1 with two chips each, allocated,
  at TPU_BUSY %.

The training jobs publish step times: STEP_S per rank on g1 and g2 (none on the others).

Health: g1 fails twice (episodes e1 at T0+1h, e2 at T0+3h, still degraded at the end); slice s1
is cordoned from T0+1h to T0+1h30 (episode s-e1). XIDs: g1 has XID 79 twice in hour 1; g3 has
XID 13 three times in hour 2. Findings, actions, alerts and capacity events are listed below.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import LakeSettings
from pipeline.lake.writer import LakeWriter
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    CapacitySnapshot,
    Entity,
    Evidence,
    Finding,
    MaintenanceWindow,
    NodeState,
    OutOfService,
    PriceUsed,
    QuotaInfo,
    QuotaOutlook,
    Reason,
    Reservations,
    Target,
    Utilization,
    WithheldRecord,
    XidEvent,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE, HOUR = 60_000, 3_600_000
HOURS = 4
END = T0 + HOURS * HOUR
BUSY, IDLE, TPU_BUSY = 80.0, 2.0, 50.0
H100, A100, V5E = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "v5litepod-4"
# (pool, zone, node, slice, accelerator, devices, allocated)
UNITS = [
    ("train", "z-a", "g1", None, H100, ("0", "1"), True),
    ("train", "z-a", "g2", None, H100, ("0", "1"), True),
    ("infer", "z-b", "g3", None, A100, ("0", "1"), False),
    ("tpu", "z-b", "h0", "s1", V5E, ("0", "1"), True),
    ("tpu", "z-b", "h1", "s1", V5E, ("2", "3"), True),
]


# the training jobs publish their step time (job_step_compute_seconds): seconds per rank
STEP_S = {"g1": 0.5, "g2": 0.25}


def util_of(node: str, device: str) -> float:
    if node == "g3":
        return 0.0
    if (node, device) == ("g2", "1"):
        return IDLE
    return TPU_BUSY if node.startswith("h") else BUSY


def utilization() -> list[Utilization]:
    rows = []
    for minute in range(HOURS * 60):
        for pool, zone, node, slice_, accelerator, devices, allocated in UNITS:
            for device in devices:
                util = util_of(node, device)
                rows.append(Utilization(
                    window_start=T0 + minute * MINUTE, window_s=60, cluster="c1", pool=pool,
                    zone=zone, node=node, slice=slice_, device=device, accelerator=accelerator,
                    job=f"job-{node}" if allocated else None, allocated=allocated,
                    util_mean=util, util_max=min(util + 10, 100.0), mem_used_frac=0.5,
                    power_w_mean=None if slice_ else 300.0, samples=4,
                    step_compute_s=STEP_S.get(node)))
    return rows


def target(name: str, kind: str = "node") -> Target:
    pool, zone = {"g1": ("train", "z-a"), "g2": ("train", "z-a"), "g3": ("infer", "z-b"),
                  "s1": ("tpu", "z-b")}[name]
    return Target(cluster="c1", kind=kind, name=name, pool=pool, zone=zone)  # type: ignore[arg-type]


def finding(at: int, name: str, check: str, severity: str, healthy: bool = False,
            kind: str = "node") -> Finding:
    return Finding(
        finding_id=f"f-{name}-{check}-{at}", ts=at,
        entity=Entity(kind="gpu" if kind == "node" else "tpu_chip", target=target(name, kind),
                      device="0"),
        check=check, severity=severity, healthy=healthy,  # type: ignore[arg-type]
        recommended_action="none" if healthy else "cordon",
        evidence=Evidence(metric="m", value=1.0, baseline=0.0, score=5.0, window_s=60))


# unhealthy: g1 xid (critical) x2 in hour 1, g1 ecc (warning) in hour 3, s1 ici (critical) in
# hour 1, g3 xid (warning) x3 in hour 2; plus heartbeats and an all-clear that must not count.
FINDINGS = [
    finding(T0 + HOUR + 1 * MINUTE, "g1", "xid", "critical"),
    finding(T0 + HOUR + 2 * MINUTE, "g1", "xid", "critical"),
    finding(T0 + 3 * HOUR + 1 * MINUTE, "g1", "ecc", "warning"),
    finding(T0 + HOUR + 1 * MINUTE, "s1", "ici", "critical", kind="slice"),
    *(finding(T0 + 2 * HOUR + i * MINUTE, "g3", "xid", "warning") for i in range(3)),
    *(finding(T0 + h * HOUR, "g2", "heartbeat", "info", healthy=True) for h in range(HOURS)),
    finding(T0 + 2 * HOUR, "g1", "xid", "info", healthy=True),
]


def state(at: int, name: str, value: str, episode: str | None, kind: str = "node") -> NodeState:
    return NodeState(ts=at, target=target(name, kind), state=value,  # type: ignore[arg-type]
                     since=at, episode=episode)


NODE_STATES = [
    state(T0, "g1", "healthy", None),
    state(T0 + 30 * MINUTE, "g1", "healthy", None),  # a change of detail, not of state
    state(T0 + HOUR, "g1", "degraded", "episode-e1"),
    state(T0 + HOUR + 5 * MINUTE, "g1", "cordoned", "episode-e1"),
    state(T0 + HOUR + 10 * MINUTE, "g1", "repairing", "episode-e1"),
    state(T0 + 2 * HOUR, "g1", "probation", "episode-e1"),
    state(T0 + 2 * HOUR + 30 * MINUTE, "g1", "healthy", None),
    state(T0 + 3 * HOUR, "g1", "degraded", "episode-e2"),
    state(T0, "s1", "healthy", None, "slice"),
    state(T0 + HOUR, "s1", "cordoned", "episode-s1", "slice"),
    state(T0 + HOUR + 30 * MINUTE, "s1", "healthy", None, "slice"),
]
S1_OUT_HOURS = 0.5
G1_FAILURE_GAP_HOURS = 2.0


def action(at: int, name: str, kind: str, dry_run: bool = False, node_kind: str = "node") -> Action:
    return Action(action_id=f"a-{name}-{kind}-{at}", ts=at, kind=kind,  # type: ignore[arg-type]
                  target=target(name, node_kind),
                  reason=Reason(checks=["xid"], finding_ids=["f-000001"], summary=f"{kind} {name}"),
                  dry_run=dry_run, proposal_id=f"p-{name}-{at}")


ACTIONS = [
    action(T0 + HOUR + 5 * MINUTE, "g1", "cordon"),
    action(T0 + HOUR + 10 * MINUTE, "g1", "repair"),
    action(T0 + HOUR + 5 * MINUTE, "s1", "repair_slice", dry_run=True, node_kind="slice"),
    action(T0 + 3 * HOUR + 5 * MINUTE, "g1", "cordon"),  # still open at the end
]


def xid(at: int, node: str, code: int, lines: int = 1) -> XidEvent:
    pool, zone = ("train", "z-a") if node == "g1" else ("infer", "z-b")
    return XidEvent(ts=at, cluster="c1", node=node, pool=pool, zone=zone, pci_bus_id="0000:53:00",
                    gpu_index=0, xid=code, message=f"NVRM: Xid {code}", source="simulator",
                    count=lines, last_ts=at + 20_000 if lines > 1 else None)


# g3's last record is a storm of 3 repeats the source coalesced: 5 XID 13 lines in all
XIDS = [xid(T0 + HOUR + i * MINUTE, "g1", 79) for i in range(2)] + [
    xid(T0 + 2 * HOUR + i * MINUTE, "g3", 13, lines=3 if i == 2 else 1) for i in range(3)]


def capacity(at: int, kind: str, zone: str, **fields: object) -> CapacityEvent:
    return CapacityEvent(event_id=f"cap-{kind}-{zone}-{at}", ts=at, provider="gcp",
                         source="test", kind=kind, severity="info",  # type: ignore[arg-type]
                         region=zone[:1], zone=zone, **fields)  # type: ignore[arg-type]


QUOTA_LIMIT, QUOTA_USAGE = 64.0, 50.0
CAPACITY = [
    capacity(T0 + 10 * MINUTE, "QUOTA_USAGE", "z-a",
             quota=QuotaInfo(metric="NVIDIA_H100_GPUS", limit=QUOTA_LIMIT, usage=40.0)),
    capacity(T0 + 2 * HOUR, "QUOTA_USAGE", "z-a",
             quota=QuotaInfo(metric="NVIDIA_H100_GPUS", limit=QUOTA_LIMIT, usage=QUOTA_USAGE)),
    capacity(T0 + 2 * HOUR, "STOCKOUT", "z-a"),
    capacity(T0 + 3 * HOUR, "MAINTENANCE_SCHEDULED", "z-b",
             window=MaintenanceWindow(start=END + HOUR, end=END + 2 * HOUR)),
]
ALERTS = [
    Alert(ts=T0 + HOUR + 5 * MINUTE, fingerprint="0123456789abcdef", status="firing",
          labels={"alertname": "NodeCordoned", "severity": "warning", "node": "g1"},
          annotations={"summary": "g1 cordoned"}, startsAt="2026-01-01T01:05:00Z"),
]



def withheld(at: int, name: str, reason: str, proposal_id: str) -> WithheldRecord:
    return WithheldRecord(ts=at, withheld_id=f"w-{proposal_id}-{reason}"[:128].replace(" ", "_"),
                          proposal_id=proposal_id, kind="cordon", target=target(name),
                          reason=reason, detail=f"{reason} in words", checks=["xid"])


# g2's cordon: held for the budget, then a common cause, then dropped when its checks cleared;
# g1's second cordon held for the budget at 3 h, then acted (ACTIONS, 3 h 5 min)
G2_PROPOSAL, G1_PROPOSAL = "p-g2-held", f"p-g1-{T0 + 3 * HOUR + 5 * MINUTE}"
WITHHELD = [
    withheld(T0 + HOUR + 6 * MINUTE, "g2", "budget", G2_PROPOSAL),
    withheld(T0 + HOUR + 20 * MINUTE, "g2", "common_cause", G2_PROPOSAL),
    withheld(T0 + 2 * HOUR, "g2", "dropped: cleared", G2_PROPOSAL),
    withheld(T0 + 3 * HOUR, "g1", "budget", G1_PROPOSAL),
]


def snapshot(at: int, zone: str, free: int, *, quota: bool = True) -> CapacitySnapshot:
    outlook = QuotaOutlook(metric="NVIDIA_H100_GPUS", limit=64.0, usage=50.0, headroom=14.0,
                           trend_per_h=2.0, exhausts_at=at + 7 * HOUR, confidence=0.8,
                           points=12)  # fmt: skip
    return CapacitySnapshot(
        ts=at, region="z", zone=zone, accelerator_type="nvidia-h100-80gb",
        provisioning_model="on-demand", devices=8, healthy=7, healthy_free=free,
        allocated=7 - free, allocated_idle=1, out_of_service=OutOfService(cordoned=1),
        quota=outlook if quota else None,
        reservations=Reservations(count=1, reserved=4, in_use=3, unused=1), stockouts_1h=2,
        useful_pct=60.0, usd_per_useful_hour=18.33,
        price=PriceUsed(usd_per_hour=11.0, basis="on-demand", source="test", location=zone),
    )  # fmt: skip


# Not in EVERYTHING (tests add them): the capacity stage's snapshots.
# z-a: three snapshots, the last 5 minutes before the end; z-c: one, hours before (gone since)
CAPACITY_SNAPSHOTS = [snapshot(END - 15 * MINUTE, "z-a", 5), snapshot(END - 10 * MINUTE, "z-a", 4),
             snapshot(END - 5 * MINUTE, "z-a", 3, quota=False),
             snapshot(T0 + HOUR, "z-c", 6)]  # fmt: skip


EVERYTHING = {
    "utilization": utilization, "findings": lambda: FINDINGS, "node_state": lambda: NODE_STATES,
    "actions": lambda: ACTIONS, "xid": lambda: XIDS, "capacity": lambda: CAPACITY,
    "alerts": lambda: ALERTS, "withheld": lambda: WITHHELD,
    "capacity_snapshots": list,  # none: capacity over this lake is the fold's (tests add some)
}


def build_lake(root: Path, settings: LakeSettings | None = None) -> Path:
    """Write the fixture through LakeWriter, one pseudo-topic per table, and mark it committed."""
    writer = LakeWriter(root, settings or LakeSettings())
    for table, events in EVERYTHING.items():
        for offset, event in enumerate(events()):
            writer.add(table, event, (f"t.{table}", 0, offset))
    writer.checkpoint()
    return root


DAMAGES = ("corrupt", "truncated", "zero-byte", "damaged pages")


def damage(path: Path, how: str) -> None:
    """Break a lake file the way disks and copies do.

    corrupt: garbage of the same size; truncated: cut in half; zero-byte: emptied; damaged
    pages: every data page scrambled, the footer left intact (only a full read notices).
    """
    data = path.read_bytes()
    if how == "corrupt":
        broken = bytes((i * 131 + 7) % 256 for i in range(len(data)))
    elif how == "truncated":
        broken = data[: len(data) // 2]
    elif how == "zero-byte":
        broken = b""
    elif how == "damaged pages":
        footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
        broken = data[:4] + bytes(b ^ 0x5A for b in data[4:footer_start]) + data[footer_start:]
    else:
        raise ValueError(f"damage: expected one of {DAMAGES}, got {how!r}")
    path.write_bytes(broken)
