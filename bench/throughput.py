"""Throughput: metric samples per second per core through the pipeline, against the limit.

    python -m bench.throughput            # writes bench/results/throughput.json
    python -m bench.throughput --quick    # shorter fleet run, fewer repetitions

The same simulated telemetry (a GPU + TPU fleet with the fault model's mix of events) is
produced once into private topics of the real broker, then measured on one process each:

- limit: aiokafka, the client under faust, consuming the same records and doing nothing
  (and, to split the cost, the same while decoding each value into its typed event);
- kafka pipeline: `fleetpulse worker` (faust) doing detect + health + policy + aggregate with
  its outputs produced and acknowledged, timed from its partition assignment until it has
  committed the offset of the last input record (it commits only past acknowledged outputs);
  once one event at a time (the default) and once with `worker.take = TAKE` (each agent takes
  batches of up to TAKE records from faust);
- embedded: the in-process runtime on the same encoded records (decode included), no Kafka;
  and (embedded_batched) on the producer-batched records, each batch record's values through
  their stage in one `Stage.items` call, as the worker runs them (`EmbeddedRuntime.feed_batch`).

A metric sample is one value of one device (bench.sim.metric_samples). Rates are per wall
second and per CPU second of the measuring process ("per core"); the pipeline's figures are
also given as ratios to the limit measured in the same run. Each figure is the median of
several repetitions. The scale curve runs the embedded runtime over 1k, 10k and 100k simulated
GPUs (with TPU slices in the same proportion), each size in a fresh child process, and reports
throughput and the memory its state holds per device (RSS growth, and the msgpack bytes the
same state takes in a faust table).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench import broker
from bench.common import Timing, load_average, measure, ratio, result_name, rss_bytes, timing
from bench.common import write_result as _write
from bench.sim import metric_samples
from pipeline.config import Settings, SimSettings
from pipeline.model import Event
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.stages.base import encode_state
from pipeline.wire.batches import BATCH_HEADER, unpack
from pipeline.wire.codec import content_type_of, decode, header_of
from pipeline.wire.topics import TOPICS, topic_name

SCALE_GPUS = (1_000, 10_000, 100_000)
TAKE = 500  # worker.take of the batched variant: one ack batch (worker.ack_batch)
GPUS_PER_NODE = 8
GPUS_PER_SLICE = 128  # the default fleet's mix: 512 GPUs beside 4 slices (240 chips)


def fleet(quick: bool) -> SimSettings:
    """The default fleet (64 GPU nodes, 4 TPU slices of four generations), fault model rates."""
    return SimSettings(duration_s=300 if quick else 600)


def run_limit(settings: Settings, ends: dict[Any, int], repeat: int) -> Timing:
    return timing([broker.consume_nothing(settings, ends) for _ in range(repeat)])


def run_decode(settings: Settings, ends: dict[Any, int], repeat: int) -> Timing:
    """The limit plus decoding each value into its typed event (what every runtime must do
    before any logic): splits the pipeline's cost into the codec's and the rest."""
    prefix = settings.kafka.topic_prefix + "."
    types = {topic_name(settings.kafka, spec.suffix): spec.value for spec in TOPICS}

    def each(topic: str, value: bytes, headers: Any) -> None:
        decode(value, types[topic], content_type=content_type_of(headers))

    assert all(tp.topic.startswith(prefix) for tp in ends)
    return timing([broker.consume_nothing(settings, ends, each) for _ in range(repeat)])


def run_worker(settings: Settings, ends: dict[Any, int], repeat: int, workdir: Path,
               take: int = 0) -> Timing:
    """`fleetpulse worker` draining the topics; `take` > 0: agents take batches from faust."""
    runs = []
    for i in range(repeat):
        # a fresh group each time: it reads from the start, with empty tables
        worker_settings = msgspec.structs.replace(
            settings.worker, group_id=f"{settings.kafka.topic_prefix}-worker-{take}-{i}",
            take=take)
        worker = broker.Worker(msgspec.structs.replace(settings, worker=worker_settings),
                               workdir / f"worker-{take}-{i}", {"FLEETPULSE_WORKER__TAKE": str(take)}).start()
        try:
            runs.append(broker.drain(worker, ends, timeout=900))
        finally:
            worker.stop()
    return timing(runs)


def run_embedded(settings: Settings, batch: list[broker.Record], repeat: int) -> Timing:
    prefix = settings.kafka.topic_prefix + "."
    work = [(r.topic.removeprefix(prefix), r.value, r.key, r.content_type) for r in batch]

    def feed() -> None:
        runtime = EmbeddedRuntime(settings)
        for offset, (suffix, value, key, content_type) in enumerate(work):
            runtime.feed_raw(suffix, value, offset, key, content_type)
        runtime.finish()

    return measure(feed, repeat)


def run_embedded_batched(settings: Settings, batch: list[broker.Record], repeat: int) -> Timing:
    """The embedded runtime on the records the producer-batched worker reads (a batch record
    per partition and scrape, `broker.wire_records`): each batch record's values decoded and
    run through their stage in one `Stage.items` call (`EmbeddedRuntime.feed_batch`), as the
    worker runs them."""
    prefix = settings.kafka.topic_prefix + "."
    types = {spec.suffix: spec.value for spec in TOPICS}
    limit = settings.kafka.max_value_bytes
    work = [(topic.removeprefix(prefix), key, value, content_type_of(headers),
             header_of(headers, BATCH_HEADER) is not None)
            for topic, key, value, headers, _ in broker.wire_records(settings, batch, True)]

    def feed() -> None:
        runtime = EmbeddedRuntime(settings)
        for offset, (suffix, key, value, content_type, packed) in enumerate(work):
            if packed:
                runtime.feed_batch(suffix, [(decode(raw, types[suffix], limit, kind), None)
                                            for kind, raw in unpack(value)])
            else:
                runtime.feed_raw(suffix, value, offset, key, content_type)
        runtime.finish()

    return measure(feed, repeat)


def rates(t: Timing, records: int, samples: int) -> dict[str, Any]:
    return {
        **t.summary(),
        "records_per_s": round(records / t.wall_s),
        "samples_per_s": round(samples / t.wall_s),
        "samples_per_core_s": round(samples / t.cpu_s),
    }


def bench_pipeline(quick: bool) -> dict[str, Any]:
    repeat = 2 if quick else 3
    settings = broker.bench_settings("throughput")
    events = list(Simulation(fleet(quick)).events())
    batch = broker.records(settings, events)
    samples = sum(metric_samples(e) for e in events)
    figures: dict[str, Any] = {"records": len(batch), "metric_samples": samples,
                               "mix": _mix(events)}
    figures["embedded"] = rates(run_embedded(settings, batch, repeat), len(batch), samples)
    figures["embedded_batched"] = rates(run_embedded_batched(settings, batch, repeat),
                                        len(batch), samples)
    unreachable = broker.reachable(settings)
    if unreachable is not None:
        figures["kafka_skipped"] = unreachable
        return figures
    with broker.private_topics(settings), tempfile.TemporaryDirectory() as tmp:
        broker.produce(settings, batch)
        topics = sorted({record.topic for record in batch})
        ends = broker.end_offsets(settings, topics)
        figures["limit"] = rates(run_limit(settings, ends, max(5, repeat)),
                                 len(batch), samples)
        figures["limit_decode"] = rates(run_decode(settings, ends, repeat), len(batch), samples)
        figures["kafka_pipeline"] = rates(run_worker(settings, ends, repeat, Path(tmp)),
                                          len(batch), samples)
        figures["kafka_pipeline_take"] = {
            "take": TAKE, **rates(run_worker(settings, ends, repeat, Path(tmp), TAKE),
                                  len(batch), samples)}
    figures["kafka_pipeline_producer_batched"] = run_producer_batched(batch, samples, repeat)
    limit, pipe, emb = figures["limit"], figures["kafka_pipeline"], figures["embedded"]
    take = figures["kafka_pipeline_take"]
    batched = figures["kafka_pipeline_producer_batched"]
    figures["ratios"] = {
        "kafka_pipeline_producer_batched_vs_embedded_per_core": ratio(
            batched["samples_per_core_s"], emb["samples_per_core_s"]),
        "kafka_pipeline_producer_batched_vs_embedded_batched_per_core": ratio(
            batched["samples_per_core_s"], figures["embedded_batched"]["samples_per_core_s"]),
        "embedded_batched_vs_embedded_per_core": ratio(
            figures["embedded_batched"]["samples_per_core_s"], emb["samples_per_core_s"]),
        "kafka_pipeline_producer_batched_vs_limit_per_core": ratio(
            batched["samples_per_core_s"], limit["samples_per_core_s"]),
        "kafka_pipeline_producer_batched_vs_per_record_per_core": ratio(
            batched["samples_per_core_s"], pipe["samples_per_core_s"]),
        "kafka_pipeline_take_vs_limit_per_core": ratio(take["samples_per_core_s"],
                                                       limit["samples_per_core_s"]),
        "kafka_pipeline_take_vs_embedded_per_core": ratio(take["samples_per_core_s"],
                                                          emb["samples_per_core_s"]),
        "kafka_pipeline_take_vs_per_record_per_core": ratio(take["samples_per_core_s"],
                                                            pipe["samples_per_core_s"]),
        "kafka_pipeline_vs_limit_per_core": ratio(pipe["samples_per_core_s"],
                                                  limit["samples_per_core_s"]),
        "kafka_pipeline_vs_limit_wall": ratio(pipe["samples_per_s"], limit["samples_per_s"]),
        "embedded_vs_limit_per_core": ratio(emb["samples_per_core_s"],
                                            limit["samples_per_core_s"]),
        "decode_vs_limit_per_core": ratio(figures["limit_decode"]["samples_per_core_s"],
                                          limit["samples_per_core_s"]),
        "kafka_pipeline_vs_embedded_per_core": ratio(pipe["samples_per_core_s"],
                                                     emb["samples_per_core_s"]),
    }
    return figures


def run_producer_batched(batch: list[broker.Record], samples: int, repeat: int
                         ) -> dict[str, Any]:
    """The worker on the same telemetry written as producer batches (pipeline/wire/batches.py): one
    record per partition and scrape, in topics of its own."""
    settings = broker.bench_settings("throughput-batched")
    prefix = batch[0].topic.split(".", 1)[0] + "."
    renamed = [r._replace(topic=settings.kafka.topic_prefix + "." + r.topic.removeprefix(prefix))
               for r in batch]  # fmt: skip
    with broker.private_topics(settings), tempfile.TemporaryDirectory() as tmp:
        broker.produce(settings, renamed, batched=True)
        ends = broker.end_offsets(settings, sorted({r.topic for r in renamed}))
        figures = rates(run_worker(settings, ends, repeat, Path(tmp)), sum(ends.values()),
                        samples)
    figures["records_in"] = sum(ends.values())
    return figures


def _mix(events: list[Event]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[type(event).__name__] = counts.get(type(event).__name__, 0) + 1
    return counts


# --- scale curve -----------------------------------------------------------------------------


def scale_settings(gpus: int, ticks: int) -> SimSettings:
    # Healthy telemetry only: fault scheduling would cost more than the run at 100k GPUs.
    return SimSettings(
        gpu_nodes=gpus // GPUS_PER_NODE, tpu_slices=max(1, gpus // GPUS_PER_SLICE),
        duration_s=10 * ticks, random_faults=False, fault_types=("S5",),
    )


def scale_point(gpus: int, ticks: int, repeat: int) -> dict[str, Any]:
    """One fleet size, in this (fresh) process: throughput, and memory held per device."""
    settings = Settings()
    sim = Simulation(scale_settings(gpus, ticks))
    events = list(sim.events())
    samples = sum(metric_samples(e) for e in events)
    devices = gpus + sum(len(s.coords) for s in sim.fleet.slices)
    gc.collect()
    before = rss_bytes()
    runtime = EmbeddedRuntime(settings)
    wall, cpu = time.perf_counter(), time.process_time()
    runtime.feed_all(events)
    first = (time.perf_counter() - wall, time.process_time() - cpu)
    gc.collect()
    held = rss_bytes() - before
    state = sum(len(encode_state(v)) for table in (runtime.telemetry, runtime.health,
                                                   runtime.policy) for v in table.values())
    del runtime
    runs = [first]
    if repeat > 1:
        more = measure(lambda: EmbeddedRuntime(settings).feed_all(events), repeat - 1)
        runs += zip(more.runs_wall_s, more.runs_cpu_s, strict=True)
    t = timing(runs)
    return {
        "gpus": gpus, "tpu_chips": devices - gpus, "devices": devices, "ticks": ticks,
        "records": len(events), "metric_samples": samples,
        **rates(t, len(events), samples),
        "rss_bytes_per_device": round(held / devices),
        "state_bytes_per_device": round(state / devices),
    }


def bench_scale(quick: bool) -> list[dict[str, Any]]:
    ticks, repeat = (4, 2) if quick else (12, 3)
    points = []
    for gpus in SCALE_GPUS:
        done = subprocess.run(
            [sys.executable, "-m", "bench.throughput", "--scale-point", str(gpus),
             "--ticks", str(ticks), "--repeat", str(1 if gpus >= 100_000 else repeat)],
            capture_output=True, text=True, check=False, timeout=1800,
        )
        if done.returncode != 0:
            points.append({"gpus": gpus, "error": done.stderr.strip().splitlines()[-1:]})
            continue
        points.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return points


def run(quick: bool) -> dict[str, Any]:
    figures = {"pipeline": bench_pipeline(quick), "scale": bench_scale(quick)}
    settings = {"quick": quick, "fleet": msgspec.to_builtins(fleet(quick)),
                "scale_gpus": list(SCALE_GPUS), "load_average": load_average()}
    path = _write(result_name("throughput", quick), figures, settings)
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short run, fewer repetitions")
    parser.add_argument("--scale-point", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ticks", type=int, default=12, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_point:
        print(json.dumps(scale_point(args.scale_point, args.ticks, args.repeat)))
        return
    result = run(args.quick)
    print(json.dumps(result["figures"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
