"""The stage table: one module per stage, one row each, and the names the wire creates.

A stage is its module's `STAGE` (pipeline/stages/base.py); the table (topology.py) lists them;
the state tables and internal topics are named below the stages (pipeline/wire/internal.py),
so the wire creates exactly what the stages use.
"""

from __future__ import annotations

import msgspec

from pipeline.config import load_settings
from pipeline.model import Event, Finding, GpuSample, NodeEvent, XidEvent
from pipeline.runtime.embedded import EmbeddedRuntime, collect
from pipeline.schemas_tool import SCHEMA_DIR, file_name
from pipeline.stages import capacity, cluster, health, keys, policy, telemetry, topology, zone
from pipeline.wire import codec, internal
from pipeline.wire.topics import TOPICS

SETTINGS = load_settings(environ={})


def _sample(cls: type[Event]) -> Event:
    return codec.decode((SCHEMA_DIR / "samples" / file_name(cls)).read_bytes(), cls)


def test_the_table_is_each_stage_modules_row_and_the_wire_names_its_tables() -> None:
    modules = (telemetry, cluster, health, zone, policy, capacity)
    assert tuple(module.STAGE for module in modules) == topology.STAGES
    assert tuple(stage.table for stage in topology.STAGES) == internal.TABLES
    public = {spec.suffix for spec in TOPICS}
    for stage in topology.STAGES:
        for topic in stage.inputs:
            assert topic in public or topic in internal.INTERNAL, (stage.name, topic)
            assert topology.READER[topic] is stage  # one reader per topic
        for topic in stage.outputs:
            if topic in internal.INTERNAL:  # an internal topic somebody reads
                assert topic in topology.READER, (stage.name, topic)


def test_a_batch_through_a_stage_is_its_records_one_by_one() -> None:
    """Stage.items: what a driver hands a stage at once has the outputs of each in turn."""
    gpu = _sample(GpuSample)
    assert isinstance(gpu, GpuSample)
    events = [msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000) for i in range(12)]
    one = EmbeddedRuntime(SETTINGS)
    part = one._parts["telemetry"]
    single = [telemetry.STAGE.on_item(part, e, keys.record_key(e)) for e in events]
    other = EmbeddedRuntime(SETTINGS)
    batch = telemetry.STAGE.items(other._parts["telemetry"], [(e, keys.record_key(e)) for e in events])
    assert batch == single
    assert other.telemetry == one.telemetry


def test_the_telemetry_stage_alone_finds_what_the_whole_table_finds() -> None:
    """The backtest's feeder: the telemetry stage on the embedded runtime, other inputs
    ignored, announcements delivered to it as the health stage would."""
    gpu, xid = _sample(GpuSample), _sample(XidEvent)
    assert isinstance(gpu, GpuSample) and isinstance(xid, XidEvent)
    events: list[Event] = [msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000) for i in range(30)]
    events.insert(10, msgspec.structs.replace(xid, ts=gpu.ts + 95_000, node=gpu.node))
    whole = [f for f in collect(SETTINGS, events)["findings"] if isinstance(f, Finding)]
    found: list[Finding] = []
    alone = EmbeddedRuntime(
        SETTINGS, lambda topic, e: found.append(e) if isinstance(e, Finding) else None,
        stages=(telemetry.STAGE,),
    )
    alone.feed_all(events)
    node_event = _sample(NodeEvent)
    alone.feed(node_event)  # read by the health stage, which this runtime has not
    assert alone.counts["ignored"] == 1
    device = [f for f in whole if f.entity.target.kind == "node"]
    assert [f.finding_id for f in found] == [f.finding_id for f in device]
