"""The door's clocks per source: fabric samples (node_exporter) are not held to the GPU clock.

DCGM and node_exporter are scraped apart. When every DCGM exporter goes quiet (a GPU-only
monitoring outage), the GPU clock stops; the fabric samples that keep coming must still be
admitted, not refused as "ahead" of a clock that only GPU samples move. A host whose fabric
records run a day ahead of the others is still refused.
"""

from __future__ import annotations

from collections import Counter

import msgspec

from pipeline.config import SimSettings, load_settings
from pipeline.model import DeadLetter, Event, FabricSample, GpuSample, XidEvent
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.wire.codec import encode
from pipeline.wire.topics import TOPICS

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
OUT = 25 * MINUTE  # the GPU-only outage: from minute 5 to 25
SUFFIX = {spec.value: spec.suffix for spec in TOPICS}
SIM = SimSettings(seed=3, gpu_nodes=8, tpu_slices=0, duration_s=30 * 60, random_faults=False,
                  diurnal=False)  # fmt: skip


def _events() -> list[Event]:
    return list(Simulation(SIM, []).events())


def _run(events: list[Event]) -> tuple[EmbeddedRuntime, Counter[tuple[str, str]]]:
    """The runtime, and its dead letters by (topic, reason)."""
    letters: Counter[tuple[str, str]] = Counter()

    def emit(suffix: str, event: Event) -> None:
        if isinstance(event, DeadLetter):
            letters[(event.topic, event.reason)] += 1

    runtime = EmbeddedRuntime(load_settings(environ={}), emit)
    for offset, event in enumerate(events):
        runtime.feed_raw(SUFFIX[type(event)], encode(event), offset)
    runtime.finish()
    return runtime, letters


def test_fabric_samples_are_admitted_through_a_gpu_only_outage() -> None:
    start = SIM.start_ms
    quiet = [
        e
        for e in _events()
        if not (isinstance(e, GpuSample | XidEvent) and start + 5 * MINUTE <= e.ts < start + OUT)
    ]
    fabric = sum(isinstance(e, FabricSample) for e in quiet)
    runtime, letters = _run(quiet)
    # (the first GPU samples after the outage are refused until a quorum agrees: clock.py)
    assert not [k for k in letters if k[0] == "telemetry.fabric"], letters
    assert runtime.counts["in.FabricSample"] == fabric
    # the GPU clock stood still through the outage: the fabric samples did not move it
    assert runtime.clocks["gpu"].ticked is not None and runtime.clocks["fabric"].ticked is not None
    assert runtime.clocks["fabric"].ticked > runtime.clocks["gpu"].ticked - MINUTE


def test_a_host_whose_fabric_records_run_a_day_ahead_is_still_refused() -> None:
    events = _events()
    host = next(e.node for e in events if isinstance(e, FabricSample))
    skewed = [
        msgspec.structs.replace(e, ts=e.ts + DAY)
        if isinstance(e, FabricSample) and e.node == host and e.ts >= SIM.start_ms + 10 * MINUTE
        else e
        for e in events
    ]
    late = sum(
        isinstance(e, FabricSample) and e.node == host and e.ts >= SIM.start_ms + DAY
        for e in skewed
    )
    _, letters = _run(skewed)
    assert late > 0 and letters == Counter({("telemetry.fabric", "ahead"): late})
