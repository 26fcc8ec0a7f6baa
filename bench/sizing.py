"""Sizing: every topic's values and bytes per accelerator, measured on the simulator's records.

    python -m bench.sizing                # measure (~1-2 min), then rewrite docs/sizing.md
    python -m bench.sizing --hours 1      # a shorter run (noisier fault-driven topics)
    python -m bench.sizing --docs         # only rewrite docs/sizing.md from bench/results

Two fleets are simulated at the default fault rates (intensity 1): GPU nodes only (64 nodes of 8
GPUs) and TPU slices only (the default four slice types), so that every topic's rate divides by
one kind of accelerator. The embedded runtime runs over each (the pipeline's outputs: findings,
utilization, node states, ...). Per topic:

- **values per second per accelerator**: over the whole run (`--hours`, default 2: faults,
  findings and actions are rare at real rates, so they need hours of a small fleet);
- **bytes per value on the wire**: each value encoded as FleetPulse writes it (telemetry in
  `kafka.telemetry_format` and batch records per partition, `kafka.telemetry_batch`; the rest
  JSON), then compressed with the default codec (zstd, kafka-python's own compressor) one
  producer batch at a time: a scrape's records of one topic and partition (12 partitions) for
  the inputs, ten seconds of event time of one topic for the outputs. Telemetry is measured on
  the first `--bytes-minutes` (default 10) of the run, the other topics on all of it. Kafka's
  own record and batch framing is not counted (tens of bytes per batch);
- **lake bytes per row**: each lake table's rows of the run written as one Parquet file with the
  lake's settings (zstd, `lake.compression_level`).

Writes bench/results/sizing.json; docs/sizing.md's tables come from it and from the other
benchmarks' result files (bench/sizing_doc.py).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec
import pyarrow.parquet as pq
from kafka.codec import zstd_encode

from bench import sizing_doc
from bench.common import write_result
from bench.sim import metric_samples
from pipeline.config import KafkaSettings, LakeSettings, SimSettings, load_settings
from pipeline.lake.tables import TABLES
from pipeline.model import Event, GpuSample, TpuSample
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.wire.batches import PRODUCER_BATCHED, input_records, partition_of
from pipeline.wire.codec import encode, encode_as
from streams.testing import INPUT_SUFFIX

PARTITIONS = 12
LAKE_INPUTS = frozenset(spec.topic_suffix for spec in TABLES.values()) & frozenset(
    INPUT_SUFFIX.values())
OUTPUT_BATCH_MS = 10_000  # event time of one output topic taken as one producer batch
FLEETS = {
    "gpu": SimSettings(gpu_nodes=64, tpu_slices=0),
    "tpu": SimSettings(gpu_nodes=0, tpu_slices=4),
}


class TopicTally:
    """One topic's counts: values over the run; bytes over the values whose bytes were taken."""

    def __init__(self) -> None:
        self.values = 0
        self.sized = 0  # values whose bytes are counted below
        self.value_bytes = 0
        self.wire_bytes = 0  # compressed, per producer batch
        self.samples = 0  # metric samples (telemetry)


def accelerators(kind: str, events: Iterable[Event]) -> int:
    """GPUs (per node, the most any sample listed) or TPU chips (distinct per slice)."""
    if kind == "gpu":
        per_node: dict[tuple[str, str], int] = {}
        for e in events:
            if isinstance(e, GpuSample):
                key = (e.cluster, e.node)
                per_node[key] = max(per_node.get(key, 0), len(e.gpus))
        return sum(per_node.values())
    chips = {(e.cluster, e.slice, c.chip_id) for e in events if isinstance(e, TpuSample)
             for c in e.chips}  # fmt: skip
    return len(chips)


def compressed(values: Iterable[bytes]) -> int:
    return len(zstd_encode(b"".join(values)))


def tally_inputs(tick: list[Event], kafka: KafkaSettings, tallies: dict[str, TopicTally],
                 sized: bool) -> None:
    """A tick's inputs: every value counted; bytes taken of all of them (`sized`) or of the
    rare, unbatched ones only, as the producers write them (telemetry as batch records per
    topic and partition, the rest a record each), compressed per topic and partition."""
    for event in tick:
        tally = tallies[INPUT_SUFFIX[type(event)]]
        tally.values += 1
        tally.samples += metric_samples(event)
    events = tick if sized else [e for e in tick if INPUT_SUFFIX[type(e)] not in PRODUCER_BATCHED]
    for event in events:
        tally = tallies[INPUT_SUFFIX[type(event)]]
        tally.sized += 1
        tally.value_bytes += len(encode_as(event, kafka.telemetry_format)[0])
    groups: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for record in input_records(events, kafka):
        partition = record.partition
        if partition is None:
            partition = partition_of(record.key, PARTITIONS)
        groups[record.topic.removeprefix(kafka.topic_prefix + "."), partition].append(record.value)
    for (suffix, _), values in groups.items():
        tallies[suffix].wire_bytes += compressed(values)


def tally_outputs(outputs: dict[str, list[Event]], tallies: dict[str, TopicTally]) -> None:
    """The pipeline's outputs (JSON), compressed per topic and OUTPUT_BATCH_MS of event time."""
    for suffix, events in outputs.items():
        tally = tallies[suffix]
        batches: dict[int, list[bytes]] = defaultdict(list)
        for event in events:
            value = encode(event)
            tally.values += 1
            tally.sized += 1
            tally.value_bytes += len(value)
            batches[int(getattr(event, "ts", 0)) // OUTPUT_BATCH_MS].append(value)
        tally.wire_bytes += sum(compressed(values) for values in batches.values())


def lake_bytes(outputs: dict[str, list[Event]], inputs: dict[str, list[Event]],
               lake: LakeSettings) -> dict[str, dict[str, Any]]:
    """Each lake table's rows of the run in one Parquet file: rows and bytes per row."""
    found: dict[str, dict[str, Any]] = {}
    for spec in TABLES.values():
        rows = outputs.get(spec.topic_suffix) or inputs.get(spec.topic_suffix) or []
        if not rows:
            continue
        buffer = io.BytesIO()
        pq.write_table(spec.to_arrow(rows), buffer, compression="zstd",
                       compression_level=lake.compression_level)  # fmt: skip
        found[spec.name] = {"topic": spec.topic_suffix, "rows": len(rows),
                            "bytes_per_row": round(buffer.tell() / len(rows), 2)}  # fmt: skip
    return found


def measure_fleet(kind: str, hours: float, bytes_minutes: float) -> dict[str, Any]:
    """One fleet (`FLEETS[kind]`) simulated for `hours`, through the embedded pipeline: per
    topic its values per second per accelerator and bytes per value, and the lake's bytes per
    row of each table."""
    settings = load_settings(environ={})
    kafka = msgspec.structs.replace(settings.kafka, partitions=PARTITIONS, telemetry_batch=True,
                                    topic_prefix="fleet")  # fmt: skip
    sim_settings = msgspec.structs.replace(FLEETS[kind], duration_s=int(hours * 3600))
    sim = Simulation(sim_settings)
    outputs: dict[str, list[Event]] = defaultdict(list)
    runtime = EmbeddedRuntime(settings, lambda s, e: outputs[s].append(e))
    tallies: dict[str, TopicTally] = defaultdict(TopicTally)
    kept: dict[str, list[Event]] = defaultdict(list)  # the inputs the lake keeps
    units_seen: list[Event] = []
    window_end = sim.start_ms + int(bytes_minutes * 60_000)
    for tick in sim.ticks():
        sized = bool(tick) and int(getattr(tick[0], "ts", 0)) < window_end
        tally_inputs(tick, kafka, tallies, sized)
        if sized:
            units_seen += [e for e in tick if isinstance(e, GpuSample | TpuSample)]
        for event in tick:
            if INPUT_SUFFIX[type(event)] in LAKE_INPUTS:
                kept[INPUT_SUFFIX[type(event)]].append(event)
            runtime.feed(event)
    tally_outputs(outputs, tallies)
    seconds = sim_settings.duration_s
    units = accelerators(kind, units_seen)
    topics = {}
    for suffix, t in sorted(tallies.items()):
        topics[suffix] = {
            "values": t.values,
            "values_per_s_per_unit": t.values / seconds / units,
            "value_bytes": round(t.value_bytes / t.sized, 1) if t.sized else None,
            "wire_bytes_per_value": round(t.wire_bytes / t.sized, 1) if t.sized else None,
            "metric_samples_per_s_per_unit": t.samples / seconds / units,
        }
    return {"units": units, "seconds": seconds, "topics": topics,
            "lake": lake_bytes(outputs, kept, settings.lake),
            "sim": msgspec.to_builtins(sim_settings)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=2.0, help="simulated hours per fleet")
    parser.add_argument("--bytes-minutes", type=float, default=10.0,
                        help="simulated minutes of telemetry encoded and compressed")
    parser.add_argument("--docs", action="store_true",
                        help="only rewrite docs/sizing.md from the result files")
    args = parser.parse_args(argv)
    result = None
    if not args.docs:
        started = time.perf_counter()
        figures: dict[str, Any] = {kind: measure_fleet(kind, args.hours, args.bytes_minutes)
                                   for kind in FLEETS}
        figures["measure_s"] = round(time.perf_counter() - started, 1)
        path = write_result("sizing", figures, vars(args))
        result = {"figures": figures, "path": str(path)}
        print(json.dumps(figures, indent=1)[:4000])
    changed = sizing_doc.write()
    print(f"{sizing_doc.DOC}: generated sections {'rewritten' if changed else 'unchanged'}")
    return result


if __name__ == "__main__":
    main()
