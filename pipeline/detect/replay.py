"""All detectors behind one door: feed topic values in order, get findings.

`Detectors` keys the states as the stream does (GPU samples and XIDs by node, TPU and ICI
samples by slice) and advances the staleness checks with the event time it has seen, so a
recording replays exactly as the stream processors would run it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from pipeline.config import DetectSettings
from pipeline.detect.announce import note_event
from pipeline.detect.gpu import GpuNodeState, check_stale_gpu, detect_gpu
from pipeline.detect.ici import IciSliceState, detect_ici
from pipeline.detect.tpu import TpuSliceState, check_stale_tpu, detect_tpu
from pipeline.detect.xid import XidState, detect_xid, expire_xid
from pipeline.model import (
    CapacityEvent,
    Event,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    TpuSample,
    XidEvent,
)

# How far event time must move before the staleness checks run again.
TICK_MS = 5_000


class Detectors:
    def __init__(self, settings: DetectSettings) -> None:
        self.settings = settings
        self.gpu: dict[str, GpuNodeState] = {}
        self.xid: dict[str, XidState] = {}
        self.tpu: dict[str, TpuSliceState] = {}
        self.ici: dict[str, IciSliceState] = {}
        self.now_ms = 0
        self.last_tick_ms = 0
        self.ignored = 0  # records of topics the detectors do not read

    def feed(self, event: Event) -> list[Finding]:
        """One record; returns its findings, then any that the advance of time reveals."""
        s = self.settings
        if isinstance(event, GpuSample):
            self.gpu[event.node], out = detect_gpu(self.gpu.get(event.node), event, s)
        elif isinstance(event, XidEvent):
            self.xid[event.node], out = detect_xid(self.xid.get(event.node), event, s)
        elif isinstance(event, TpuSample):
            self.tpu[event.slice], out = detect_tpu(self.tpu.get(event.slice), event, s)
        elif isinstance(event, IciSample):
            self.ici[event.slice], out = detect_ici(self.ici.get(event.slice), event, s)
        elif isinstance(event, NodeEvent | CapacityEvent):
            self._note(event)
            return []
        else:
            self.ignored += 1
            return []
        ts: int = event.ts
        if ts > self.now_ms:
            self.now_ms = ts
            if ts - self.last_tick_ms >= TICK_MS:
                out = out + self.tick(ts)
        return out

    def _note(self, event: NodeEvent | CapacityEvent) -> None:
        # Node events are keyed like the telemetry; capacity events name their target.
        name = event.target
        if name is None:
            return
        for table in (self.gpu, self.tpu):
            state = table.get(name)
            if state is not None:
                note_event(state, event)

    def tick(self, now_ms: int) -> list[Finding]:
        """Run the time-driven checks (silent nodes and hosts, ended XID bursts) at `now_ms`."""
        self.last_tick_ms = now_ms
        out: list[Finding] = []
        s = self.settings
        for node, gpu_state in self.gpu.items():
            self.gpu[node], found = check_stale_gpu(gpu_state, now_ms, s)
            out.extend(found)
        for slice_name, tpu_state in self.tpu.items():
            self.tpu[slice_name], found = check_stale_tpu(tpu_state, now_ms, s)
            out.extend(found)
        for node, xid_state in self.xid.items():
            self.xid[node], found = expire_xid(xid_state, now_ms, s)
            out.extend(found)
        return out
