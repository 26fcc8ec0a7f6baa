"""The Slurm actuator against a real slurmctld and slurmd (deploy/slurm/slurm.sh) with real
jobs (`sbatch --wrap 'sleep …'`): what each action does to the node, and the outcome it echoes
for fleet.events.node."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipeline.model import Action, Reason, Target
from pipeline.slurm.actuator import SlurmActuator
from pipeline.slurm.commands import Slurm, SlurmRefusedError
from tests.slurm_fixture import CLUSTER, POOL, ZONE, SlurmLab, slurm, slurm_conf  # noqa: F401


def action(node: str, kind: str = "cordon", **extra: Any) -> Action:
    now = int(time.time() * 1000)
    fields: dict[str, Any] = {
        "action_id": f"act-{uuid.uuid4().hex[:16]}",
        "ts": now,
        "kind": kind,
        "target": Target(cluster=CLUSTER, kind="node", name=node, pool=POOL, zone=ZONE),
        "reason": Reason(checks=["xid.79"], finding_ids=[], summary="GPU fell off the bus"),
        "dry_run": False,
        "proposal_id": f"prp-{uuid.uuid4().hex[:16]}",
        "expires_at": now + 900_000,
    }
    return Action(**(fields | extra))


def actuator(lab: SlurmLab, **settings: Any) -> SlurmActuator:
    chosen = lab.settings(**settings)
    return SlurmActuator(Slurm(chosen), chosen, CLUSTER)


def test_a_cordon_lets_the_running_job_finish(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    job = slurm.job(node, 3)
    act = action(node)
    echo = actuator(slurm).handle(act)
    assert echo is not None and echo.kind == "cordoned" and echo.action_id == act.action_id
    now = slurm.state(node)
    assert now.drain and now.busy  # DRAINING: the job still runs
    assert now.reason == f"fleetpulse: xid.79 {act.action_id}"
    assert job in slurm.run("squeue", "-h", "-o", "%i")
    late = slurm.submit(node, "true")
    slurm.until(lambda: not slurm.state(node).busy, 15, "the job finished")
    assert slurm.state(node).drain  # DRAINED, not resumed
    pending = slurm.run("squeue", "-h", "-j", late, "-o", "%T")
    assert pending.strip() == "PENDING"  # no new job on a cordoned node
    again = actuator(slurm).handle(act)  # redelivered: nothing changes twice
    assert again is not None and again.kind == "cordoned" and "replay" in again.reason


def test_a_drain_waits_for_the_job_to_end(slurm: SlurmLab, tmp_path: Path) -> None:  # noqa: F811
    node, marker = slurm.node(), tmp_path / "done"
    slurm.job(node, 2, marker)
    started = time.monotonic()
    echo = actuator(slurm).handle(action(node, "drain"))
    took = time.monotonic() - started
    assert echo is not None and echo.kind == "drained", echo
    assert marker.read_text().strip() == "done"  # the job ran to its end, not killed
    assert took >= 1.0, f"drained after {took:.1f} s: it did not wait for the job"
    now = slurm.state(node)
    assert now.drain and not now.busy


def test_a_drain_past_its_timeout_is_blocked_naming_the_job(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    job = slurm.job(node, 30)
    echo = actuator(slurm, drain_timeout_s=1.0).handle(action(node, "drain"))
    assert echo is not None and echo.kind == "blocked", echo
    assert job in echo.reason and "slurm.drain_timeout_s" in echo.reason
    assert slurm.state(node).drain  # left drained: no new jobs


def test_a_persons_drain_is_never_resumed_nor_taken_over(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    slurm.drain_by_person(node, "bad DIMM, ticket 4711")
    act = actuator(slurm)
    for kind in ("uncordon", "cordon", "drain", "reboot"):
        echo = act.handle(action(node, kind))
        assert echo is not None and echo.kind == "held", (kind, echo)
        assert "bad DIMM" in echo.reason
    now = slurm.state(node)
    assert now.drain and now.reason == "bad DIMM, ticket 4711" and not now.reboot_pending


def test_a_maintenance_reservation_holds_the_node(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    name = slurm.maintenance(node)
    echo = actuator(slurm).handle(action(node, "cordon"))
    assert echo is not None and echo.kind == "held" and name in echo.reason
    assert not slurm.state(node).drain


def test_uncordon_resumes_only_fleetpulses_own_drain(slurm: SlurmLab) -> None:  # noqa: F811
    node, idle = slurm.node(), slurm.node()
    act = actuator(slurm)
    assert act.handle(action(node, "cordon")).kind == "cordoned"  # type: ignore[union-attr]
    echo = act.handle(action(node, "uncordon"))
    assert echo is not None and echo.kind == "uncordoned"
    slurm.until(lambda: not slurm.state(node).drain, 5, "resumed")
    echo = act.handle(action(idle, "uncordon"))
    assert echo is not None and echo.kind == "skipped" and "not drained by FleetPulse" in echo.reason


def test_a_reboot_request_reboots_once_and_resumes(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    booted = slurm.state(node).boot_time
    act = action(node, "reboot")
    echo = actuator(slurm).handle(act)
    assert echo is not None and echo.kind == "repair_requested", echo
    assert slurm.state(node).reboot_pending
    took = slurm.until(lambda: slurm.state(node).boot_time > booted
                       and slurm.state(node).state == "idle"
                       and not slurm.state(node).flags, 30, "rebooted and resumed")  # fmt: skip
    again = actuator(slurm).handle(act)  # the reason is gone: the comment remembers
    assert again is not None and again.kind == "repair_requested" and "replay" in again.reason
    assert not slurm.state(node).reboot_pending
    print(f"reboot ASAP → idle again in {took:.1f} s")


def test_dry_run_expired_wrong_pool_and_the_cap_change_nothing(slurm: SlurmLab) -> None:  # noqa: F811
    first, second = slurm.node(), slurm.node()
    act = actuator(slurm, max_removals=1)
    assert act.handle(action(first, dry_run=True)) is None
    past = act.handle(action(first, expires_at=int(time.time() * 1000) - 5000))
    assert past is not None and past.kind == "skipped" and "expired" in past.reason
    other = Target(cluster=CLUSTER, kind="node", name=first, pool="debug", zone=ZONE)
    wrong = act.handle(action(first, target=other))
    assert wrong is not None and wrong.kind == "refused" and "partitions batch" in wrong.reason
    assert not slurm.state(first).drain
    assert act.handle(action(first)).kind == "cordoned"  # type: ignore[union-attr]
    capped = act.handle(action(second))
    assert capped is not None and capped.kind == "refused" and "slurm.max_removals" in capped.reason
    assert not slurm.state(second).drain
    assert act.stats.refusals == {"labels": 1, "cap": 1}


def test_a_node_slurm_does_not_know_is_refused(slurm: SlurmLab) -> None:  # noqa: F811
    echo = actuator(slurm).handle(action("gpu-99"))
    assert echo is not None and echo.kind == "refused" and "no node gpu-99" in echo.reason
    with pytest.raises(SlurmRefusedError, match="Invalid node name"):
        Slurm(slurm.settings()).update("gpu-99", State="DRAIN", Reason="x")


def test_a_person_who_resumes_during_the_drain_wins(slurm: SlurmLab) -> None:  # noqa: F811
    node = slurm.node()
    slurm.job(node, 30)
    act = actuator(slurm, drain_timeout_s=20.0)
    resumed: list[bool] = []

    def person_resumes(seconds: float) -> None:
        if not resumed:  # the first wait of the drain: a person resumes the node
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
            resumed.append(True)
        time.sleep(seconds)

    act.sleep = person_resumes
    echo = act.handle(action(node, "drain"))
    assert echo is not None and echo.kind == "skipped" and "resumed by a person" in echo.reason
    assert not slurm.state(node).drain
