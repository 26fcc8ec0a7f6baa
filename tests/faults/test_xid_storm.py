"""An XID storm at the source: a kernel log with 100,000 Xid lines of one GPU (plus a few of
others) through `fleetpulse ingest xid --once` into the real broker. The topic gets a handful
of records whose counts add up to every line, and the embedded runtime takes the one action it
takes for a single such line."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, SourcesSettings
from pipeline.model import Action, Event, GpuSample, XidEvent
from pipeline.schemas_tool import SCHEMA_DIR, file_name
from pipeline.sources.base import load_checkpoint
from pipeline.sources.publish import KafkaPublisher
from pipeline.sources.xid import Identity, XidPosition, XidSource, parse_lines
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode
from pipeline.wire.topics import topic_name
from streams.testing import TopicReader, embedded_outputs
from tests.faults import reliability
from tests.faults.infra import XID_NODE, Proc, base_env

LINES = 100_000
STORM_PCI, STORM_XID = "0000:53:00", 79
IDENTITY = Identity(cluster="c1", node=XID_NODE, pool="default", zone="local-a")


def _gpu_samples() -> list[GpuSample]:
    sample = decode((SCHEMA_DIR / "samples" / file_name(GpuSample)).read_bytes(), GpuSample)
    return [
        msgspec.structs.replace(sample, ts=sample.ts + 10_000 * i, cluster=IDENTITY.cluster,
                                node=XID_NODE, pool=IDENTITY.pool, zone=IDENTITY.zone)
        for i in range(30)
    ]  # fmt: skip


def _stamp(us: int) -> str:
    seconds, micro = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micro:06d}+00:00"


def _line(us: int, pci: str, xid: int, rest: str) -> str:
    return f"{_stamp(us)} {XID_NODE} kernel: NVRM: Xid (PCI:{pci}): {xid}, {rest}\n"


def _kernel_log(start_ms: int) -> tuple[list[str], list[str]]:
    """The storm (100,000 lines of one GPU's Xid 79 over 50 s, as a driver in a loop prints
    them) with a few lines of other GPUs among them; and the same log with one storm line."""
    start = start_ms * 1000
    others = [
        _line(start + 1_000_000, "0000:54:00", 13, "pid=4101, name=train.py, Graphics Exception"),
        _line(start + 2_000_000, "0000:55:00", 31, "pid=4102, name=train.py, MMU Fault"),
        _line(start + 3_000_000, "0000:54:00", 13, "pid=4103, name=eval.py, Graphics Exception"),
    ]
    storm = [_line(start + 500 * n, STORM_PCI, STORM_XID, "GPU has fallen off the bus.")
             for n in range(LINES)]  # fmt: skip
    # among the storm's lines, in time order
    log = [*storm[:2000], others[0], *storm[2000:4000], others[1], *storm[4000:6000], others[2],
           *storm[6000:]]  # fmt: skip
    return log, [storm[0], *others]


def _actions(settings: Settings, samples: list[GpuSample], xids: list[XidEvent]) -> list[Action]:
    events: list[Event] = sorted([*samples, *xids], key=lambda e: e.ts)  # type: ignore[attr-defined]
    out = embedded_outputs(settings, events)
    return [a for a in out.get("actions", []) if isinstance(a, Action)]


def _to_the_broker(log: Path, state: Path, coalesce_s: float, kafka: KafkaSettings) -> float:
    """Lines per second from the log to the broker's acknowledgement, in process."""
    settings = SourcesSettings(cluster="c1", node=XID_NODE, state_dir=str(state),
                               xid_coalesce_s=coalesce_s)  # fmt: skip
    source = XidSource(settings, path=log, once=True)
    publisher = KafkaPublisher(kafka, f"storm-{coalesce_s}")
    try:
        started = time.perf_counter()
        batch = source.poll()
        publisher.publish(source.name, batch.events, batch.bad)
        source.commit(batch.position)
        took = time.perf_counter() - started
    finally:
        source.close()
        publisher.close()
    assert sum(e.count for e in batch.events if isinstance(e, XidEvent)) == LINES + 3
    return (LINES + 3) / took


def test_an_xid_storm_is_a_handful_of_records_and_one_action(
    kafka_settings: KafkaSettings, settings: Settings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    samples = _gpu_samples()
    log_lines, calm_lines = _kernel_log(samples[0].ts + 95_000)
    log = tmp_path / "kern.log"
    log.write_text("".join(log_lines))
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path)
    adapter = Proc("ingest", ["ingest", "xid", "--log", str(log), "--once"], env,
                   tmp_path / "ingest.log").start()  # fmt: skip
    assert adapter.wait(120) == 0, adapter.tail()
    topic = topic_name(kafka, "events.xid")
    reader = TopicReader(kafka.bootstrap, [topic])
    try:
        reader.until(lambda: sum(x.count for x in reader.values(topic, XidEvent)) >= LINES + 3,
                     60, "every line counted")  # fmt: skip
        time.sleep(1)
        reader.poll()
        records = reader.values(topic, XidEvent)
    finally:
        reader.close()
    storm = [x for x in records if (x.pci_bus_id, x.xid) == (STORM_PCI, STORM_XID)]
    summed = sum(x.count for x in storm)
    # the single-line run: the storm's first line and the other lines, as the parser reads them
    calm = parse_lines(calm_lines, IDENTITY, fallback_ts_ms=0, gpus={}).events
    one: list[XidEvent] = [e for e in calm if isinstance(e, XidEvent)]
    after_storm = _actions(settings, samples, records)
    after_one = _actions(settings, samples, one)
    removals = sum(1 for a in after_storm if a.kind == "cordon")  # nodes taken out
    reliability.record("input", "XID storm: 100,000 lines of one GPU in the kernel log", {
        "lines": LINES, "records published": len(storm), "count summed": summed,
        "removals": removals, "lost": LINES - summed,
    })  # fmt: skip
    assert summed == LINES, f"expected the storm's counts to add up to {LINES}, got {summed}"
    assert len(storm) <= 12, [(x.ts, x.count) for x in storm]  # one per 10 s window, and the first
    assert storm[0].count == 1 and storm[0].ts == one[0].ts  # the first line at once
    assert all(x.end_ts - x.ts <= 10_000 for x in storm)
    others = sorted((x.pci_bus_id, x.xid, x.pid, x.count) for x in records if x not in storm)
    assert others == [("0000:54:00", 13, 4101, 1), ("0000:54:00", 13, 4103, 1),
                      ("0000:55:00", 31, 4102, 1)]  # fmt: skip
    shown = [(a.kind, a.target.name, a.reason.checks) for a in after_storm]
    assert shown == [(a.kind, a.target.name, a.reason.checks) for a in after_one], shown
    assert removals == 1, shown  # one cordon (and the drain that follows it), as for one line


@pytest.mark.slow
def test_lines_per_second_to_the_broker_with_and_without_coalescing(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    create_topics(kafka_settings)
    log = tmp_path / "kern.log"
    log.write_text("".join(_kernel_log(1_767_225_600_000)[0]))
    coalesced = _to_the_broker(log, tmp_path / "a", 10.0, kafka_settings)
    every_line = _to_the_broker(log, tmp_path / "b", 0.0, kafka_settings)
    print(f"xid source, {LINES + 3} lines to the broker: {coalesced:,.0f} lines/s coalescing, "
          f"{every_line:,.0f} lines/s one record per line")  # fmt: skip
    # parsing bounds the first; 100,003 records acknowledged one by one bound the second
    assert coalesced > every_line, (coalesced, every_line)


def test_a_stop_in_a_storm_sends_what_it_held_and_a_restart_counts_the_rest_once(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    log = tmp_path / "kern.log"
    storm = _kernel_log(1_767_225_600_000)[0]
    log.write_text("".join(storm[:30_000]))  # 3 MiB: the daemon reads 1 MiB a poll
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path)
    daemon = Proc("ingest", ["ingest", "xid", "--log", str(log)], env, tmp_path / "daemon.log")
    topic = topic_name(kafka, "events.xid")
    reader = TopicReader(kafka.bootstrap, [topic])
    try:
        daemon.start()
        reader.until(lambda: bool(reader.values(topic, XidEvent)), 60, "the storm's first line")
        assert daemon.stop() == 0, daemon.tail()  # SIGTERM: what its windows hold goes out
        saved = load_checkpoint(tmp_path / "sources" / "xid.json", XidPosition)
        assert saved is not None
        read = log.read_bytes()[: saved.files[0].offset].count(b"\n")
        reader.until(lambda: sum(x.count for x in reader.values(topic, XidEvent)) >= read, 30,
                     "the lines it read")  # fmt: skip
        reader.poll()
        sent = sum(x.count for x in reader.values(topic, XidEvent))
        # its first poll read a MiB (thousands of lines): held, they would leave the checkpoint
        # at the second line; sent at the stop, it is after all of them
        assert sent == read > 1000, f"the stopped adapter read {read} lines and counted {sent}"
        with log.open("a") as out:
            out.write("".join(storm[30_000:]))
        once = Proc("ingest", ["ingest", "xid", "--log", str(log), "--once"], env,
                    tmp_path / "once.log").start()  # fmt: skip
        assert once.wait(120) == 0, once.tail()
        reader.until(lambda: sum(x.count for x in reader.values(topic, XidEvent)) >= LINES + 3,
                     60, "every line counted")  # fmt: skip
        time.sleep(1)
        reader.poll()
        counted = sum(x.count for x in reader.values(topic, XidEvent))
    finally:
        reader.close()
        daemon.stop()
    assert counted == LINES + 3, f"expected {LINES + 3} lines counted once, got {counted}"
