"""Infrastructure: the worker group scales from one to three workers and back, mid-stream, on
twelve partitions.

One worker takes the first part of the recording; two more join while the second part goes in
(the partitions and their tables move to them); they leave (SIGTERM) while the third part goes
in, and the first worker recovers their tables from the changelogs. Actions, findings, alerts
and final node states must equal the single-worker embedded runtime's; same-id repeats are
counted. Throughput against the number of workers is measured in bench/, not here.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import Event
from pipeline.wire.topics import topic_name
from streams.testing import WorkerProcess, create_topics, produce_events, scenario, worker_env
from tests.faults import reliability
from tests.faults.judge import Expected, Seen, inputs_consumed, wait_owned

pytestmark = pytest.mark.kafka
PARTITIONS = 12
PARTS_MS = (420_000, 840_000)  # event-time ends of the first and second parts
ALL = set(range(PARTITIONS))


def _parts(start_ms: int, events: list[Event]) -> list[list[Event]]:
    parts: list[list[Event]] = [[], [], []]
    for event in events:
        at = getattr(event, "ts", 0) - start_ms
        parts[sum(at >= end for end in PARTS_MS)].append(event)
    return parts


def _wait_spread(workers: list[WorkerProcess], topic: str, timeout: float) -> float:
    """Seconds until every worker owns part of `topic` and together they own all of it."""
    start = time.monotonic()
    while True:
        owned = [w.assignment().get(topic, set()) for w in workers]
        if all(owned) and sum(map(len, owned)) == PARTITIONS and set().union(*owned) == ALL:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{topic} not spread: {owned}"
        time.sleep(0.3)


@pytest.mark.slow  # make faults: a first start on fresh topics can stall on faust's changelog race
@pytest.mark.timeout(600)
def test_one_to_three_workers_and_back_mid_stream(kafka_bootstrap: str, tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=PARTITIONS)
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    sim = scenario()
    events = list(sim.events())
    want = Expected.of(settings, events)
    parts = _parts(sim.start_ms, events)
    findings = topic_name(kafka, "findings")
    create_topics(worker_env(settings, tmp_path / "admin"))

    def worker(name: str) -> WorkerProcess:
        return WorkerProcess(worker_env(settings, tmp_path / name), tmp_path / f"{name}.log")

    first = worker("w1").start()
    extra: list[WorkerProcess] = []
    seen = Seen.open(settings, kafka_bootstrap)
    consumed = 0
    try:
        wait_owned(first, findings, ALL, timeout=120)
        produce_events(settings, parts[0])
        seen.reader.until(lambda: bool(seen.actions()), 120, "the first part's first action")

        extra = [worker(n).start() for n in ("w2", "w3")]
        produce_events(settings, parts[1])  # while the group rebalances onto three
        scale_up_s = _wait_spread([first, *extra], findings, timeout=180)

        mark = len(first.output())
        consumed += sum(inputs_consumed(w) for w in extra)
        for leaving in extra:
            leaving.kill(15)  # SIGTERM: they leave the group
        scaled_down = time.monotonic()
        produce_events(settings, parts[2])  # while the first worker takes everything back
        for leaving in extra:  # one SIGTERM each: a second one would cut their shutdown short
            assert leaving.proc is not None
            leaving.proc.wait(60)
        codes = [w.stop() for w in extra]
        wait_owned(first, findings, ALL, timeout=120, after=mark)
        seen.wait_complete(want, timeout=150)
        recovered_s = time.monotonic() - scaled_down
        time.sleep(3)  # late repeats are judged too
        seen.reader.poll()
        consumed += inputs_consumed(first)
        codes.append(first.stop())
        figures = seen.figures(want)
        wrong = seen.same_decisions(want)
    finally:
        seen.close()
        for w in [first, *extra]:
            w.stop()
    reliability.record("infrastructure", "scale 1 → 3 → 1 workers, 12 partitions", {
        "in": len(events), "consumed": consumed, **figures,
        "scale_up_s": round(scale_up_s, 1), "recovery_s": round(recovered_s, 1),
    })
    assert codes == [0, 0, 0], [w.tail() for w in [*extra, first]]
    assert figures["lost"] == 0
    assert figures["unexpected"] == 0
    assert not wrong, f"repeats that are not the same decision: {wrong}"
