"""The static-threshold baseline the detection benchmark scores FleetPulse against, and the
benchmark's own arithmetic (merging seeds, the false-cordon goal). No timings here."""

from __future__ import annotations

from bench.baseline_thresholds import ThresholdDetector, Thresholds
from bench.detection import headline, merge
from bench.summary import _false_cordons_met
from pipeline.backtest.score import ClassScore, Score
from pipeline.model import GpuReading, GpuSample, IciLink, IciSample, NodeEvent, XidEvent

T0 = 1_767_225_600_000
S = 1000


def gpu(index: int, temp: float = 60.0, util: float = 90.0, job: str | None = "job-1",
        dbe: float = 0.0) -> GpuReading:
    return GpuReading(
        index=index, uuid=f"GPU-0000000{index}-aaaa", pci_bus_id=f"0000:{index + 16:02x}:00",
        model="NVIDIA H100 80GB HBM3", job=job,
        metrics={"DCGM_FI_DEV_GPU_TEMP": temp, "DCGM_FI_DEV_GPU_UTIL": util,
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": dbe})


def scrape(ts: int, node: str = "n1", gpus: list[GpuReading] | None = None) -> GpuSample:
    return GpuSample(ts=ts, cluster="c1", node=node, pool="p1", zone="z1", driver="550",
                     gpus=gpus if gpus is not None else [gpu(0), gpu(1)])


def xid(ts: int, code: int, node: str = "n1") -> XidEvent:
    return XidEvent(ts=ts, cluster="c1", node=node, pool="p1", zone="z1",
                    pci_bus_id="0000:10:00", gpu_index=0, xid=code, message="NVRM: Xid",
                    source="simulator")


def test_a_listed_xid_cordons_at_once_an_application_xid_does_not() -> None:
    detector = ThresholdDetector()
    detector.feed_all([scrape(T0), xid(T0 + S, 13), xid(T0 + 2 * S, 31)])
    assert detector.actions == []
    detector.feed(xid(T0 + 3 * S, 79))
    assert [(a.kind, a.target.name, a.ts) for a in detector.actions] == [("cordon", "n1", T0 + 3 * S)]
    assert detector.findings[0].check == "xid" and detector.findings[0].evidence.value == 79


def test_thresholds_fire_on_one_sample_and_refire_only_after_the_quiet_period() -> None:
    t = Thresholds(refire_ms=600 * S)
    detector = ThresholdDetector(t)
    hot = [gpu(0, temp=86.0), gpu(1)]
    detector.feed_all(scrape(T0 + i * 30 * S, gpus=hot) for i in range(25))  # 12 minutes hot
    assert [a.ts for a in detector.actions] == [T0, T0 + 600 * S]
    assert {f.check for f in detector.findings} == {"temperature"}


def test_ecc_and_lost_gpu_rules() -> None:
    detector = ThresholdDetector()
    detector.feed(scrape(T0, node="a", gpus=[gpu(0, dbe=1.0), gpu(1)]))
    detector.feed(scrape(T0, node="b"))
    detector.feed(scrape(T0 + 30 * S, node="b", gpus=[gpu(0)]))  # a GPU fell out of the scrape
    assert {(f.entity.target.name, f.check) for f in detector.findings} == {
        ("a", "ecc"), ("b", "gpu_count")}


def test_idle_while_allocated_needs_the_full_duration_and_a_job() -> None:
    t = Thresholds(idle_ms=600 * S)
    detector = ThresholdDetector(t)
    idle = [gpu(0, util=1.0), gpu(1)]
    free = [gpu(0, util=1.0, job=None), gpu(1)]
    detector.feed_all(scrape(T0 + i * 60 * S, node="idle", gpus=idle) for i in range(10))
    detector.feed_all(scrape(T0 + i * 60 * S, node="free", gpus=free) for i in range(10))
    assert detector.actions == []  # 9 minutes idle so far; the free GPU is nobody's
    detector.feed(scrape(T0 + 600 * S, node="idle", gpus=idle))
    assert [(a.target.name, a.reason.checks) for a in detector.actions] == [("idle", ["idle"])]


def test_silent_node_is_cordoned_unless_someone_else_took_it_out() -> None:
    detector = ThresholdDetector()
    detector.feed_all([scrape(T0, node="quiet"), scrape(T0, node="maint")])
    detector.feed(NodeEvent(ts=T0 + S, cluster="c1", target_kind="node", target="maint",
                            pool="p1", zone="z1", kind="cordoned", actor="operator"))
    detector.feed_all(scrape(T0 + i * 10 * S, node="busy") for i in range(1, 32))
    assert [(a.target.name, a.reason.checks) for a in detector.actions] == [("quiet", ["silent"])]
    assert detector.actions[0].ts - T0 >= Thresholds().silent_ms


def test_an_ici_link_down_repairs_the_slice() -> None:
    detector = ThresholdDetector()
    links = [IciLink(chip_id=0, port=0, peer_chip_id=1, health=0, flits_tx=1, flits_rx=1),
             IciLink(chip_id=1, port=0, peer_chip_id=0, health=10, flits_tx=1, flits_rx=1)]
    detector.feed(IciSample(ts=T0, cluster="c1", node="h0", pool="tp", zone="z1", slice="s1",
                            links=links))
    assert [(a.kind, a.target.kind, a.target.name) for a in detector.actions] == [
        ("repair_slice", "slice", "s1")]


def _score(faults: int, detected: int, episodes: int, false: int, days: float) -> Score:
    part = ClassScore(faults=faults, found=detected, delays_ms=[1000] * detected)
    return Score({"hard": part}, {"G1": part}, episodes, episodes - false, 0, false, days)


def test_seeds_merge_by_adding_counts() -> None:
    merged = merge([_score(4, 3, 3, 0, 10.0), _score(6, 6, 7, 1, 20.0)])
    assert merged.by_class["hard"].recall == 0.9
    assert merged.precision == 0.9
    assert merged.node_days == 30.0
    h = headline(merged)
    assert h["false_cordons_per_1k_node_days"] == round(1000 / 30, 2)


def test_the_false_cordon_goal_is_claimed_only_when_the_run_can_resolve_it() -> None:
    assert _false_cordons_met(headline(_score(1, 1, 1, 1, 50.0))) is False
    assert _false_cordons_met(headline(_score(1, 1, 1, 0, 50.0))) is None  # bound 60 per 1k
    assert _false_cordons_met(headline(_score(1, 1, 1, 0, 40_000.0))) is True


def test_summary_rows_show_found_acted_withheld_and_the_nab_comparison() -> None:
    from bench.summary import intensity_rows, nab_rows

    merged = merge([_score(4, 3, 3, 0, 10.0)])
    merged.by_class["hard"].action_faults, merged.by_class["hard"].acted = 4, 2
    merged.by_class["hard"].withheld, merged.by_class["hard"].withheld_rules = 1, {"budget": 1}
    run = {"fleetpulse": {"headline": headline(merged), **merged.summary()},
           "baseline": {"headline": headline(merged), **merged.summary()}}
    rows = intensity_rows({"x10": run})
    assert rows[0].figure == "x10: hard"
    assert rows[0].value == "found 3/4, acted 2, withheld 1, missed 1"
    point = {"threshold": 4.5, "recall": 0.846, "hits": 11, "windows": 13,
             "false_alarms_per_week": 1.27}
    nab = {"fleetpulse": {"hits": 11, "windows": 13, "recall": 0.846, "false_alarms_per_week": 1.27},
           "baseline_static_3sd": {"recall": 0.7, "false_alarms_per_week": 7.0}, "sensitivity": 4.5,
           "matched": {"1.3": {"fleetpulse": point, "zscore": None, "ewma": point}},
           "leave_one_out": {d: {"recall": 0.5, "hits": 1, "windows": 2,
                                 "false_alarms_per_week": 1.0} for d in ("fleetpulse", "zscore", "ewma")}}
    rows = nab_rows(nab)
    matched = rows[1]
    assert matched.met is False and matched.goal == "≥ 0.85 at ≤ 1.3"
    assert "z-score none within" in matched.baseline
    assert rows[2].figure.startswith("NAB, leave one series out")
