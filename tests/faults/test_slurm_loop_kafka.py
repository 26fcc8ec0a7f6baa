"""The whole loop on Slurm with every process real: `fleetpulse watch slurm` (inventory and the
node's changes on Kafka), `fleetpulse worker` (the faust app), `fleetpulse actuate slurm`, a real
slurmctld with a real job. An XID 79 on fleet.events.xid ends with the node drained after its
job, rebooted and resumed. Slow (three processes to start, a minute on 2 shared cores): `make
faults` runs it; test_slurm_loop.py runs the same loop through the embedded worker in `make test`.

The timings (from the XID's send) are printed and recorded for the Reliability table."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import NodeEvent, XidEvent
from pipeline.wire.topics import topic_name
from streams.testing import TopicReader, WorkerProcess, create_topics, produce_events, worker_env
from tests.faults.reliability import record
from tests.slurm_fixture import CLUSTER, POOL, ZONE, SlurmLab, slurm, slurm_conf  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_an_xid_on_kafka_drains_reboots_and_resumes_a_slurm_node(
    kafka_bootstrap: str, slurm: SlurmLab, tmp_path: Path  # noqa: F811
) -> None:
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=2)  # fmt: skip
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    env = worker_env(settings, tmp_path)
    create_topics(env)
    slurm_env = {**env, "FLEETPULSE_SLURM__CONF": slurm.conf, "FLEETPULSE_SLURM__CLUSTER": CLUSTER,
                 "FLEETPULSE_SLURM__ZONE": ZONE, "FLEETPULSE_SLURM__POLL_S": "0.5",
                 "FLEETPULSE_SLURM__DRAIN_POLL_S": "0.3"}  # fmt: skip
    node, marker = slurm.node(), tmp_path / "done"
    started: list[subprocess.Popen[bytes]] = []
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    reader = TopicReader(kafka.bootstrap, [topic_name(kafka, "events.node")])
    try:
        for command in ("watch", "actuate"):
            with (tmp_path / f"{command}.log").open("wb") as out:
                started.append(subprocess.Popen(
                    [sys.executable, "-m", "pipeline.cli", command, "slurm"], env=slurm_env,
                    stdout=out, stderr=subprocess.STDOUT))  # fmt: skip
        worker.wait_for(r"fleetpulse worker: assigned", 180)
        time.sleep(2)  # the watcher's first poll: the worker knows the nodes
        booted = slurm.state(node).boot_time
        slurm.job(node, 8, marker)
        sent = time.monotonic()
        produce_events(settings, [XidEvent(
            ts=int(time.time() * 1000), cluster=CLUSTER, node=node, pool=POOL, zone=ZONE,
            pci_bus_id="0000:53:00", gpu_index=0, xid=79, message="GPU has fallen off the bus",
            source="kernel_log")])  # fmt: skip
        seen: dict[str, float] = {}

        def heard() -> bool:
            for event in reader.values(topic_name(kafka, "events.node"), NodeEvent):
                if event.target == node:
                    seen.setdefault(event.kind, time.monotonic() - sent)
            if slurm.state(node).drain:
                seen.setdefault("DRAIN set", time.monotonic() - sent)
            return "repaired" in seen

        reader.until(heard, 120, f"{node} drained, rebooted and seen back")
    finally:
        for proc in started:
            proc.terminate()
            proc.wait(timeout=60)
        worker.stop(timeout=60)
        reader.close()
    assert marker.read_text().strip() == "done"  # the job ran to its end
    assert slurm.state(node).boot_time > booted
    assert {"cordoned", "drained", "repair_requested", "repaired"} <= set(seen), seen
    figures: dict[str, int | float | str] = {
        f"fault to {name} ms": round(1000 * seen[kind]) for name, kind in (
            ("DRAIN set", "DRAIN set"), ("DRAINED", "drained"),
            ("reboot asked", "repair_requested"), ("rebooted and resumed", "repaired"))}  # fmt: skip
    print(f"Slurm loop over Kafka (an 8 s job on {node}): {figures}")
    record("control", "Slurm: XID 79 on a node running an 8 s job, through Kafka, the worker, "
           "watch slurm and actuate slurm to a real slurmctld (drain, reboot ASAP, resume)",
           figures)  # fmt: skip
