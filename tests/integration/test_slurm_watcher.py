"""The Slurm node watcher against a real slurmctld: the inventory from the first poll, people's
drains and resumes, FleetPulse's own left to the actuator's echo, a killed slurmd seen DOWN
and back, and a controller that does not answer never read as "no nodes"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.actuate.kafka import Out
from pipeline.errors import SinkError
from pipeline.model import Inventory, NodeEvent
from pipeline.slurm.commands import Slurm
from pipeline.slurm.watcher import SlurmWatcher
from pipeline.wire import codec
from tests.integration.test_slurm_actuator import action, actuator
from tests.slurm_fixture import CLUSTER, NODES, SlurmLab, slurm, slurm_conf  # noqa: F401


class Sent:
    """What the watcher emitted, decoded (a list standing in for Kafka's acknowledgement)."""

    def __init__(self) -> None:
        self.outs: list[Out] = []

    def __call__(self, outs: list[Out]) -> None:
        self.outs += outs

    def events(self, node: str) -> list[NodeEvent]:
        return [codec.decode(o.value, NodeEvent) for o in self.outs
                if o.topic == "events.node" and o.value is not None
                and o.key == f"{CLUSTER}/{node}"]  # fmt: skip


def watcher(lab: SlurmLab, **settings: Any) -> tuple[SlurmWatcher, Sent]:
    sent, chosen = Sent(), lab.settings(**settings)
    return SlurmWatcher(Slurm(chosen), chosen, CLUSTER, sent), sent


def test_the_first_poll_lists_every_node_with_pool_and_gpus(slurm: SlurmLab) -> None:  # noqa: F811
    watch, sent = watcher(slurm)
    watch.poll()
    records = [codec.decode(o.value, Inventory) for o in sent.outs if o.value is not None]
    assert sorted(r.name for r in records) == list(NODES)
    assert {(r.pool, r.zone, r.accelerator, r.capacity, r.source) for r in records} == {
        ("batch", "lab", "h100", 8, "slurm")}
    assert [o.topic for o in sent.outs] == ["inventory"] * len(NODES)
    assert watch.readiness()[0]


def test_peoples_drains_and_resumes_become_events_fleetpulses_do_not(slurm: SlurmLab) -> None:  # noqa: F811
    theirs, mine = slurm.node(), slurm.node()
    watch, sent = watcher(slurm)
    watch.poll()
    slurm.drain_by_person(theirs, "bad DIMM")
    assert actuator(slurm).handle(action(mine)).kind == "cordoned"  # type: ignore[union-attr]
    watch.poll()
    (drained,) = sent.events(theirs)
    assert (drained.kind, drained.actor, drained.action_id) == ("cordoned", "root", None)
    assert "bad DIMM" in drained.reason and "drained by root at 20" in drained.reason
    assert sent.events(mine) == []  # the actuator echoes its own drain
    slurm.run("scontrol", "update", f"NodeName={theirs}", "State=RESUME")
    assert actuator(slurm).handle(action(mine, "uncordon")).kind == "uncordoned"  # type: ignore[union-attr]
    watch.poll()
    assert [e.kind for e in sent.events(theirs)] == ["cordoned", "uncordoned"]
    assert sent.events(mine) == []


def test_a_killed_slurmd_is_seen_down_then_ready(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    watch, sent = watcher(slurm)
    watch.poll()
    killed = time.monotonic()
    slurm.kill_slurmd(node)

    def seen_down() -> bool:
        watch.poll()
        return any(e.kind == "not_ready" for e in sent.events(node))

    slurm.until(seen_down, 45, f"{node} seen DOWN by the watcher")
    took = time.monotonic() - killed
    (down,) = sent.events(node)
    assert "Not responding" in down.reason and down.actor == "slurm"
    slurm.run("/usr/sbin/slurmd", "-f", slurm.conf, "-N", node)

    def seen_back() -> bool:
        watch.poll()
        return sent.events(node)[-1].kind == "ready"

    slurm.until(seen_back, 30, f"{node} seen back")
    print(f"slurmd killed → DOWN seen by the watcher in {took:.1f} s (SlurmdTimeout 6 s)")


def test_a_controller_that_does_not_answer_is_never_no_nodes(slurm: SlurmLab,  # noqa: F811
                                                             tmp_path: Path) -> None:  # fmt: skip
    watch, sent = watcher(slurm)
    watch.poll()
    known = dict(watch.known or {})
    # the same cluster's slurm.conf with the controller on a port nobody listens on: sinfo
    # --json then exits 0 with `"nodes": []` and an "Unspecified error" entry (22.05)
    text = Path(slurm.conf).read_text()
    port = next(ln for ln in text.splitlines() if ln.startswith("SlurmctldPort="))
    dead = tmp_path / "slurm.conf"
    dead.write_text(text.replace(port, "SlurmctldPort=1")
                    .replace("MessageTimeout=5", "MessageTimeout=1"))  # fmt: skip
    (tmp_path / "gres.conf").write_text((Path(slurm.conf).parent / "gres.conf").read_text())
    away = Slurm(slurm.settings(conf=str(dead)))
    raw = away.run("sinfo", "--json")
    assert '"nodes": [' in raw  # the answer a naive reader takes for an empty cluster
    watch.slurm = away
    with pytest.raises(SinkError, match="reported errors"):
        watch.poll()
    assert watch.known == known and len(sent.outs) == len(NODES)  # nothing deleted, no events
    assert not watch.readiness()[0]
    watch.slurm = Slurm(slurm.settings())
    watch.poll()  # back: diffed against the last good poll, nothing changed
    assert len(sent.outs) == len(NODES) and watch.readiness()[0]
