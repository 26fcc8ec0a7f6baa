"""Compression on the wire, measured on real-shaped records through the real broker.

    python -m bench.bench_compression [--nodes 64] [--slices 4] [--minutes 5]

The simulator's telemetry (GPU, TPU, ICI, fabric samples and the rest of a tick), as FleetPulse's
producers write it: telemetry batch records (kafka.telemetry_batch, the default) and one record
per node (telemetry_batch false). Each codec's records go to a topic of their own; the ratio is
the broker's own stored log size (DescribeLogDirs) of the uncompressed topic over the codec's,
so it is what the wire and the disk carry, batch overhead included. Also the producer's CPU
seconds per MB of values. Writes bench/results/compression.json. Needs the broker that
deploy/with-services.sh starts (FLEETPULSE_KAFKA__BOOTSTRAP).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from pipeline.config import KafkaSettings, SimSettings
from pipeline.sim.engine import Simulation
from pipeline.wire.batches import input_records
from pipeline.wire.kafka import client_kwargs, missing_codec_packages, producer_kwargs

RESULTS = Path(__file__).resolve().parent / "results" / "compression.json"
CODECS = ("none", "zstd", "lz4", "gzip", "snappy")


def records(kafka: KafkaSettings, args: argparse.Namespace) -> list[bytes]:
    sim = Simulation(SimSettings(seed=5, duration_s=int(args.minutes * 60), gpu_nodes=args.nodes,
                                 tpu_slices=args.slices, random_faults=False))  # fmt: skip
    return [r.value for tick in sim.ticks() for r in input_records(tick, kafka, lambda _: 1)]


def produce(kafka: KafkaSettings, topic: str, values: list[bytes]) -> float:
    """Send every value to partition 0 and wait; the producer's CPU seconds."""
    producer = KafkaProducer(**producer_kwargs(kafka), acks="all", linger_ms=20,
                             batch_size=1 << 20, max_request_size=8 << 20)  # fmt: skip
    cpu = time.process_time()
    for value in values:
        producer.send(topic, value=value, partition=0)
    producer.flush(timeout=120)
    cpu = time.process_time() - cpu
    producer.close()
    return cpu


def stored(admin: KafkaAdminClient, topic: str) -> int:
    (broker,) = admin.describe_log_dirs([topic])
    return sum(p["partition_size"] for d in broker["log_dirs"] for t in d["topics"]
               if t["name"] == topic for p in t["partitions"])  # fmt: skip


def measure(base: KafkaSettings, batch: bool, args: argparse.Namespace) -> dict[str, Any]:
    kafka = msgspec.structs.replace(base, telemetry_batch=batch)
    values = records(kafka, args)
    raw = sum(map(len, values))
    admin = KafkaAdminClient(**client_kwargs(kafka))
    rows: dict[str, Any] = {}
    try:
        for codec in CODECS:
            if codec != "none" and missing_codec_packages(codec):
                rows[codec] = {"skipped": f"needs {missing_codec_packages(codec)}"}
                continue
            topic = f"{kafka.topic_prefix}.{'batch' if batch else 'record'}.{codec}"
            admin.create_topics([NewTopic(topic, 1, 1)])
            cpu = produce(msgspec.structs.replace(kafka, compression=codec), topic, values)
            rows[codec] = {"stored_bytes": stored(admin, topic),
                           "producer_cpu_s_per_mb": round(cpu / (raw / 1e6), 4)}  # fmt: skip
        admin.delete_topics([f"{kafka.topic_prefix}.{'batch' if batch else 'record'}.{c}"
                             for c in rows if "stored_bytes" in rows[c]])  # fmt: skip
    finally:
        admin.close()
    plain = rows["none"]["stored_bytes"]
    for row in rows.values():
        if "stored_bytes" in row:
            row["ratio"] = round(plain / row["stored_bytes"], 2)
    return {"records": len(values), "value_bytes": raw,
            "mean_value_bytes": round(raw / len(values)), "codecs": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args(argv)
    base = KafkaSettings(bootstrap=os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092"),
                         topic_prefix=f"bench-compression-{uuid.uuid4().hex[:8]}")  # fmt: skip
    result = {
        "benchmark": "compression",
        "settings": vars(args) | {"telemetry_format": base.telemetry_format},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "telemetry_batches": measure(base, True, args),
        "record_per_node": measure(base, False, args),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
