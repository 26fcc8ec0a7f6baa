"""Infrastructure fault: the broker is down when every process starts.

The topics exist (the broker ran once), then the broker stops. A worker, a lake sink, the
alerts process (to a webhook receiver), the xid ingest adapter (tailing a kernel log) and
`simulate --to kafka` start while it is away. For ABSENT_S none may exit and each /readyz must
say not ready; then the broker starts and every process resumes by itself: the simulator's and
the adapter's records all reach their topics, the lake holds every output record, every alert
on fleet.alerts reaches the receiver. Recovery: from the broker's start until each process is
ready (the simulator: until it exited 0).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from pipeline.config import KafkaSettings
from pipeline.lake.tables import TABLES
from pipeline.model import Action, Alert, Finding, XidEvent
from pipeline.wire.topics import TOPICS, topic_name
from streams.testing import TopicReader, create_topics
from tests.faults import reliability
from tests.faults.infra import (
    XID_NODE,
    Broker,
    Outage,
    Proc,
    Receiver,
    base_env,
    lake_rows,
    lake_values,
    own_broker,
    receiver,
    wait_until,
    write_xids,
)

# ~4 min on a loaded 2-core machine: `make faults` only
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]
__all__ = ["own_broker", "receiver"]
ABSENT_S = 15
XIDS = 20
SIM = ["simulate", "--to", "kafka", "--duration", "900", "--gpu-nodes", "4", "--tpu-slices", "0",
       "--seed", "5", "--no-random-faults", "--inject", "G1@200", "--quiet"]
IDS = {"findings": ("finding_id", Finding), "actions": ("action_id", Action)}


def _inputs(kafka: KafkaSettings) -> list[str]:
    """What the simulator counts as sent: its telemetry and events, and its recording's
    inventory records (one per node and slice, at the start)."""
    return [topic_name(kafka, s.suffix) for s in TOPICS
            if s.suffix.startswith(("telemetry.", "events.")) or s.suffix == "inventory"]


def test_every_process_waits_for_a_broker_that_is_down_at_start(
    own_broker: Broker, receiver: Receiver, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    kafka = KafkaSettings(bootstrap=own_broker.bootstrap, topic_prefix=prefix, partitions=3)
    env = base_env(own_broker.bootstrap, prefix, tmp_path,
                   FLEETPULSE_ALERTS__WEBHOOK_URLS=f'["{receiver.url}"]')
    create_topics(env)
    kernel_log = tmp_path / "kern.log"
    xids = write_xids(kernel_log, 0, XIDS)
    own_broker.stop()

    lake = tmp_path / "lake"
    procs = {
        "worker": Proc("worker", ["worker", "--loglevel", "warning"], env, tmp_path / "w.log"),
        "sink": Proc("sink", ["sink", "lake", "--lake", str(lake)], env, tmp_path / "s.log"),
        "alerts": Proc("alerts", ["alerts"], env, tmp_path / "a.log"),
        "ingest": Proc("ingest", ["ingest", "xid", "--log", str(kernel_log)], env,
                       tmp_path / "i.log"),
    }
    sim = Proc("simulate", SIM, env, tmp_path / "sim.log")
    try:
        for proc in procs.values():
            proc.start()
        sim.start()
        outage = Outage()
        away_s = outage.watch([*procs.values(), sim], ABSENT_S, list(procs.values()))
        own_broker.start()
        back = time.monotonic()
        recovered: dict[str, float] = {}
        pending = dict(procs)
        while pending or sim.alive():
            for name, proc in list(pending.items()):
                assert proc.alive(), proc.tail()
                if proc.ready():
                    recovered[name] = round(time.monotonic() - back, 2)
                    del pending[name]
            if "simulate" not in recovered and not sim.alive():
                assert sim.wait(1) == 0, sim.tail()
                recovered["simulate"] = round(time.monotonic() - back, 2)
            assert time.monotonic() - back < 180, (pending, *(p.tail() for p in procs.values()))
            time.sleep(0.3)
        sent = int(re.search(r"^(\d+) events over", sim.text(), re.M)[1])  # type: ignore[index]

        inputs, outputs = _inputs(kafka), [topic_name(kafka, s.topic_suffix)
                                           for s in TABLES.values() if s.name != "xid"]
        reader = TopicReader(own_broker.bootstrap, [*inputs, *outputs])
        try:
            xid_topic = topic_name(kafka, "events.xid")
            reader.until(lambda: len(_adapter_xids(reader, xid_topic)) >= len(xids),
                         60, "the adapter's xid events")
            # values, not records: the simulator batches its telemetry by default
            reader.until(lambda: sum(len(reader.payloads(t)) for t in inputs) >= sent + XIDS,
                         60, "every simulated event")
            # the worker is done once its outputs stop growing
            _settle(reader, outputs, procs["worker"])
            worker_code = procs["worker"].stop()
            assert worker_code == 0, procs["worker"].tail()
            time.sleep(1)
            reader.poll()
            in_records = sum(len(reader.payloads(t)) for t in inputs)
            xid_seen = _adapter_xids(reader, xid_topic)
            topic_rows = {s.name: len(reader.values(topic_name(kafka, s.topic_suffix), s.event))
                          for s in TABLES.values()}
            topic_ids = {t: Counter(getattr(v, c) for v in reader.values(topic_name(kafka, t), cls))
                         for t, (c, cls) in IDS.items()}
            alert_keys = {(a.fingerprint, a.status)
                          for a in reader.values(topic_name(kafka, "alerts"), Alert)}
        finally:
            reader.close()
        wait_until(lambda: all(lake_rows(lake, t) >= n for t, n in topic_rows.items()), 60,
                   "the lake holds every output record", procs["sink"])
        wait_until(lambda: alert_keys <= set(receiver.keys()), 60, "every alert delivered",
                   procs["alerts"])
        codes = {name: procs[name].stop() for name in ("sink", "alerts", "ingest")}
    finally:
        for proc in [*procs.values(), sim]:
            proc.stop()

    lake_ids = {t: Counter(k[0] for k in lake_values(lake, t, [c]).elements())
                for t, (c, _) in IDS.items()}
    lost = (max(0, len(xids) - len(xid_seen)) + sum(len(set(topic_ids[t]) - set(lake_ids[t])) for t in IDS)
            + len(alert_keys - set(receiver.keys())) + max(0, sent + XIDS - in_records))
    duplicates = sum((lake_ids[t] - topic_ids[t]).total() for t in IDS)
    reliability.record("infrastructure", f"broker down for {ABSENT_S} s when every process "
                       "starts", {
        "outage_s": round(away_s, 1), "in": sent + XIDS, "consumed": in_records, "findings": topic_rows["findings"],
        "actions": topic_rows["actions"], "out": sum(lake_rows(lake, t) for t in TABLES),
        "alerts delivered": len(set(receiver.keys())), "lost": lost, "duplicates": duplicates,
        "same-id repeats": in_records - (sent + XIDS),
        "recovery_s": max(recovered.values()),
        "recovery by process": " ".join(f"{k}={v}" for k, v in sorted(recovered.items())),
        "not ready while away": "+".join(k for k, v in sorted(outage.unready.items()) if v),
    })
    assert codes == {"sink": 0, "alerts": 0, "ingest": 0}, [p.tail() for p in procs.values()]
    assert outage.unready == dict.fromkeys(procs, True)
    assert topic_rows["actions"] > 0 and alert_keys, "the scenario must act and alert"
    assert lost == 0
    assert duplicates == 0
    assert all(lake_rows(lake, t) == n for t, n in topic_rows.items())


def _adapter_xids(reader: TopicReader, topic: str) -> Counter[tuple[object, ...]]:
    """The adapter's events on the xid topic (its node), by what identifies a kernel-log Xid."""
    return Counter((x.ts, x.pci_bus_id, x.xid, x.pid, x.message)
                   for x in reader.values(topic, XidEvent) if x.node == XID_NODE)


def _settle(reader: TopicReader, topics: list[str], worker: Proc, quiet_s: float = 8) -> None:
    """Until no new output record arrived for `quiet_s` (the worker finished the input)."""
    last, since = -1, time.monotonic()
    deadline = since + 120
    while time.monotonic() - since < quiet_s:
        assert worker.alive(), worker.tail()
        assert time.monotonic() < deadline, "the worker's outputs never settled"
        reader.poll()
        now = sum(len(reader.records[t]) for t in topics)
        if now != last:
            last, since = now, time.monotonic()
