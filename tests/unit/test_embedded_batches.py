"""The embedded runtime fed producers' batch records (`EmbeddedRuntime.feed_batch`): each
record's values run through their stage in one `Stage.items` call, as the worker runs them,
and decide what the same values fed one at a time decide."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import msgspec

from pipeline.config import Settings
from pipeline.model import Event
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.stages import telemetry, topology
from pipeline.wire.batches import PRODUCER_BATCHED, partition_of
from pipeline.wire.topics import record_key
from streams.testing import INPUT_SUFFIX, scenario

PARTITIONS = 3


def _outputs(feed: Callable[[EmbeddedRuntime, list[Event]], None]) -> dict[str, list[bytes]]:
    outputs: dict[str, list[bytes]] = {}
    runtime = EmbeddedRuntime(
        Settings(), lambda s, e: outputs.setdefault(s, []).append(msgspec.json.encode(e)))
    feed(runtime, list(scenario(duration_s=900).events()))
    runtime.finish()
    return outputs


def _one_at_a_time(runtime: EmbeddedRuntime, events: list[Event]) -> None:
    for event in events:
        runtime.feed(event)


def _in_batches(runtime: EmbeddedRuntime, events: list[Event]) -> None:
    """A batch record per topic, scrape (timestamp) and partition, as producers write them."""
    def scrape(event: Event) -> tuple[str, Any]:
        return INPUT_SUFFIX[type(event)], getattr(event, "ts", None)

    for (suffix, _), run in itertools.groupby(events, key=scrape):
        values = list(run)
        if suffix not in PRODUCER_BATCHED:
            _one_at_a_time(runtime, values)
            continue
        by_partition: dict[int, list[tuple[Event, str | None]]] = {}
        for event in values:
            by_partition.setdefault(partition_of(record_key(event), PARTITIONS), []).append(
                (event, None))
        for items in by_partition.values():
            runtime.feed_batch(suffix, items)


def test_batches_decide_what_values_one_at_a_time_decide() -> None:
    single, batched = _outputs(_one_at_a_time), _outputs(_in_batches)
    assert single["actions"], "the scenario's faults are acted on"
    assert set(single) == set(batched)
    for topic in single:
        # a batch's values reach the later stages together: the same outputs, and those of one
        # stage's key in the same order; decisions (actions) in the same order
        if topic == "actions":
            assert batched[topic] == single[topic]
        else:
            assert sorted(batched[topic]) == sorted(single[topic]), topic


def test_a_batch_goes_through_its_stage_in_one_call() -> None:
    calls: list[int] = []

    def on_items(part: Any, items: Any) -> list[Any]:
        calls.append(len(items))
        return [telemetry.on_item(part, event, key) for event, key in items]

    stages = tuple(dataclasses.replace(s, on_items=on_items) if s is telemetry.STAGE else s
                   for s in topology.STAGES)  # fmt: skip
    runtime = EmbeddedRuntime(Settings(), stages=stages)
    gpus = [e for e in scenario(duration_s=400).events()
            if INPUT_SUFFIX[type(e)] == "telemetry.gpu"][:5]
    runtime.feed_batch("telemetry.gpu", [(e, None) for e in gpus])
    assert calls == [5]
    assert runtime.counts["in.GpuSample"] == 5
