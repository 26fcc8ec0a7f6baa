"""The capacity stage through the embedded runtime: the simulator's crunch scenario (a quota ramp
in one zone, stock-outs, spare H100s in another region) in, snapshots on fleet.capacity, advice
on fleet.capacity.advice and a FleetPulseCapacityCrunch alert naming the spare zone out: the
same stage the worker runs (stages/topology.py), fed by the telemetry, health and zone stages.
"""

from __future__ import annotations

from pipeline.capacity.crunch import ALERTNAME
from pipeline.config import CapacitySettings, Settings, SimSettings
from pipeline.model import Alert, CapacityAdvice, CapacitySnapshot, Inventory, NodeState, Target
from pipeline.runtime.embedded import EmbeddedRuntime, collect
from pipeline.sim.engine import Simulation
from pipeline.stages import capacity as stage
from pipeline.wire.internal import CAPACITY_INPUT, CAPACITY_KEY
from pipeline.wire.topics import capacity_key

CRUNCH_ZONE, SPARE_ZONE = "us-central1-a", "us-east5-a"
T0 = 1_780_000_000_000
HOURS = 2


def crunch_run() -> tuple[Settings, dict[str, list]]:
    sim = SimSettings(
        seed=5, duration_s=HOURS * 3600, gpu_nodes=8, tpu_slices=0, clusters=2,
        random_faults=False, gpu_interval_s=60, tpu_interval_s=60, ici_interval_s=60,
        crunch_zone=CRUNCH_ZONE, crunch_exhaust_s=int(1.5 * 3600), start_ms=T0,
    )  # fmt: skip
    # the quota and stock-outs alone (the simulator's jobs leave the ramped zone no free GPUs)
    settings = Settings(capacity=CapacitySettings(crunch_free_below=0))
    return settings, collect(settings, Simulation(sim).events())


def test_the_stage_publishes_snapshots_and_a_crunch_naming_the_spare_zone() -> None:
    settings, outputs = crunch_run()
    snapshots = [s for s in outputs.get("capacity", []) if isinstance(s, CapacitySnapshot)]
    zones = {s.zone for s in snapshots}
    assert {CRUNCH_ZONE, SPARE_ZONE} <= zones, zones
    # on the timer and on change, never per utilization row: a few per key and interval
    rows = len(outputs.get("utilization", []))
    assert 0 < len(snapshots) < rows / 4, (len(snapshots), rows)
    keys = {capacity_key(s) for s in snapshots}
    intervals = HOURS * 3600 // settings.capacity.snapshot_interval_s
    assert len(snapshots) >= len(keys) * intervals // 2
    assert any(isinstance(a, CapacityAdvice) for a in outputs.get("capacity.advice", []))

    crunches = [
        a for a in outputs.get("alerts", [])
        if isinstance(a, Alert) and a.labels.get("alertname") == ALERTNAME
        and a.labels["region"] == "us-central1"
        and a.labels["accelerator_type"] == "nvidia-h100-80gb"
    ]  # fmt: skip
    assert crunches, "no FleetPulseCapacityCrunch for the ramped zone's region and type"
    first = crunches[0]
    assert first.status == "firing" and "quota" in first.annotations["reasons"]
    assert first.annotations["runbook_url"]
    # the simulator's quota runs out 1.5 h in: the alert comes well before
    assert first.ts < T0 + int(1.5 * 3600 * 1000) - 30 * 60_000, first.ts - T0
    # re-sent while it holds on the timer, not after every input: at most one per interval
    assert len(crunches) <= HOURS * 3600 // settings.capacity.snapshot_interval_s + 1
    assert any(SPARE_ZONE in a.annotations.get("description", "") for a in crunches), [
        a.annotations for a in crunches
    ]
    # one alert identity: updates keep the fingerprint and start
    assert {a.fingerprint for a in crunches} == {first.fingerprint}
    assert {a.startsAt for a in crunches} == {first.startsAt}


def test_a_tombstone_forgets_the_member_and_a_wrong_key_is_refused() -> None:
    published: list[tuple[str, object]] = []
    runtime = EmbeddedRuntime(Settings(), lambda topic, event: published.append((topic, event)))
    member = Inventory(
        ts=T0, cluster="c1", kind="node", name="n1", pool="p", zone=SPARE_ZONE,
        accelerator="nvidia-h100-80gb", capacity=8, source="test",
    )  # fmt: skip
    runtime.deliver(CAPACITY_INPUT, CAPACITY_KEY, member)
    held = runtime.tables["capacity"][CAPACITY_KEY]
    assert isinstance(held, stage.CapacityStageState) and "c1/n1" in held.view.members
    # a new member, but no input with an event time yet: nothing to date a snapshot with
    assert not any(topic == "capacity" for topic, _ in published)
    target = Target(cluster="c1", kind="node", name="n1", pool="p", zone=SPARE_ZONE)
    runtime.deliver(CAPACITY_INPUT, CAPACITY_KEY, NodeState(
        ts=T0, target=target, state="healthy", since=T0))  # fmt: skip
    assert [e.ts for topic, e in published if topic == "capacity"] == [T0]  # type: ignore[attr-defined]

    runtime.feed_raw("inventory", None, 1, key="c1/n1")  # its tombstone, via the telemetry stage
    assert "c1/n1" not in runtime.tables["capacity"][CAPACITY_KEY].view.members

    runtime.deliver(CAPACITY_INPUT, "c1/n1", member)  # a value keyed by anything but "fleet"
    assert runtime.counts["dead.invalid"] == 1 and runtime.counts["out.dlq"] == 1
