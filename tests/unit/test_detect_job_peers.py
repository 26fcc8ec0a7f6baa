"""A node against its job's other nodes: fail-slow hardware (cordon once it lasts), transient
slowness (watched), and what must not count (a workload straggler, a job-wide dip)."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec
import pytest

from pipeline.detect.job_peers import (
    NVLINK,
    PCIE,
    PERSISTENT,
    SM_ACTIVE,
    STEP,
    STEP_PERSISTENT,
    STRAGGLER,
    JobPeersState,
    detect_job_peers,
    peer_sample,
)
from pipeline.model import Finding, GpuSample
from tests.detect_fixture import SETTINGS, STEP_MS, T0, gpu_sample

NODES = ("n1", "n2", "n3")
ESCALATE = SETTINGS.slow_escalate_s * 1000 // STEP_MS  # scrapes until a slow run is persistent
# (node, step) -> metric overrides for every GPU of that node
Load = Callable[[str, int], dict[str, float]]


# (node, step) -> the step compute time its ranks publish, None: the job publishes none
Steps = Callable[[str, int], float | None]


def run(
    steps: int, load: Load, nodes: tuple[str, ...] = NODES, step_s: Steps | None = None
) -> list[Finding]:
    state: JobPeersState | None = None
    out: list[Finding] = []
    for step in range(steps):
        for i, node in enumerate(nodes):
            sample = gpu_sample(step, lambda g, s, n=node: load(n, s), node=node, seed=i)
            if step_s is not None:
                sample = published(sample, step_s(node, step), seed=i * 1000 + step)
            state, found = detect_job_peers(state, sample, SETTINGS)
            out += found
    return out


def published(sample: GpuSample, seconds: float | None, seed: int) -> GpuSample:
    """The sample with each rank's step compute time, ±1 % per rank."""
    if seconds is None:
        return sample
    rng = random.Random(seed)
    gpus = [
        msgspec.structs.replace(g, step_compute_s=round(seconds * rng.uniform(0.99, 1.01), 4))
        for g in sample.gpus
    ]
    return msgspec.structs.replace(sample, gpus=gpus)


def seen(findings: list[Finding]) -> list[tuple[str, str, bool, str]]:
    return [(f.check, f.entity.target.name, f.healthy, f.recommended_action) for f in findings]


def slow(node: str, factor: float, start: int, end: int = 10**9) -> Load:
    def load(n: str, step: int) -> dict[str, float]:
        return {"DCGM_FI_DEV_SM_CLOCK": 1980.0 * factor} if n == node and start <= step < end else {}

    return load


def test_a_node_slower_than_its_job_is_watched_then_cordoned_when_it_lasts() -> None:
    findings = run(ESCALATE + 20, slow("n2", 0.8, start=5))
    assert seen(findings) == [(STRAGGLER, "n2", False, "watch"), (PERSISTENT, "n2", False, "cordon")]
    watch, cordon = findings
    assert watch.ts == T0 + (5 + SETTINGS.gray_persist_samples - 1) * STEP_MS
    assert cordon.ts == T0 + (5 + ESCALATE) * STEP_MS
    assert watch.evidence is not None and watch.evidence.metric == "sm_clock_vs_job_peers"
    assert watch.evidence.baseline is not None and watch.evidence.value is not None
    assert watch.evidence.value < 0.85 * watch.evidence.baseline


def test_a_transient_slowdown_is_only_watched_and_clears() -> None:
    findings = run(ESCALATE + 20, slow("n3", 0.8, start=5, end=40))
    assert seen(findings) == [(STRAGGLER, "n3", False, "watch"), (STRAGGLER, "n3", True, "none")]


def test_a_slowdown_near_the_threshold_is_cordoned_though_some_scrapes_dip_under_it() -> None:
    # 6 % below the peers, but every 7th scrape only 4 %: each dip used to restart the
    # persistent count, so a node slowed by about the threshold was watched for ever
    def load(n: str, step: int) -> dict[str, float]:
        if n != "n2" or step < 5:
            return {}
        return {"DCGM_FI_DEV_SM_CLOCK": 1980.0 * (0.96 if step % 7 == 0 else 0.94)}

    findings = run(ESCALATE + 30, load)
    assert seen(findings) == [(STRAGGLER, "n2", False, "watch"), (PERSISTENT, "n2", False, "cordon")]
    # below half the threshold the hold is gone: a transient that ends is not bridged
    def transient(n: str, step: int) -> dict[str, float]:
        slow = n == "n2" and (5 <= step < 60 or 62 <= step < 120)  # two, 2 scrapes apart
        return {"DCGM_FI_DEV_SM_CLOCK": 1980.0 * 0.85} if slow else {}

    assert PERSISTENT not in {check for check, *_ in seen(run(ESCALATE + 30, transient))}


def test_two_node_job_the_slower_one_is_named() -> None:
    findings = run(30, slow("n1", 0.85, start=0), nodes=("n1", "n2"))
    assert seen(findings) == [(STRAGGLER, "n1", False, "watch")]


def test_more_work_at_full_clocks_and_a_job_wide_dip_are_not_stragglers() -> None:
    def load(node: str, step: int) -> dict[str, float]:
        dip = {"DCGM_FI_DEV_SM_CLOCK": 1800.0} if 20 <= step < 60 else {}  # every node
        busier = {"DCGM_FI_DEV_GPU_UTIL": 100.0} if node == "n3" else {"DCGM_FI_DEV_GPU_UTIL": 70.0}
        return {**busier, **dip}

    assert run(ESCALATE + 20, load) == []


def test_idle_gpus_and_a_node_alone_in_its_job_are_not_judged() -> None:
    idle = run(40, lambda n, s: {"DCGM_FI_DEV_GPU_UTIL": 5.0, "DCGM_FI_DEV_SM_CLOCK": 300.0}
               if n == "n2" else {})  # fmt: skip
    alone = run(40, slow("n1", 0.5, start=0), nodes=("n1",))
    assert idle == [] and alone == []


def test_findings_are_replay_stable() -> None:
    first = run(ESCALATE + 20, slow("n2", 0.8, start=5))
    again = run(ESCALATE + 20, slow("n2", 0.8, start=5))
    assert [f.finding_id for f in first] == [f.finding_id for f in again]


# Activity and throughput (issue 12 item 3): SM_ACTIVE, NVLink and PCIe bytes/s, against the
# job's median node; the fixture's healthy node moves 8e9 + 7e9 PCIe bytes/s.
FOUR = ("n1", "n2", "n3", "n4")
BUSY = {"DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_NVLINK_TX_BYTES": 6e10,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 6e10}  # fmt: skip


def low(node: str, factors: dict[str, float], start: int = 5) -> Load:
    """Every node busy; from `start` on, `node` moves `factors` of the others' level."""
    level = BUSY | {"DCGM_FI_PROF_PCIE_TX_BYTES": 8e9, "DCGM_FI_PROF_PCIE_RX_BYTES": 7e9}

    def load(n: str, step: int) -> dict[str, float]:
        if n != node or step < start:
            return dict(BUSY)
        return BUSY | {m: level[m] * f for m, f in factors.items()}

    return load


@pytest.mark.parametrize(
    ("check", "factors", "metric"),
    [
        (SM_ACTIVE, {"DCGM_FI_PROF_SM_ACTIVE": 0.6}, "sm_active_vs_job_peers"),
        (NVLINK, {"DCGM_FI_PROF_NVLINK_TX_BYTES": 0.5, "DCGM_FI_PROF_NVLINK_RX_BYTES": 0.5},
         "nvlink_bytes_vs_job_peers"),
        (PCIE, {"DCGM_FI_PROF_PCIE_TX_BYTES": 0.4, "DCGM_FI_PROF_PCIE_RX_BYTES": 0.4},
         "pcie_bytes_vs_job_peers"),
    ],
)  # fmt: skip
def test_a_node_doing_less_than_its_job_is_watched_with_the_signal_as_evidence(
    check: str, factors: dict[str, float], metric: str
) -> None:
    findings = run(40, low("n3", factors), nodes=FOUR)
    assert seen(findings) == [(check, "n3", False, "watch")]
    (found,) = findings
    assert found.ts == T0 + (5 + SETTINGS.gray_persist_samples - 1) * STEP_MS
    proof = found.evidence
    assert proof is not None and proof.metric == metric
    assert proof.value is not None and proof.baseline is not None and proof.score is not None
    assert proof.value < (1 - SETTINGS.job_activity_drop_frac) * proof.baseline
    assert proof.score == pytest.approx(1 - proof.value / proof.baseline)


def test_the_nodes_waiting_for_a_busier_one_are_not_stragglers() -> None:
    # A compute-slow (or overworked) node is busy while its peers wait: their activity falls
    # together and the majority sets the level, so no waiting node is named.
    def load(node: str, step: int) -> dict[str, float]:
        factor = 1.0 if node == "n1" or step < 5 else 0.6
        return {m: v * factor for m, v in BUSY.items()} | {
            "DCGM_FI_PROF_PCIE_TX_BYTES": 8e9 * factor, "DCGM_FI_PROF_PCIE_RX_BYTES": 7e9 * factor,
        }  # fmt: skip

    assert run(40, load, nodes=FOUR) == []
    assert run(40, load, nodes=("n1", "n2", "n3")) == []
    # two nodes: the one that waits cannot be told from a starved one, so neither is judged
    assert run(40, low("n2", {"DCGM_FI_PROF_SM_ACTIVE": 0.3}), nodes=("n1", "n2")) == []


def test_an_activity_straggler_clears_when_level_again() -> None:
    def load(node: str, step: int) -> dict[str, float]:
        return low("n2", {"DCGM_FI_PROF_SM_ACTIVE": 0.5})(node, step) if step < 30 else dict(BUSY)

    assert seen(run(60, load, nodes=FOUR)) == [
        (SM_ACTIVE, "n2", False, "watch"), (SM_ACTIVE, "n2", True, "none"),
    ]  # fmt: skip


# Step compute time, where the job publishes it (issue 12 item 3): only the slow rank computes
# longer (the others wait, which is not compute), so it is judged against the other nodes.
def steps(node: str, factor: float, start: int = 5, base: float = 0.8) -> Steps:
    return lambda n, step: base * factor if n == node and step >= start else base


def test_a_node_computing_its_steps_longer_at_lower_clocks_is_cordoned_when_it_lasts() -> None:
    # 4 % lower clocks: under clock_drop_frac, so the clock alone says nothing; the step time
    # (5 % longer) shows what it costs the job, and the two together are fail-slow hardware
    findings = run(ESCALATE + 20, slow("n2", 0.96, start=5), step_s=steps("n2", 1.05))
    assert seen(findings) == [(STEP, "n2", False, "watch"), (STEP_PERSISTENT, "n2", False, "cordon")]
    watch, cordon = findings
    assert watch.ts == T0 + (5 + SETTINGS.gray_persist_samples - 1) * STEP_MS
    assert cordon.ts == T0 + (5 + ESCALATE) * STEP_MS
    proof = watch.evidence
    assert proof is not None and proof.metric == "step_compute_s_vs_job_peers"
    assert proof.value == pytest.approx(0.8 * 1.05, rel=0.02)
    assert proof.baseline == pytest.approx(0.8, rel=0.02)
    assert proof.score is not None and proof.score >= SETTINGS.job_step_rise_frac


def test_longer_steps_at_full_clocks_are_watched_never_cordoned_nor_a_low_clock_alone() -> None:
    # more work on the node's pipeline stage (S4) computes longer too, at full clocks
    findings = run(ESCALATE + 20, lambda n, s: {}, step_s=steps("n3", 1.25))
    assert seen(findings) == [(STEP, "n3", False, "watch")]
    # and a clock a little low that costs no step time is nothing at all
    assert run(ESCALATE + 20, slow("n1", 0.96, start=5), step_s=lambda n, s: 0.8) == []


def test_the_nodes_waiting_for_a_slow_one_keep_their_compute_time_and_are_not_named() -> None:
    # two nodes: the slow one computes longer; the other's compute time is what it was
    findings = run(40, slow("n1", 0.9, start=0), nodes=("n1", "n2"), step_s=steps("n1", 1 / 0.9, 0))
    assert {name for _, name, _, _ in seen(findings)} == {"n1"}
    assert (STEP, "n1", False, "watch") in seen(findings)


def test_a_step_straggler_clears_when_level_again_and_unpublished_jobs_are_not_judged() -> None:
    back = steps("n2", 1.2, start=5)
    findings = run(60, lambda n, s: {}, step_s=lambda n, s: back(n, s) if s < 30 else 0.8)
    assert seen(findings) == [(STEP, "n2", False, "watch"), (STEP, "n2", True, "none")]
    # a node whose job publishes nothing, among nodes that do: no step comparison for it
    mixed = run(40, lambda n, s: {}, step_s=lambda n, s: None if n == "n2" else 0.8)
    assert mixed == []


def test_the_peer_sample_carries_the_median_step_time_of_the_nodes_ranks() -> None:
    sample = published(gpu_sample(3), 0.5, seed=1)
    levels = peer_sample(sample, SETTINGS).jobs["job-a"].levels
    ranks = sorted(g.step_compute_s or 0.0 for g in sample.gpus)
    assert levels[STEP] == pytest.approx((ranks[3] + ranks[4]) / 2)
    assert STEP not in peer_sample(gpu_sample(3), SETTINGS).jobs["job-a"].levels
