"""The whole loop on Slurm: an injected XID 79 on a node running a real job, through the worker's
logic (the embedded runtime: the same stages `fleetpulse worker` runs), to the node drained in a
real slurmctld, then rebooted and resumed — with the Slurm watcher feeding the inventory and the
node's changes back in, and the actuator's echoes going back as fleet.events.node would.

The timings (from the fault's arrival) are printed and recorded for the README's Reliability
table (tests/faults/reliability.py, suite "control")."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from pipeline.config import load_settings
from pipeline.model import Event, Inventory, NodeEvent, XidEvent
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.slurm.actuator import SlurmActuator
from pipeline.slurm.commands import Slurm
from pipeline.slurm.watcher import SlurmWatcher
from pipeline.wire import codec
from tests.faults.reliability import record
from tests.slurm_fixture import CLUSTER, POOL, ZONE, SlurmLab, slurm, slurm_conf  # noqa: F401


class Loop:
    """The embedded worker between a real Slurm watcher and a real Slurm actuator."""

    def __init__(self, lab: SlurmLab) -> None:
        settings = lab.settings()
        self.outputs: deque[tuple[str, Event]] = deque()
        self.runtime = EmbeddedRuntime(load_settings(environ={}),
                                       lambda suffix, event: self.outputs.append((suffix, event)),
                                       wall_ms=lambda: int(time.time() * 1000))  # fmt: skip
        slurm_ = Slurm(settings)
        self.actuator = SlurmActuator(slurm_, settings, CLUSTER)
        self.watcher = SlurmWatcher(slurm_, settings, CLUSTER, self._from_watcher)
        self.seen: list[tuple[float, str, str]] = []  # (seconds since the fault, what, kind)
        self.start = time.monotonic()

    def _from_watcher(self, outs: list[Any]) -> None:
        for out in outs:
            if out.value is None:
                continue
            cls = Inventory if out.topic == "inventory" else NodeEvent
            event = codec.decode(out.value, cls)
            if isinstance(event, NodeEvent):
                self.seen.append((time.monotonic() - self.start, "watcher", event.kind))
            self.runtime.feed(event)

    def turn(self) -> None:
        """Carry out the actions the worker has emitted (echoes fed back), then poll Slurm."""
        while self.outputs:
            suffix, event = self.outputs.popleft()
            if suffix != "actions":
                continue
            echo = self.actuator.handle(event)  # type: ignore[arg-type]
            if echo is not None:
                self.seen.append((time.monotonic() - self.start, event.kind, echo.kind))  # type: ignore[attr-defined]
                self.runtime.feed(echo)
        self.watcher.poll()

    def when(self, what: str, kind: str) -> float | None:
        return next((t for t, w, k in self.seen if (w, k) == (what, kind)), None)


def test_an_injected_xid_drains_reboots_and_resumes_a_slurm_node(
    slurm: SlurmLab, tmp_path: Path  # noqa: F811
) -> None:
    node, marker = slurm.node(), tmp_path / "done"
    loop = Loop(slurm)
    loop.watcher.poll()  # the inventory: the worker learns the nodes, pools and zones
    booted = slurm.state(node).boot_time
    slurm.job(node, 3, marker)
    loop.start = time.monotonic()
    loop.runtime.feed(XidEvent(ts=int(time.time() * 1000), cluster=CLUSTER, node=node,
                               pool=POOL, zone=ZONE, pci_bus_id="0000:53:00", gpu_index=0,
                               xid=79, message="GPU has fallen off the bus",
                               source="kernel_log"))  # fmt: skip

    def repaired() -> bool:
        loop.turn()
        return loop.when("watcher", "repaired") is not None

    slurm.until(repaired, 60, f"{node} drained, rebooted and seen back")
    assert marker.read_text().strip() == "done"  # the running job finished: drained, not killed
    assert [(w, k) for _, w, k in loop.seen if w != "watcher"] == [
        ("cordon", "cordoned"), ("drain", "drained"), ("reboot", "repair_requested")]
    assert slurm.state(node).boot_time > booted
    figures: dict[str, int | float | str] = {name: round(1000 * (loop.when(*step) or 0)) for name, step in (
        ("fault to DRAIN set ms", ("cordon", "cordoned")),
        ("fault to DRAINED ms", ("drain", "drained")),
        ("fault to reboot asked ms", ("reboot", "repair_requested")),
        ("fault to rebooted and resumed ms", ("watcher", "repaired")))}  # fmt: skip
    print(f"Slurm loop (a 3 s job on {node}): {figures}")
    assert 0 < int(figures["fault to DRAIN set ms"]) < int(figures["fault to DRAINED ms"])
    record("control", "Slurm: XID 79 on a node running a 3 s job, through the embedded worker "
           "to a real slurmctld (drain, reboot ASAP, resume)", figures)  # fmt: skip
