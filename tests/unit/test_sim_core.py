"""The simulator's contracts: deterministic, well-formed, ordered, realistic, labelled.

Most tests share one busy run (many faults of every kind in a small fleet) so that resets,
XIDs, node and capacity events all occur.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest

from pipeline.catalog import chip_coords, dcgm_field, ici_neighbours, xid_info
from pipeline.config import KafkaSettings, SimSettings
from pipeline.model import (
    CapacityEvent,
    Event,
    FabricSample,
    GpuSample,
    IciSample,
    Inventory,
    NodeEvent,
    TpuSample,
    XidEvent,
)
from pipeline.sim import (
    ForcedFault,
    Simulation,
    read_truth,
    record_key,
    truth_path,
    write_jsonl,
)
from pipeline.sim.fleet import GPU_MODELS
from pipeline.sim.gpu import FIELD_NAMES
from pipeline.sim.output import topic_for
from pipeline.wire import codec
from pipeline.wire.topics import TOPICS

BUSY = SimSettings(
    duration_s=1200, gpu_nodes=12, tpu_slices=4, intensity=3000, noise_intensity=300,
    max_rate_per_node_h=2.0, seed=11,
)
# short repairs, so that rebooted nodes and hosts come back (counters reset) within the run
BUSY_FAULTS = (
    ForcedFault(fault_type="G1", at_s=60, duration_s=60, target="fp-us-central1-h100-train-001"),
    ForcedFault(fault_type="N2", at_s=100, duration_s=120, target="fp-us-east5-h200-train-000"),
    ForcedFault(fault_type="T1", at_s=60, duration_s=120, target="fp-us-central1-tpu-v5litepod-16-00"),
)
# dcgm-exporter's kernel-log form (reference/data-shapes.md §2.1)
XID_LINE = re.compile(r"^NVRM: Xid \(PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+)(, .*)?$")


@functools.cache
def busy_run() -> tuple[Simulation, tuple[Event, ...]]:
    sim = Simulation(BUSY, BUSY_FAULTS)
    return sim, tuple(sim.events())


def test_busy_run_has_every_event_type_and_many_faults() -> None:
    sim, events = busy_run()
    kinds = {type(e) for e in events}
    assert kinds == {GpuSample, TpuSample, IciSample, XidEvent, NodeEvent, CapacityEvent,
                     FabricSample, Inventory}  # fmt: skip
    assert len({f.fault_type for f in sim.ground_truth}) >= 15


def test_same_settings_give_byte_identical_files(tmp_path: Path) -> None:
    settings = msgspec.structs.replace(BUSY, duration_s=300, tpu_slices=2)
    faults = [ForcedFault(fault_type="G1", at_s=60)]
    first, second = tmp_path / "a" / "events.jsonl", tmp_path / "b" / "events.jsonl"
    write_jsonl(Simulation(settings, faults), first)
    write_jsonl(Simulation(settings, faults), second)
    assert first.read_bytes() == second.read_bytes() and first.stat().st_size > 0
    assert truth_path(first).read_bytes() == truth_path(second).read_bytes()
    other = tmp_path / "c" / "events.jsonl"
    write_jsonl(Simulation(msgspec.structs.replace(settings, seed=12), faults), other)
    assert other.read_bytes() != first.read_bytes()


def test_every_event_survives_the_codec_round_trip() -> None:
    _, events = busy_run()
    for event in events:
        assert codec.decode(codec.encode(event), type(event)) == event


def test_events_are_in_event_time_order_and_inside_the_run() -> None:
    sim, events = busy_run()
    stamps = [e.ts for e in events]  # type: ignore[attr-defined]
    assert stamps == sorted(stamps)
    assert sim.start_ms <= stamps[0] and stamps[-1] < sim.end_ms


def test_ticks_group_the_same_events() -> None:
    sim = Simulation(msgspec.structs.replace(BUSY, duration_s=200))
    grouped = [codec.encode(e) for tick in sim.ticks() for e in tick]
    assert grouped == [codec.encode(e) for e in sim.events()]
    assert sum(1 for _ in sim.ticks()) == sim.n_ticks


def test_ground_truth_is_known_before_streaming_and_unchanged_after() -> None:
    sim = Simulation(msgspec.structs.replace(BUSY, duration_s=300))
    before = list(sim.ground_truth)
    assert before
    for _ in sim.events():
        pass
    assert sim.ground_truth == before


def test_ground_truth_written_beside_the_events_reads_back(tmp_path: Path) -> None:
    sim = Simulation(msgspec.structs.replace(BUSY, duration_s=120))
    path = tmp_path / "events.jsonl"
    write_jsonl(sim, path)
    assert read_truth(truth_path(path)) == sim.ground_truth
    assert not list(tmp_path.glob("*.partial"))


def test_counters_only_grow_except_after_a_reset() -> None:
    # A counter may fall only when the GPU comes back after an absence (reboot, GPU reset):
    # the sample before the fall must be more than one scrape interval older.
    _, events = busy_run()
    interval = BUSY.gpu_interval_s * 1000
    counters = [n for n in FIELD_NAMES if (f := dcgm_field(n)) is not None and f.kind == "counter"]
    assert len(counters) >= 8
    last: dict[tuple[str, int], tuple[int, dict[str, float]]] = {}
    resets = 0
    for event in events:
        if not isinstance(event, GpuSample):
            continue
        for gpu in event.gpus:
            key = (event.node, gpu.index)
            if key in last:
                ts, previous = last[key]
                fell = [n for n in counters if gpu.metrics[n] < previous[n]]
                if fell:
                    assert event.ts - ts > interval, (key, event.ts, fell)
                    resets += 1
            last[key] = (event.ts, gpu.metrics)
    assert resets > 0  # the busy run does reboot nodes


def test_ici_counters_only_grow_while_the_host_reports() -> None:
    _, events = busy_run()
    interval = BUSY.ici_interval_s * 1000
    last: dict[tuple[str, int, int], tuple[int, int, int, int]] = {}
    resets = 0
    for event in events:
        if not isinstance(event, IciSample):
            continue
        for link in event.links:
            key = (event.slice, link.chip_id, link.port)
            now = (event.ts, link.flits_tx, link.flits_rx, link.errors or 0)
            if key in last and any(a < b for a, b in zip(now[1:], last[key][1:], strict=True)):
                assert event.ts - last[key][0] > interval
                resets += 1
            last[key] = now
    assert resets > 0


def test_gpu_readings_are_in_realistic_ranges() -> None:
    _, events = busy_run()
    by_name = {m.name: m for m in GPU_MODELS.values()}
    seen_training = seen_idle = 0
    streak: dict[tuple[str, int], int] = defaultdict(int)  # consecutive busy scrapes
    for event in events:
        if not isinstance(event, GpuSample):
            continue
        for gpu in event.gpus:
            model, m = by_name[gpu.model], gpu.metrics
            assert set(m) == set(FIELD_NAMES)
            assert m["DCGM_FI_DEV_FB_USED"] + m["DCGM_FI_DEV_FB_FREE"] + m["DCGM_FI_DEV_FB_RESERVED"] == model.fb_total_mib
            assert 0 <= m["DCGM_FI_DEV_GPU_UTIL"] <= 100 and m["DCGM_FI_DEV_GPU_UTIL"].is_integer()
            assert m["DCGM_FI_DEV_SM_CLOCK"] <= model.max_sm_mhz
            assert 0.8 * model.idle_w <= m["DCGM_FI_DEV_POWER_USAGE"] <= model.tdp_w
            assert 20 <= m["DCGM_FI_DEV_GPU_TEMP"] <= 100
            for ratio in ("SM_ACTIVE", "GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE"):
                assert 0.0 <= m[f"DCGM_FI_PROF_{ratio}"] <= 1.0
            if gpu.job is None and m["DCGM_FI_DEV_GPU_UTIL"] == 0 and m["DCGM_FI_DEV_GPU_TEMP"] < 50:
                seen_idle += 1
                assert m["DCGM_FI_DEV_POWER_USAGE"] < 1.6 * model.idle_w
                assert m["DCGM_FI_DEV_SM_CLOCK"] == model.idle_sm_mhz
            busy = m["DCGM_FI_PROF_SM_ACTIVE"] > 0.85 and m["DCGM_FI_DEV_SM_CLOCK"] >= 0.97 * model.max_sm_mhz
            key = (event.node, gpu.index)
            streak[key] = streak[key] + 1 if busy else 0
            if model.key != "a100" and streak[key] > 12:  # warmed up: two minutes of training
                seen_training += 1
                assert 500 <= m["DCGM_FI_DEV_POWER_USAGE"] <= 700
                assert 55 <= m["DCGM_FI_DEV_GPU_TEMP"] <= 85
    assert seen_training > 100 and seen_idle > 10


def test_gpu_identities_are_unique_stable_and_real_looking() -> None:
    sim, _ = busy_run()
    uuids = [u for n in sim.fleet.gpu_nodes for u in n.uuids]
    assert len(set(uuids)) == len(uuids)
    again = Simulation(msgspec.structs.replace(BUSY, random_faults=False))
    assert [n.uuids for n in again.fleet.gpu_nodes] == [n.uuids for n in sim.fleet.gpu_nodes]
    for node in sim.fleet.gpu_nodes:
        assert [codec.normalize_pci(b)[5:7].upper() for b in node.pci_bus_ids] == list(node.model.pci_buses)


def test_xid_events_carry_real_kernel_log_lines_for_their_gpu() -> None:
    sim, events = busy_run()
    xids = [e for e in events if isinstance(e, XidEvent)]
    assert xids
    for xid in xids:
        match = XID_LINE.match(xid.message)
        assert match is not None, xid.message
        assert match.group(1) == xid.pci_bus_id and int(match.group(2)) == xid.xid
        node = sim.fleet.node_by_name(xid.node)
        assert node is not None and xid.gpu_index is not None
        assert codec.normalize_pci(node.pci_bus_ids[xid.gpu_index]) == xid.pci_bus_id
        assert xid.uuid == node.uuids[xid.gpu_index]
        assert xid_info(xid.xid).mnemonic != "UNKNOWN"


def test_tpu_chips_and_links_follow_the_catalog_topology() -> None:
    sim, events = busy_run()
    slices = {s.name: s for s in sim.fleet.slices}
    for event in events:
        if isinstance(event, TpuSample):
            s = slices[event.slice]
            coords = chip_coords(s.shape)
            assert {c.chip_id for c in event.chips} == set(s.hosts[event.worker_id].chips)
            assert all(tuple(c.coords) == coords[c.chip_id] for c in event.chips)
            assert event.topology == s.topology and event.accelerator_type == s.accelerator_type
        elif isinstance(event, IciSample):
            s = slices[event.slice]
            for link in event.links:
                assert (link.port, link.peer_chip_id) in neighbours(s.name, link.chip_id)


@functools.cache
def neighbours(slice_name: str, chip: int) -> list[tuple[int, int]]:
    sim, _ = busy_run()
    s = sim.fleet.slice_by_name(slice_name)
    assert s is not None
    return ici_neighbours(s.shape, chip)


def test_flits_received_match_flits_the_peer_sent() -> None:
    sim = Simulation(msgspec.structs.replace(BUSY, random_faults=False, duration_s=300, gpu_nodes=0))
    samples = [e for e in sim.events() if isinstance(e, IciSample)]
    first, last = {}, {}
    for sample in samples:
        for link in sample.links:
            key = (sample.slice, link.chip_id, link.peer_chip_id)
            first.setdefault(key, (link.flits_tx, link.flits_rx))
            last[key] = (link.flits_tx, link.flits_rx)
    checked = 0
    for (name, chip, peer), (_, rx) in last.items():
        back = (name, peer, chip)
        if back in last:
            sent = last[back][0] - first[back][0]
            received = rx - first[(name, chip, peer)][1]
            assert received == pytest.approx(sent, rel=1e-9)
            checked += 1
    assert checked > 100


def test_confounders_and_planned_work_are_labelled_must_not_cordon() -> None:
    sim, _ = busy_run()
    for fault in sim.ground_truth:
        if fault.klass in ("confounder", "planned", "noise") and fault.fault_type != "H4":
            assert fault.must_not_cordon, fault
        if fault.klass == "hard" and fault.fault_type[0] in "GN":
            assert fault.expected == "cordon" and fault.target.kind == "node"
        if fault.fault_type in ("T1", "T2"):
            assert fault.expected == "repair_slice" and fault.target.kind == "slice"
        assert fault.end_ms >= fault.onset_ms


def test_job_confounders_label_every_node_of_the_job() -> None:
    sim, _ = busy_run()
    groups: dict[str, list[str]] = defaultdict(list)
    for fault in sim.ground_truth:
        if fault.fault_type in ("J1", "J2", "J4"):
            groups[fault.group].append(fault.target.name)
    assert groups
    for group, targets in groups.items():
        fault = next(f for f in sim.ground_truth if f.group == group)
        job = next(j for j in sim.workload.jobs if j.name == fault.job)
        expected = (
            [sim.fleet.slices[job.members[0]].name] if job.platform == "tpu"
            else [sim.fleet.gpu_nodes[n].name for n in sim.workload.members_at(job.index, fault.onset_ms)]
        )
        assert sorted(targets) == sorted(expected)


def test_events_are_keyed_and_routed_as_the_topic_specs_say() -> None:
    _, events = busy_run()
    specs = {spec.value: spec for spec in TOPICS}
    kafka = KafkaSettings()
    for event in events[:2000] + events[-2000:]:
        spec = specs[type(event)]
        fields = spec.key.split("/")  # "cluster/node", "cluster/slice", "zone", ...
        assert record_key(event) == "/".join(getattr(event, field) for field in fields)
        assert topic_for(kafka, event) == f"{kafka.topic_prefix}.{spec.suffix}"


def test_quiet_fleet_has_only_the_forced_fault() -> None:
    settings = msgspec.structs.replace(BUSY, random_faults=False, diurnal=False, duration_s=120)
    sim = Simulation(settings, [ForcedFault(fault_type="N2", at_s=30)])
    assert {f.fault_type for f in sim.ground_truth} == {"N2"}
    assert all(f.forced for f in sim.ground_truth)
    xids = [e for e in sim.events() if isinstance(e, XidEvent)]
    assert xids == []


def test_forced_fault_on_an_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU node named"):
        Simulation(BUSY, [ForcedFault(fault_type="G1", at_s=1, target="nope")])


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        (ForcedFault(fault_type="H1", at_s=1), "property of the fleet"),
        (ForcedFault(fault_type="G1", at_s=BUSY.duration_s + 5), "outside the run"),
        (ForcedFault(fault_type="T3", at_s=1, target="fp-us-central1-tpu-v5litepod-16-00"), "no eligible TPU slice"),
    ],
)
def test_impossible_forced_faults_are_refused(fault: ForcedFault, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Simulation(BUSY, [fault])


def test_a_repaired_training_node_rejoins_its_job() -> None:
    settings = msgspec.structs.replace(BUSY, random_faults=False, duration_s=1500, tpu_slices=0)
    sim = Simulation(settings, [ForcedFault(fault_type="N2", at_s=60, duration_s=300)])
    fault = next(f for f in sim.ground_truth if f.forced)
    node = sim.fleet.node_by_name(fault.target.name)
    assert node is not None and fault.job is not None
    jobs = [
        (e.ts, e.gpus[0].job) for e in sim.events() if isinstance(e, GpuSample) and e.node == node.name
    ]
    assert any(ts > fault.end_ms and job == fault.job for ts, job in jobs)
    assert not any(fault.onset_ms <= ts < fault.end_ms for ts, _ in jobs)


def test_random_faults_begin_only_before_the_quiet_tail() -> None:
    settings = msgspec.structs.replace(BUSY, faults_for_s=600)
    sim = Simulation(settings)
    onsets = [(f.onset_ms - settings.start_ms) / 1000 for f in sim.ground_truth]
    assert len(onsets) > 20  # the busy rates: many faults, all in the first ten minutes
    assert max(onsets) < 600, max(onsets)
    # the whole run's worth of faults without it
    assert max((f.onset_ms - settings.start_ms) / 1000 for f in Simulation(BUSY).ground_truth) >= 600
