"""The embedded runtime wires the pure stages like the Kafka topics do."""

from __future__ import annotations

import json

import msgspec

from pipeline.config import load_settings
from pipeline.model import Action, CapacityEvent, Event, GpuSample, NodeState, XidEvent
from pipeline.runtime.embedded import EmbeddedRuntime, collect
from pipeline.schemas_tool import SCHEMA_DIR, file_name
from pipeline.wire import codec

SETTINGS = load_settings(environ={})


def _sample(name: str, cls: type[Event]) -> Event:
    return codec.decode((SCHEMA_DIR / "samples" / file_name(cls)).read_bytes(), cls)


def _fatal_xid_run(node: str = "gke-a3-mega-pool-7c1f-k2x9") -> list[Event]:
    gpu = _sample("gpu_sample", GpuSample)
    xid = _sample("xid_event", XidEvent)
    assert isinstance(gpu, GpuSample) and isinstance(xid, XidEvent)
    events: list[Event] = [
        msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000, node=node) for i in range(30)
    ]
    events.insert(10, msgspec.structs.replace(xid, ts=gpu.ts + 95_000, node=node))
    return events


def test_fatal_xid_becomes_a_cordon_action_with_its_finding() -> None:
    out = collect(SETTINGS, _fatal_xid_run())
    actions = [a for a in out["actions"] if isinstance(a, Action)]
    assert [a.kind for a in actions][:1] == ["cordon"]
    cordon = actions[0]
    assert cordon.reason.checks == ["xid.79"]
    finding_ids = {f.finding_id for f in out["findings"]}  # type: ignore[attr-defined]
    assert set(cordon.reason.finding_ids) <= finding_ids
    states = [s.state for s in out["node-state"] if isinstance(s, NodeState)]
    assert states[0] == "healthy" and "cordoned" in states


def test_same_input_same_outputs_byte_for_byte() -> None:
    def run() -> list[bytes]:
        out = collect(SETTINGS, _fatal_xid_run())
        return [codec.encode(e) for suffix in sorted(out) for e in out[suffix]]

    assert run() == run()


def test_a_poison_record_becomes_a_dead_letter_and_the_stream_goes_on() -> None:
    out: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(SETTINGS, lambda s, e: out.setdefault(s, []).append(e))
    runtime.feed_raw("telemetry.gpu", b'{"schema":"gpu_sample/3","ts":"soon"}', offset=7, key="n1")
    for offset, event in enumerate(_fatal_xid_run(), start=8):
        suffix = "events.xid" if isinstance(event, XidEvent) else "telemetry.gpu"
        runtime.feed_raw(suffix, codec.encode(event), offset=offset)
    runtime.finish()
    (letter,) = out["dlq"]
    body = json.loads(codec.encode(letter))
    assert (body["topic"], body["offset"], body["key"]) == ("telemetry.gpu", 7, "n1")
    assert "$.ts" in body["error"] and "int" in body["error"]
    assert any(isinstance(a, Action) and a.kind == "cordon" for a in out["actions"])


def test_zone_wide_capacity_event_reaches_every_pool_of_the_zone() -> None:
    runtime = EmbeddedRuntime(SETTINGS)
    for node, pool in (("n1", "pool-a"), ("n2", "pool-b")):
        gpu = _sample("gpu_sample", GpuSample)
        assert isinstance(gpu, GpuSample)
        runtime.feed(msgspec.structs.replace(gpu, node=node, pool=pool))
    capacity = _sample("capacity_event", CapacityEvent)
    assert isinstance(capacity, CapacityEvent)
    zone = _sample("gpu_sample", GpuSample).zone  # type: ignore[attr-defined]
    stockout = msgspec.structs.replace(
        capacity, kind="STOCKOUT", zone=zone, cluster=None, pool=None, target=None, target_kind=None, window=None
    )
    assert all(state.stockout_until == 0 for state in runtime.policy.values())
    runtime.feed(stockout)
    assert set(runtime.policy) == {f"{gpu.cluster}/pool-a", f"{gpu.cluster}/pool-b"}
    assert all(state.stockout_until > stockout.ts for state in runtime.policy.values())


def test_node_state_is_republished_every_five_minutes_of_event_time() -> None:
    # The policy's only clock is its input; a quiet healthy node must still tick it.
    gpu = _sample("gpu_sample", GpuSample)
    assert isinstance(gpu, GpuSample)
    quiet = [msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000) for i in range(6 * 60 * 2)]  # 2 h
    states = collect(SETTINGS, quiet)["node-state"]
    assert {s.state for s in states if isinstance(s, NodeState)} == {"healthy"}
    assert 20 <= len(states) <= 26, len(states)


def test_a_node_that_goes_silent_still_gets_its_last_windows() -> None:
    # Node n-dead stops after 3 minutes; n-live goes on. The dead node's last utilization
    # windows must reach the lake on event time, not wait for the end of the stream.
    gpu = _sample("gpu_sample", GpuSample)
    assert isinstance(gpu, GpuSample)
    rows: list[Event] = []
    runtime = EmbeddedRuntime(SETTINGS, lambda s, e: rows.append(e) if s == "utilization" else None)
    for i in range(6 * 10):  # 10 minutes of 10 s scrapes
        runtime.feed(msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000, node="n-live"))
        if i < 6 * 3:
            runtime.feed(msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000, node="n-dead"))
    dead = [r for r in rows if getattr(r, "node", "") == "n-dead"]
    windows = sorted({getattr(r, "window_start", 0) for r in dead})
    assert windows == [gpu.ts - gpu.ts % 60_000 + k * 60_000 for k in range(len(windows))]
    assert len(windows) >= 3, windows  # every minute it reported, before finish()
