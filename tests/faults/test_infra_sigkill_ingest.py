"""Infrastructure fault: SIGKILL of the polling ingest adapters at a random point, restarted
with their checkpoint (the xid adapter and the others are in test_infra_sigkill.py).

Each adapter is a real subprocess polling the simulator's stand-in of its endpoint
(pipeline/sim/endpoints, as `fleetpulse serve-sim` serves them) into a real Kafka. The
simulated fleet is served as it happens (wall-clock pace), the kill falls while it is, and
afterwards every record the stand-in served reaches its topic; a repeat carries the same id
(the record's deterministic identity: host and timestamp, zone and metric and timestamp):

- cloudmon: every TPU sample of the served history (Cloud Monitoring keeps history: the
  restarted adapter reads on from its checkpointed interval end);
- tpu-runtime: libtpu serves only the latest reading, so a reading that comes and goes while
  no adapter runs can be read by none. The stand-in here moves to the next reading once the
  current one is on its topic (lockstep): what is asserted is that no reading the adapter
  was shown is lost across the kill, and none is published under another id;
- capacity (all four feeds): every quota reading served (Cloud Monitoring history) reaches
  fleet.events.capacity, and every GPU instance and TPU slice fleet.inventory;
- prometheus (slow: a real Prometheus, deploy/prometheus/prometheus.sh, scraping the
  dcgm-exporter stand-ins every second): every sample Prometheus scraped. The stand-in
  waits for the scrape of each sample, so the TSDB holds all that were served.

The simulation a test serves starts when serving starts: Cloud Monitoring and Prometheus
never get a point older than the adapter's lag, and neither do these stand-ins.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.config import KafkaSettings, SimSettings
from pipeline.model import CapacityEvent, Event, GpuSample, IciSample, TpuSample
from pipeline.sim.endpoints.fleet import SimEndpoints
from pipeline.sim.endpoints.tpu_runtime import TpuRuntimeStandIn
from pipeline.sim.engine import Simulation
from pipeline.wire.admin import create_topics
from pipeline.wire.topics import topic_name
from streams.testing import TopicReader
from tests.faults.infra import Proc, base_env, seeded_point, wait_until
from tests.faults.test_infra_sigkill import _kill_and_restart, _record

pytestmark = pytest.mark.kafka
PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.sh"
SERVED_S = 12  # simulated seconds, served at wall-clock pace; the kill falls inside


def _simulation(**overrides: object) -> Simulation:
    now_ms = int(time.time() * 1000)
    config = SimSettings(
        seed=7, duration_s=SERVED_S, gpu_nodes=0, tpu_slices=1, clusters=1,
        tpu_slice_types=("v6e-16:4x4",), random_faults=False, tpu_interval_s=1,
        ici_interval_s=1, start_ms=now_ms - now_ms % 1000 + 2000,
    )
    return Simulation(msgspec.structs.replace(config, **overrides))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(sim: Simulation, dispatch: Callable[[Event], None], served: list[Event]) -> threading.Thread:
    """Hand each tick to the stand-ins when the wall clock reaches its time (as serve-sim).
    `sim` starts now: made earlier (for its fleet), its first points would be older than
    the adapter's position, as Cloud Monitoring never has them (they come within the lag)."""
    def run() -> None:
        for tick in sim.ticks():
            if tick:
                time.sleep(max(0.0, tick[0].ts / 1000 - time.time()))
            for event in tick:
                dispatch(event)
                served.append(event)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def endpoints(tmp_path: Path) -> Iterator[SimEndpoints]:
    """The stand-ins of the simulated fleet (one TPU slice), as serve-sim starts them."""
    with SimEndpoints(_simulation().fleet, tmp_path / "endpoints",
                      project="fleetpulse-sim") as served:
        yield served


def _drain(reader: TopicReader, ids: Callable[[], Counter[Any]], want: set[Any],
           timeout: float) -> Counter[Any]:
    """Read until every id in `want` is seen (or `timeout` s), then 2 s more for repeats; the
    ids seen. The caller asserts, naming what is missing."""
    deadline = time.monotonic() + timeout
    while not want <= set(ids()) and time.monotonic() < deadline:
        reader.poll()
    settle = time.monotonic() + 2
    while time.monotonic() < settle:
        reader.poll()
    return ids()


def _tpu_ids(reader: TopicReader, topic: str) -> Counter[tuple[str, int]]:
    return Counter((s.node, s.ts) for s in reader.values(topic, TpuSample))


def test_sigkill_of_the_cloudmon_ingest_adapter(
    kafka_settings: KafkaSettings, endpoints: SimEndpoints, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    stand_ins = endpoints
    env = base_env(
        kafka.bootstrap, kafka.topic_prefix, tmp_path,
        FLEETPULSE_SOURCES__POLL_INTERVAL_S="0.5",
        FLEETPULSE_SOURCES__CLOUDMON_ENDPOINT=stand_ins.cloudmon.address,
        FLEETPULSE_SOURCES__CLOUDMON_PROJECT="fleetpulse-sim",
        FLEETPULSE_SOURCES__CLOUDMON_INVENTORY=str(stand_ins.out / "tpu-inventory.json"),
        # the stand-in has a point the moment it is served: a small lag covers the pacing
        FLEETPULSE_SOURCES__CLOUDMON_LAG_S="2",
    )
    seed, point = seeded_point("cloudmon adapter", 1.0, SERVED_S - 3)
    proc = Proc("cloudmon adapter", ["ingest", "cloudmon"], env, tmp_path / "c.log").start()
    wait_until(proc.ready, 60, "the adapter reached Kafka", proc)
    served: list[Event] = []
    serving = _serve(_simulation(), stand_ins.dispatch, served)
    topic = topic_name(kafka, "telemetry.tpu")
    reader = TopicReader(kafka.bootstrap, [topic])
    try:
        recovered = _kill_and_restart(proc, point)
        serving.join(SERVED_S + 30)
        want = {(s.node, s.ts) for s in served if isinstance(s, TpuSample)}
        seen = _drain(reader, lambda: _tpu_ids(reader, topic), want, 60)
    finally:
        reader.close()
        code = proc.stop()
    _record("the cloudmon ingest adapter", seed, point, {
        "in": len(want), "consumed": sum(seen.values()), "lost": len(want - set(seen)),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert want and want <= set(seen), (sorted(want - set(seen)), sorted(want), proc.tail())
    assert set(seen) <= want  # nothing the stand-in did not serve


def _tpu_runtime_env(sim: Simulation, address: str, base: dict[str, str]) -> dict[str, str]:
    [tpu_slice] = sim.fleet.slices
    host = tpu_slice.hosts[1]
    return {
        **base,
        "FLEETPULSE_SOURCES__POLL_INTERVAL_S": "0.3",
        "FLEETPULSE_SOURCES__TPU_RUNTIME_ENDPOINT": address,
        "FLEETPULSE_SOURCES__CLUSTER": tpu_slice.cluster,
        "FLEETPULSE_SOURCES__POOL": tpu_slice.pool,
        "FLEETPULSE_SOURCES__ZONE": tpu_slice.zone,
        "FLEETPULSE_SOURCES__NODE": host.node,
        "FLEETPULSE_SOURCES__TPU_SLICE": tpu_slice.name,
        "FLEETPULSE_SOURCES__TPU_ACCELERATOR_TYPE": tpu_slice.accelerator_type,
        "FLEETPULSE_SOURCES__TPU_TOPOLOGY": tpu_slice.topology,
        "FLEETPULSE_SOURCES__TPU_WORKER_ID": str(host.worker_id),
    }


@pytest.mark.slow  # make faults; the Cloud Monitoring adapter's kill is make test's
def test_sigkill_of_the_tpu_runtime_ingest_adapter(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    sim = _simulation(duration_s=40)
    node = sim.fleet.slices[0].hosts[1].node
    ticks = [[e for e in tick if isinstance(e, TpuSample | IciSample) and e.node == node]
             for tick in sim.ticks()]
    readings = [tick for tick in ticks if tick]
    chips_topic, links_topic = topic_name(kafka, "telemetry.tpu"), topic_name(kafka, "telemetry.ici")
    seed, point = seeded_point("tpu-runtime adapter", 1.0, 6.0)
    with TpuRuntimeStandIn() as server:
        env = _tpu_runtime_env(sim, server.address,
                               base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path))
        proc = Proc("tpu-runtime adapter", ["ingest", "tpu-runtime"], env, tmp_path / "t.log")
        reader = TopicReader(kafka.bootstrap, [chips_topic, links_topic])
        stepping = _lockstep(server, readings, lambda: _runtime_ids(reader, chips_topic,
                                                                     links_topic))
        proc.start()
        try:
            wait_until(proc.ready, 60, "the adapter reached Kafka", proc)
            recovered = _kill_and_restart(proc, point)
            wait_until(lambda: not stepping.is_alive(), 90, "every reading on its topic", proc)
            seen = _drain(reader, lambda: _runtime_ids(reader, chips_topic, links_topic),
                          set(), 0)
        finally:
            reader.close()
            code = proc.stop()
    want = {(type(e).__name__, e.ts) for tick in readings for e in tick}
    _record("the tpu-runtime ingest adapter", seed, point, {
        "in": len(want), "consumed": sum(seen.values()), "lost": len(want - set(seen)),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert want == set(seen), (sorted(want ^ set(seen)), proc.tail())


def _lockstep(server: TpuRuntimeStandIn, readings: list[list[Event]],
              seen: Callable[[], Counter[Any]]) -> threading.Thread:
    """Serve each reading until it is on its topic, then the next (libtpu keeps only the
    latest: without the lockstep a reading served while no adapter runs is read by none)."""
    def run() -> None:
        for tick in readings:
            for event in tick:
                if isinstance(event, TpuSample):
                    server.update_chips(event)
                elif isinstance(event, IciSample):
                    server.update_links(event)
            ids = {(type(e).__name__, e.ts) for e in tick}
            while not ids <= set(seen()):
                time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _runtime_ids(reader: TopicReader, chips: str, links: str) -> Counter[tuple[str, int]]:
    reader.poll()
    return Counter([("TpuSample", s.ts) for s in reader.values(chips, TpuSample)]
                   + [("IciSample", s.ts) for s in reader.values(links, IciSample)])


def _quota_ids(reader: TopicReader, topic: str) -> Counter[tuple[str, str, str, int]]:
    return Counter((e.zone, e.quota.metric, e.kind, e.ts) for e in reader.values(
        topic, CapacityEvent) if e.quota is not None and e.kind != "QUOTA_CHANGED")


@pytest.mark.slow  # make faults; the Cloud Monitoring adapter's kill is make test's
def test_sigkill_of_the_capacity_ingest_adapter(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    # quota readings every second (Cloud Monitoring history), GPU instances (Compute Engine,
    # metadata server) and a TPU slice (TPU API) for fleet.inventory
    fleet = {"gpu_nodes": 2, "capacity_interval_s": 1, "gpu_interval_s": 10}
    sim = _simulation(**fleet)
    with SimEndpoints(sim.fleet, tmp_path / "endpoints", project="fleetpulse-sim") as stand_ins:
        node = sim.fleet.gpu_nodes[0].name
        env = base_env(
            kafka.bootstrap, kafka.topic_prefix, tmp_path,
            FLEETPULSE_CAPACITY__FEEDS='["quota", "tpu", "compute", "metadata"]',
            FLEETPULSE_CAPACITY__POLL_INTERVAL_S="1",
            FLEETPULSE_CAPACITY__METADATA_WAIT_S="0.5",
            FLEETPULSE_CAPACITY__MONITORING_ENDPOINT=stand_ins.cloudmon.address,
            FLEETPULSE_CAPACITY__TPU_ENDPOINT=stand_ins.tpu_api.address,
            FLEETPULSE_CAPACITY__COMPUTE_ENDPOINT=stand_ins.compute.address,
            FLEETPULSE_CAPACITY__METADATA_URL=stand_ins.metadata[node].address,
            FLEETPULSE_CAPACITY__QUOTA_LAG_S="2",  # covers the pacing, as for cloudmon
        )
        seed, point = seeded_point("capacity adapter", 1.0, SERVED_S - 3)
        proc = Proc("capacity adapter", ["ingest", "capacity"], env, tmp_path / "q.log").start()
        wait_until(proc.ready, 60, "the adapter reached Kafka", proc)
        served: list[Event] = []
        serving = _serve(_simulation(**fleet), stand_ins.dispatch, served)
        capacity, inventory = topic_name(kafka, "events.capacity"), topic_name(kafka, "inventory")
        reader = TopicReader(kafka.bootstrap, [capacity, inventory])
        try:
            recovered = _kill_and_restart(proc, point)
            serving.join(SERVED_S + 30)
            want = {(e.zone, e.quota.metric, e.kind, e.ts) for e in served
                    if isinstance(e, CapacityEvent) and e.quota is not None
                    and e.kind not in ("QUOTA_CHANGED", "RESERVATION_CHANGED")}  # no reservations feed
            seen = _drain(reader, lambda: _quota_ids(reader, capacity), want, 60)
            members = {r.key for r in reader.records[inventory]}
        finally:
            reader.close()
            code = proc.stop()
    members_want = [f"{n.cluster}/{n.name}".encode() for n in sim.fleet.gpu_nodes] + [
        f"{s.cluster}/{s.name}".encode() for s in sim.fleet.slices]
    _record("the capacity ingest adapter", seed, point, {
        "in": len(want), "consumed": sum(seen.values()), "lost": len(want - set(seen)),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "inventory members": f"{len(members & set(members_want))}/{len(members_want)}",
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert want and want <= set(seen), (
        "missing", Counter(i[3] for i in want - set(seen)), "seen", Counter(i[3] for i in seen),
        "served", Counter(i[3] for i in want), proc.tail(6000))
    assert set(seen) <= want
    assert members == set(members_want)


# a GPU sample every 2 s: serving one and waiting for its scrape (1 s) keeps up with the clock
GPU_FLEET: dict[str, object] = {"gpu_nodes": 2, "tpu_slices": 0, "gpu_interval_s": 2,
                                "duration_s": 2 * SERVED_S}


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, SimEndpoints]]:
    """Two GPU nodes' dcgm-exporter stand-ins, scraped every second by a real Prometheus
    (deploy/prometheus/prometheus.sh, as tests/integration/test_prometheus_source.py)."""
    with SimEndpoints(_simulation(**GPU_FLEET).fleet, tmp_path / "endpoints") as stand_ins:
        port = free_port()
        env = {**os.environ, "PROMETHEUS_PORT": str(port), "PROMETHEUS_SCRAPE_INTERVAL": "1s",
               "PROMETHEUS_TARGETS": str(stand_ins.out / "prometheus-targets.json"),
               "PROMETHEUS_CACHE_DIR": str(tmp_path / "prometheus")}
        subprocess.run(["bash", str(PROMETHEUS), "start"], env=env, check=True, timeout=120)
        try:
            yield f"http://127.0.0.1:{port}", stand_ins
        finally:
            subprocess.run(["bash", str(PROMETHEUS), "stop"], env=env, check=True, timeout=60)


def _scraped(stand_ins: SimEndpoints) -> Callable[[Event], None]:
    """Dispatch, and for a GPU sample wait until Prometheus scraped it (a scrape that began
    after it was served), so the TSDB holds every sample served."""
    def dispatch(event: Event) -> None:
        stand_ins.dispatch(event)
        if isinstance(event, GpuSample):
            exporter = stand_ins.exporters[event.node]
            count = exporter.scrapes_started + 1
            deadline = time.monotonic() + 15
            while exporter.scrapes_served < count:
                assert time.monotonic() < deadline, "Prometheus did not scrape the stand-in"
                time.sleep(0.05)

    return dispatch


@pytest.mark.slow
@pytest.mark.prometheus
def test_sigkill_of_the_prometheus_ingest_adapter(
    kafka_settings: KafkaSettings, prometheus: tuple[str, SimEndpoints],
    tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    url, stand_ins = prometheus
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path,
                   FLEETPULSE_SOURCES__POLL_INTERVAL_S="0.5",
                   FLEETPULSE_SOURCES__PROMETHEUS_URL=url,
                   # covers the pacing and the scrape: a sample is in the TSDB within seconds
                   FLEETPULSE_SOURCES__PROMETHEUS_LAG_S="6")
    seed, point = seeded_point("prometheus adapter", 2.0, 2 * SERVED_S - 8)
    proc = Proc("prometheus adapter", ["ingest", "prometheus"], env, tmp_path / "p.log").start()
    wait_until(proc.ready, 60, "the adapter reached Kafka", proc)
    served: list[Event] = []
    serving = _serve(_simulation(**GPU_FLEET), _scraped(stand_ins), served)
    topic = topic_name(kafka, "telemetry.gpu")
    reader = TopicReader(kafka.bootstrap, [topic])
    try:
        recovered = _kill_and_restart(proc, point)
        serving.join(4 * SERVED_S)
        want = {(s.node, s.ts) for s in served if isinstance(s, GpuSample)}
        seen = _drain(reader, lambda: Counter(
            (s.node, s.ts) for s in reader.values(topic, GpuSample)), want, 60)
    finally:
        reader.close()
        code = proc.stop()
    _record("the prometheus ingest adapter", seed, point, {
        "in": len(want), "consumed": sum(seen.values()), "lost": len(want - set(seen)),
        "same-id repeats": sum(n - 1 for n in seen.values()),
        "recovery_s": round(recovered, 2)})
    assert code == 0, proc.tail()
    assert want and want <= set(seen), (sorted(want - set(seen)), proc.tail())
    assert set(seen) <= want
