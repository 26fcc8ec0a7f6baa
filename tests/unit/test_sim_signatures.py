"""Every fault type, injected on purpose into a quiet fleet, shows its signature in telemetry.

One small simulation per type (random faults off, no diurnal cycle), then a check written from
the fault model's description of what the type looks like (reference/fault-model.md §1).
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from pipeline.config import SimSettings
from pipeline.model import (
    CapacityEvent,
    Event,
    FabricSample,
    GpuSample,
    IciSample,
    NodeEvent,
    TpuSample,
    XidEvent,
)
from pipeline.sim import FAULT_TYPES, ForcedFault, InjectedFault, Simulation

AT_S = 120
GPU_SETTINGS = SimSettings(
    duration_s=900, gpu_nodes=8, clusters=1, tpu_slices=0, random_faults=False, diurnal=False,
    seed=2,
)
TPU_SETTINGS = SimSettings(
    duration_s=900, gpu_nodes=0, tpu_slices=4, random_faults=False, diurnal=False, seed=3
)


@dataclass
class Run:
    sim: Simulation
    events: list[Event]
    fault: InjectedFault  # the first ground-truth entry of the forced fault

    def __post_init__(self) -> None:
        self._by_node: dict[str, list[GpuSample]] = {}
        for event in self.events:
            if isinstance(event, GpuSample):
                self._by_node.setdefault(event.node, []).append(event)

    @property
    def onset(self) -> int:
        return self.fault.onset_ms

    def entries(self) -> list[InjectedFault]:
        return [f for f in self.sim.ground_truth if f.forced]

    def xids(self, node: str | None = None) -> list[XidEvent]:
        return [
            e for e in self.events
            if isinstance(e, XidEvent) and (node is None or e.node == node)
        ]

    def scrapes(self, node: str) -> list[GpuSample]:
        return self._by_node.get(node, [])

    def series(self, node: str, gpu: int, metric: str) -> list[tuple[int, float]]:
        return [
            (s.ts, g.metrics[metric])
            for s in self.scrapes(node)
            for g in s.gpus
            if g.index == gpu
        ]

    def node_mean(self, node: str, metric: str, lo: int, hi: int) -> float:
        values = [
            g.metrics[metric] for s in self.scrapes(node) if lo <= s.ts < hi for g in s.gpus
        ]
        return statistics.fmean(values)

    def step_mean(self, node: str, lo: int, hi: int) -> float:
        """Mean step compute time the node's ranks published in [lo, hi) (the job must publish)."""
        values = [
            g.step_compute_s for s in self.scrapes(node) if lo <= s.ts < hi for g in s.gpus
        ]
        assert values and None not in values, f"{node}: no step compute time published"
        return statistics.fmean(v for v in values if v is not None)

    def chips(self, slice_name: str) -> list[TpuSample]:
        return [e for e in self.events if isinstance(e, TpuSample) and e.slice == slice_name]

    def ici(self, slice_name: str) -> list[IciSample]:
        return [e for e in self.events if isinstance(e, IciSample) and e.slice == slice_name]

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


@functools.cache
def training_nodes() -> tuple[str, ...]:
    """The nodes of the first multi-node training job of the GPU test fleet."""
    sim = Simulation(GPU_SETTINGS)
    job = next(j for j in sim.workload.jobs if j.multi_node)
    return tuple(sim.fleet.gpu_nodes[n].name for n in job.members)


def run(
    key: str,
    *,
    target: str | None = None,
    device: int | None = None,
    duration_s: float | None = None,
    tpu: bool = False,
    at_s: float = AT_S,
    span_s: int | None = None,
) -> Run:
    code, _, variant = key.partition("/")
    spec = ForcedFault(
        fault_type=code, variant=variant or None, at_s=at_s, target=target, device=device,
        duration_s=duration_s,
    )
    settings = TPU_SETTINGS if tpu else GPU_SETTINGS
    if span_s is not None:
        settings = msgspec.structs.replace(settings, duration_s=span_s)
    sim = Simulation(settings, [spec])
    entries = [f for f in sim.ground_truth if f.forced]
    assert entries, f"{key}: no ground truth"
    return Run(sim, list(sim.events()), entries[0])


def _before_after(values: list[tuple[int, float]], onset: int, settle_ms: int = 0) -> tuple[list[float], list[float]]:
    before = [v for ts, v in values if ts < onset]
    after = [v for ts, v in values if ts >= onset + settle_ms]
    return before, after


# --- GPU --------------------------------------------------------------------------------------


def check_g1(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    assert [x.xid for x in r.xids(node)] == [79]
    assert "GPU has fallen off the bus." in r.xids(node)[0].message
    present = [ts for ts, _ in r.series(node, gpu, "DCGM_FI_DEV_GPU_UTIL")]
    assert present and max(present) < r.onset  # gone from the scrape from the onset on
    others = [s for s in r.scrapes(node) if s.ts >= r.onset]
    assert others and all(len(s.gpus) == 7 for s in others)


def check_g1_flap(r: Run) -> None:
    # Out of the scrape for seconds at a time, back in between, no XID; again and again.
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    assert r.xids(node) == []
    with_it = [any(g.index == gpu for g in s.gpus) for s in r.scrapes(node) if s.ts >= r.onset]
    returns = sum(1 for was, now in itertools.pairwise(with_it) if now and not was)
    assert returns >= 2
    assert sum(with_it) > len(with_it) // 2  # mostly there: a flapper, not a lost GPU


def check_g2_fatal(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    codes = [x.xid for x in r.xids(node)]
    assert codes[0] == 74 and 154 in codes
    crc = r.series(node, gpu, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    before, after = _before_after(crc, r.onset)
    assert after[0] >= max(before) + 50
    nvlink = r.series(node, gpu, "DCGM_FI_PROF_NVLINK_TX_BYTES")
    assert max(v for ts, v in nvlink if ts >= r.onset) == 0.0


def check_g2_burst(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    xids = r.xids(node)
    assert xids and all(x.xid == 74 and "non-fatal" in x.message for x in xids)
    crc = r.series(node, gpu, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    before, after = _before_after(crc, r.onset)
    assert after[-1] >= max(before) + 10
    assert all(len(s.gpus) == 8 for s in r.scrapes(node))  # the job and the GPU carry on
    assert r.fault.klass == "flapping" and r.fault.expected == "finding"


def check_g3(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    replays = r.series(node, gpu, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    before, after = _before_after(replays, r.onset)
    assert after[-1] - max(before) >= 20
    gen = [v for ts, v in r.series(node, gpu, "DCGM_FI_DEV_PCIE_LINK_GEN") if ts > r.onset + 1_200_000]
    width = [v for ts, v in r.series(node, gpu, "DCGM_FI_DEV_PCIE_LINK_WIDTH") if ts > r.onset + 1_200_000]
    assert min(gen) < 5 or min(width) < 16  # the link trained down


def check_g4(r: Run) -> None:
    node = r.fault.target.name
    codes = [x.xid for x in r.xids(node)]
    assert codes[0] in (13, 31) and 43 in codes and 45 in codes
    assert all(x.gpu_index == int(r.fault.device or 0) for x in r.xids(node))


def check_g5(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    codes = [x.xid for x in r.xids(node)]
    assert codes[0] == 48 and ({63, 64} & set(codes)) and ({94, 95} & set(codes))
    later = [g for s in r.scrapes(node) if s.ts > r.onset for g in s.gpus if g.index == gpu]
    metrics = later[0].metrics
    assert metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] >= 1
    assert metrics["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] >= 1
    flag = "DCGM_FI_DEV_ROW_REMAP_PENDING" if 63 in codes else "DCGM_FI_DEV_ROW_REMAP_FAILURE"
    assert metrics[flag] == 1.0


def check_g6(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    codes = [x.xid for x in r.xids(node)]
    assert codes[0] in (94, 95) and 63 not in codes and 64 not in codes
    later = [g for s in r.scrapes(node) if s.ts > r.onset for g in s.gpus if g.index == gpu]
    assert later[0].metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] >= 1
    assert later[0].metrics["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 0


def check_g7(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    xids = r.xids(node)
    assert xids[0].xid in (119, 120)
    assert any(x.xid == 154 and "0x2 (Node Reboot Required)" in x.message for x in xids)
    present = [ts for ts, _ in r.series(node, gpu, "DCGM_FI_DEV_GPU_UTIL")]
    assert max(present) < r.onset + 10_000


def check_g8(r: Run) -> None:
    node, gpu = r.fault.target.name, int(r.fault.device or 0)
    late = r.onset + 1_200_000
    scrapes = [s for s in r.scrapes(node) if s.ts >= late]
    for scrape in scrapes[-3:]:
        hot = next(g for g in scrape.gpus if g.index == gpu).metrics
        peers = [g.metrics for g in scrape.gpus if g.index != gpu]
        peer_temp = statistics.median(p["DCGM_FI_DEV_GPU_TEMP"] for p in peers)
        peer_clock = statistics.median(p["DCGM_FI_DEV_SM_CLOCK"] for p in peers)
        assert hot["DCGM_FI_DEV_GPU_TEMP"] >= peer_temp + 4
        assert hot["DCGM_FI_DEV_SM_CLOCK"] <= 0.96 * peer_clock
        assert int(hot["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]) & (0x20 | 0x40)  # sw/hw thermal
    violations = r.series(node, gpu, "DCGM_FI_DEV_THERMAL_VIOLATION")
    assert violations[-1][1] > violations[0][1]


def check_silent(r: Run) -> None:
    assert r.xids() == [] and r.fault.expected == "none" and r.fault.klass == "silent"


def check_g10_xid31(r: Run) -> None:
    xids = r.xids(r.fault.target.name)
    assert len(xids) >= 2 and {x.xid for x in xids} == {31}
    assert max(x.ts for x in xids) - min(x.ts for x in xids) <= 5_000
    assert r.fault.must_not_cordon


def check_g10_sbe(r: Run) -> None:
    sbe = r.series(r.fault.target.name, int(r.fault.device or 0), "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    before, after = _before_after(sbe, r.onset)
    assert after[-1] > max(before) and r.fault.must_not_cordon


def check_g10_remap(r: Run) -> None:
    rows = r.series(r.fault.target.name, int(r.fault.device or 0), "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")
    before, after = _before_after(rows, r.onset)
    assert after[-1] == max(before) + 1 and r.fault.must_not_cordon


def check_n1(r: Run) -> None:
    node = r.fault.target.name
    nic = int((r.fault.device or "mlx5_0").rpartition("_")[2])
    for gpu in (2 * nic, 2 * nic + 1):
        before, after = _before_after(r.series(node, gpu, "DCGM_FI_PROF_PCIE_TX_BYTES"), r.onset)
        assert max(after) < 0.05 * statistics.median(before)
    # node_exporter: the NIC's port is gone from the node's scrapes, the others stay
    ports = [(e.ts, {p.device for p in e.ports}) for e in r.events
             if isinstance(e, FabricSample) and e.node == node]  # fmt: skip
    assert all(f"mlx5_{nic}" in seen for ts, seen in ports if ts < r.onset)
    after_ports = [seen for ts, seen in ports if r.onset <= ts < r.fault.end_ms]
    assert after_ports and all(seen == {f"mlx5_{i}" for i in range(4)} - {f"mlx5_{nic}"}
                               for seen in after_ports)  # fmt: skip


def check_n2(r: Run) -> None:
    seen = [s.ts for s in r.scrapes(r.fault.target.name)]
    assert seen and max(seen) < r.onset


def check_n3_operator(r: Run) -> None:
    node = r.fault.target.name
    events = [e for e in r.of(NodeEvent) if isinstance(e, NodeEvent) and e.target == node]
    assert [e.kind for e in events][:2] == ["cordoned", "drained"]
    assert all(e.actor.startswith("ops:") for e in events)
    drained = events[1].ts
    gap = [s.ts for s in r.scrapes(node) if drained + 150_000 <= s.ts < min(r.fault.end_ms, r.sim.end_ms)]
    assert gap == []
    assert r.fault.must_not_cordon and r.fault.klass == "planned"


def check_n3_cloud(r: Run) -> None:
    caps = [e for e in r.of(CapacityEvent) if isinstance(e, CapacityEvent) and e.target == r.fault.target.name]
    scheduled = caps[0]
    assert scheduled.kind == "MAINTENANCE_SCHEDULED" and scheduled.window is not None
    assert scheduled.window.end == r.fault.end_ms and scheduled.ts == r.onset
    assert scheduled.window.notice_s * 1000 == scheduled.window.start - scheduled.ts
    assert r.fault.must_not_cordon


def check_f1(r: Run) -> None:
    for entry in r.entries():
        before, after = _before_after(
            [(s.ts, s.gpus[0].metrics["DCGM_FI_PROF_PCIE_TX_BYTES"]) for s in r.scrapes(entry.target.name)],
            r.onset,
        )
        assert max(after) < 0.02 * max(before) + 1e5


def check_f1_tor(r: Run) -> None:
    racks = {r.sim.fleet.node_by_name(e.target.name).rack for e in r.entries()}  # type: ignore[union-attr]
    rack_nodes = [n.name for n in r.sim.fleet.gpu_nodes if n.rack in racks]
    assert sorted(e.target.name for e in r.entries()) == sorted(rack_nodes)
    check_f1(r)


def check_f2(r: Run) -> None:
    node = r.fault.target.name
    pcie = [(s.ts, s.gpus[0].metrics["DCGM_FI_PROF_PCIE_TX_BYTES"]) for s in r.scrapes(node)]
    before = statistics.median(v for ts, v in pcie if ts < r.onset)
    during = [v for ts, v in pcie if r.onset <= ts <= r.fault.end_ms]
    assert min(during) < 0.5 * before
    after = [v for ts, v in pcie if ts > r.fault.end_ms + 20_000]
    assert statistics.median(after) > 0.8 * before  # it recovers by itself
    assert r.fault.must_not_cordon


def check_f3(r: Run) -> None:
    node = r.fault.target.name
    before = r.node_mean(node, "DCGM_FI_PROF_PCIE_TX_BYTES", 0, r.onset)
    after = r.node_mean(node, "DCGM_FI_PROF_PCIE_TX_BYTES", r.onset, r.sim.end_ms)
    assert after < 0.9 * before


def _job_nodes(r: Run) -> list[str]:
    return [e.target.name for e in r.entries()]


def check_j1(r: Run) -> None:
    nodes = _job_nodes(r)
    assert len(nodes) >= 2 and all(e.must_not_cordon for e in r.entries())
    first_down = {
        n: min(
            s.ts for s in r.scrapes(n)
            if s.ts >= r.onset and s.gpus[0].metrics["DCGM_FI_DEV_GPU_UTIL"] == 0
        )
        for n in nodes
    }
    assert len(set(first_down.values())) == 1  # every rank stops at once
    back = [s for s in r.scrapes(nodes[0]) if s.ts > r.fault.end_ms]
    assert back and back[-1].gpus[0].metrics["DCGM_FI_DEV_GPU_UTIL"] > 90


def check_j2(r: Run) -> None:
    for node in _job_nodes(r):
        hung = [s.gpus[0].metrics for s in r.scrapes(node) if r.onset < s.ts < r.onset + 300_000]
        assert all(m["DCGM_FI_DEV_GPU_UTIL"] > 90 and m["DCGM_FI_PROF_SM_ACTIVE"] < 0.1 for m in hung)
        assert all(m["DCGM_FI_DEV_POWER_USAGE"] < 250 for m in hung)


def check_j3(r: Run) -> None:
    nodes = set(_job_nodes(r))
    xids = r.xids()
    assert xids and {x.node for x in xids} <= nodes
    assert {x.job for x in xids} == {r.fault.job} and {13, 43, 45} & {x.xid for x in xids}
    assert all(e.must_not_cordon and e.expected == "none" for e in r.entries())


def check_j4(r: Run) -> None:
    node = _job_nodes(r)[0]
    down = [s for s in r.scrapes(node) if r.onset <= s.ts < r.fault.end_ms]
    assert down and all(s.gpus[0].metrics["DCGM_FI_DEV_GPU_UTIL"] == 0 for s in down)
    assert r.fault.klass == "planned" and r.fault.must_not_cordon


def check_s1(r: Run) -> None:
    node = r.fault.target.name
    peers = [n for n in training_nodes() if n != node]
    late = r.onset + 60_000
    clock = r.node_mean(node, "DCGM_FI_DEV_SM_CLOCK", late, r.sim.end_ms)
    peer_clock = statistics.fmean(r.node_mean(p, "DCGM_FI_DEV_SM_CLOCK", late, r.sim.end_ms) for p in peers)
    assert clock < 0.96 * peer_clock
    for peer in peers:  # the peers wait on it: less work done per second than before
        before = r.node_mean(peer, "DCGM_FI_PROF_SM_ACTIVE", 0, r.onset)
        assert r.node_mean(peer, "DCGM_FI_PROF_SM_ACTIVE", late, r.sim.end_ms) < 0.97 * before
    # the job publishes step compute time: the slow node's ranks compute longer, while the
    # peers' waiting for it is not compute time (theirs stays as it was)
    step = r.step_mean(node, late, r.sim.end_ms)
    assert step > 1.04 * r.step_mean(node, 0, r.onset)
    for peer in peers:
        assert step > 1.04 * r.step_mean(peer, late, r.sim.end_ms)
        assert abs(r.step_mean(peer, late, r.sim.end_ms) / r.step_mean(peer, 0, r.onset) - 1) < 0.02


def check_s2(r: Run) -> None:
    nodes = _job_nodes(r)
    for node in nodes:
        before = r.node_mean(node, "DCGM_FI_PROF_SM_ACTIVE", 0, r.onset)
        during = r.node_mean(node, "DCGM_FI_PROF_SM_ACTIVE", r.onset, r.fault.end_ms)
        assert during < 0.93 * before
        clock = r.node_mean(node, "DCGM_FI_DEV_SM_CLOCK", r.onset, r.fault.end_ms)
        assert clock > 0.97 * 1980  # no node stands out: clocks untouched
    assert r.fault.must_not_cordon


def check_s3(r: Run) -> None:
    node = r.fault.target.name
    during = r.node_mean(node, "DCGM_FI_DEV_SM_CLOCK", r.onset, r.fault.end_ms)
    after = r.node_mean(node, "DCGM_FI_DEV_SM_CLOCK", r.fault.end_ms + 20_000, r.sim.end_ms)
    assert during < 0.92 * after  # transient: back to normal afterwards


def check_s4(r: Run) -> None:
    job = next(j for j in r.sim.workload.jobs if j.name == r.fault.job)
    assert job.straggler is not None
    straggler = r.sim.fleet.gpu_nodes[job.straggler].name
    late = r.onset + 20_000
    busy = r.node_mean(straggler, "DCGM_FI_PROF_SM_ACTIVE", late, r.sim.end_ms)
    for node in _job_nodes(r):
        if node != straggler:
            assert r.node_mean(node, "DCGM_FI_PROF_SM_ACTIVE", late, r.sim.end_ms) < 0.95 * busy
    clock = r.node_mean(straggler, "DCGM_FI_DEV_SM_CLOCK", late, r.sim.end_ms)
    assert clock > 0.97 * 1980  # busier, not broken
    # more work per step shows in the straggler's step compute time, at full clocks
    step = r.step_mean(straggler, late, r.sim.end_ms)
    assert all(
        step > 1.08 * r.step_mean(node, late, r.sim.end_ms)
        for node in _job_nodes(r) if node != straggler
    )  # fmt: skip
    assert all(e.must_not_cordon for e in r.entries())


def check_c1(r: Run) -> None:
    node = r.fault.target.name
    kinds = [e.kind for e in r.of(NodeEvent) if isinstance(e, NodeEvent) and e.target == node]
    assert kinds[0] == "deleted"
    caps = [e for e in r.of(CapacityEvent) if isinstance(e, CapacityEvent) and e.kind == "PREEMPTION"]
    assert caps and caps[0].target == node
    gone = [s for s in r.scrapes(node) if r.onset + 40_000 <= s.ts < r.fault.end_ms]
    assert gone == [] and r.fault.must_not_cordon


def check_h5(r: Run) -> None:
    node = r.fault.target.name
    before = r.node_mean(node, "DCGM_FI_DEV_GPU_TEMP", 0, r.onset)
    late = r.node_mean(node, "DCGM_FI_DEV_GPU_TEMP", r.sim.end_ms - 300_000, r.sim.end_ms)
    assert late > before + 2 and r.fault.must_not_cordon


def check_h4(r: Run) -> None:
    rates = r.sim.rates["G7/gsp"]
    units = [i for i, d in enumerate(rates.exposure.driver) if d == r.sim.fleet.node_by_name(r.fault.target.name).driver]  # type: ignore[union-attr]
    assert units
    assert rates.rate_at(units[0], r.onset + 1) == pytest.approx(100 * rates.rate_at(units[0], r.onset - 1))


# --- TPU --------------------------------------------------------------------------------------


def check_t1(r: Run) -> None:
    s = r.sim.fleet.slice_by_name(r.fault.target.name)
    assert s is not None
    worker = int((r.fault.device or "w0")[1:])
    host = s.hosts[worker].node
    assert max(x.ts for x in r.chips(s.name) if x.node == host) < r.onset
    dead = set(s.hosts[worker].chips)
    into_dead = [
        link for sample in r.ici(s.name) if sample.ts > r.onset
        for link in sample.links if link.peer_chip_id in dead
    ]
    assert into_dead and all(link.health == 10 for link in into_dead)
    late = [c.metrics["duty_cycle_pct"] for x in r.chips(s.name) if x.ts > r.onset + 120_000 for c in x.chips]
    assert late and max(late) == 0.0  # the slice's job is torn down
    assert r.fault.expected == "repair_slice"


def check_t2(r: Run) -> None:
    s = r.sim.fleet.slice_by_name(r.fault.target.name)
    assert s is not None
    chip, port = (int(x) for x in (r.fault.device or "0:0").split(":"))
    peer = next(p for c, q, p in s.links if (c, q) == (chip, port))
    ends = [
        (x.ts, link) for x in r.ici(s.name) for link in x.links
        if (link.chip_id, link.peer_chip_id) in ((chip, peer), (peer, chip))
    ]
    late = [link for ts, link in ends if ts > r.fault.onset_ms + 11 * 60_000]
    assert len({(link.chip_id, link.peer_chip_id) for link in late}) == 2  # both ends report it
    assert all(link.health == 10 for link in late)
    flits = [link.flits_tx for ts, link in ends if ts > r.fault.onset_ms + 11 * 60_000 and link.chip_id == chip]
    assert flits[-1] == flits[0]
    assert r.fault.expected == "repair_slice"


def check_t3(r: Run) -> None:
    s = r.sim.fleet.slice_by_name(r.fault.target.name)
    assert s is not None
    down = {
        (link.chip_id, link.port) for x in r.ici(s.name) if x.ts > r.onset
        for link in x.links if link.health == 10
    }
    dim = int((r.fault.device or "dim0")[3:])
    assert down and all(port // 2 == dim for _, port in down)
    assert len(down) == 2 * (s.shape.chips // s.shape.dims[dim])  # one plane each way
    _uniform_slowdown(r, s.name)
    assert r.fault.must_not_cordon and r.fault.expected == "finding"


def check_s6(r: Run) -> None:
    name = r.fault.target.name
    assert all(link.health == 0 for x in r.ici(name) for link in x.links)
    _uniform_slowdown(r, name)
    assert r.fault.must_not_cordon


def _uniform_slowdown(r: Run, name: str) -> None:
    def mean(metric: str, lo: int, hi: int) -> float:
        return statistics.fmean(
            c.metrics[metric] for x in r.chips(name) if lo <= x.ts < hi for c in x.chips
        )

    before = mean("tensorcore_util", 0, r.onset)
    after = mean("tensorcore_util", r.onset, r.sim.end_ms)
    assert after < before * 0.998
    assert mean("duty_cycle_pct", r.onset, r.sim.end_ms) > 95  # still busy, just slower


def check_n3_slice(r: Run) -> None:
    caps = [e for e in r.of(CapacityEvent) if isinstance(e, CapacityEvent) and e.target == r.fault.target.name]
    assert caps[0].kind == "MAINTENANCE_SCHEDULED" and caps[0].target_kind == "slice"
    assert r.fault.must_not_cordon


Check = Callable[[Run], None]
CASES: dict[str, tuple[Check, dict[str, object]]] = {
    "G1/lost": (check_g1, {}),
    "G1/flap": (check_g1_flap, {"span_s": 1800}),
    "G2/fatal": (check_g2_fatal, {}),
    "G2/burst": (check_g2_burst, {}),
    "G3/pcie": (check_g3, {"at_s": 60, "span_s": 1500}),
    "G4/xid": (check_g4, {}),
    "G5/hbm": (check_g5, {}),
    "G6/sram": (check_g6, {}),
    "G7/gsp": (check_g7, {}),
    "G8/thermal": (check_g8, {"duration_s": 86_400.0, "at_s": 60, "span_s": 1500}),
    "G9/sdc": (check_silent, {}),
    "G10/xid31": (check_g10_xid31, {}),
    "G10/sbe": (check_g10_sbe, {}),
    "G10/remap": (check_g10_remap, {}),
    "N1/nic": (check_n1, {}),
    "N2/host": (check_n2, {}),
    "N3/operator": (check_n3_operator, {}),
    "N3/cloud": (check_n3_cloud, {}),
    "F1/cable": (check_f1, {}),
    "F1/tor": (check_f1_tor, {}),
    "F2/flap": (check_f2, {}),
    "F3/gray": (check_f3, {}),
    "J1/crash": (check_j1, {"span_s": 1200}),
    "J2/nccl": (check_j2, {}),
    "J3/user_xid": (check_j3, {}),
    "J4/restart": (check_j4, {}),
    "S1/failslow": (check_s1, {}),
    "S2/comm": (check_s2, {}),
    "S3/compute": (check_s3, {"span_s": 1200}),
    "S4/workload": (check_s4, {}),
    "C1/preempt": (check_c1, {}),
    "H4/driver_wave": (check_h4, {}),
    "H5/hot": (check_h5, {"at_s": 60, "span_s": 1500}),
    "T1/host": (check_t1, {"tpu": True}),
    "T2/ici": (check_t2, {"tpu": True, "device": 3, "at_s": 60}),
    "T3/ocs": (check_t3, {"tpu": True}),
    "T4/sdc": (check_silent, {"tpu": True}),
    "S6/reroute": (check_s6, {"tpu": True, "target": "fp-us-east5-tpu-v5p-128-03"}),
    "N3/cloud_slice": (check_n3_slice, {"tpu": True}),
}
# Fleet properties (not injected as events) are covered in test_sim_rates.py; T5 is a
# calibration target, not a fault.
PROPERTIES = {"H1/lemon", "H2/offender", "H3/infant", "S5/diurnal"}


def test_every_fault_type_has_a_signature_check() -> None:
    keys = {ft.key for ft in FAULT_TYPES}
    assert keys - PROPERTIES == set(CASES)


@pytest.mark.parametrize("key", sorted(CASES))
def test_signature(key: str) -> None:
    check, options = CASES[key]
    kwargs = dict(options)
    if key.startswith("S1/"):  # on a node of a multi-node job, so peers can wait on it
        kwargs.setdefault("target", training_nodes()[0])
    check(run(key, **kwargs))  # type: ignore[arg-type]
