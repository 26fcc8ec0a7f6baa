"""What FleetPulse reads from Slurm, pure: `sinfo --json` (as Debian's 22.05 writes it), the
drain states, FleetPulse's reason and comment marks, people's holds, pool/zone/GRES,
reservations, host lists, and the changes the watcher reports between two polls."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.slurm import nodes
from pipeline.slurm.commands import Slurm
from pipeline.slurm.nodes import SlurmNode, SlurmReadError, parse_sinfo
from pipeline.slurm.watcher import SlurmWatcher

P = "fleetpulse:"
SETTINGS = SlurmSettings(zone="lab")


def entry(name: str = "gpu-1", **extra: Any) -> dict[str, Any]:
    """One node as `sinfo --json` (openapi v0.0.38) lists it, trimmed to what matters."""
    return {"name": name, "state": "idle", "state_flags": [], "reason": "",
            "reason_set_by_user": None, "reason_changed_at": 0, "partitions": ["batch"],
            "features": "h100", "active_features": "h100", "gres": "gpu:h100:8",
            "boot_time": 1000, "comment": "", "extra": "", **extra}  # fmt: skip


def sinfo(*entries: dict[str, Any], errors: list[Any] | None = None) -> str:
    return json.dumps({"meta": {}, "errors": errors or [], "nodes": list(entries)})


def node(**extra: Any) -> SlurmNode:
    (found,) = parse_sinfo(sinfo(entry(**extra)))
    return found


def test_sinfo_json_is_read_into_nodes() -> None:
    got = node(state="MIXED", state_flags=["drain"], reason="fleetpulse: xid.79 act-1",
               reason_set_by_user="root", reason_changed_at=1700000000,
               active_features="h100,zone-z1,pool-a3")  # fmt: skip
    assert got.state == "mixed" and got.flags == {"DRAIN"}
    assert got.features == ("h100", "zone-z1", "pool-a3") and got.partitions == ("batch",)
    assert got.reason_by == "root" and got.reason_at == 1700000000
    assert got.drain and got.busy and not got.down


@pytest.mark.parametrize(
    ("raw", "words"),
    [("", "expected JSON"), ("Unable to contact slurm controller", "expected JSON"),
     ("[]", "expected an object"), ('{"errors": [], "meta": {}}', "expected a 'nodes' list"),
     (sinfo(entry(), errors=[{"error": "Unable to contact slurm controller"}]), "reported errors"),
     ('{"errors": [], "nodes": [{"state": "idle"}]}', "a node without a name")],
)
def test_a_bad_answer_is_an_error_never_an_empty_fleet(raw: str, words: str) -> None:
    with pytest.raises(SlurmReadError, match=words):
        parse_sinfo(raw)


@pytest.mark.parametrize(
    ("state", "flags", "busy", "down"),
    [("idle", ["DRAIN"], False, False),  # drained
     ("allocated", ["DRAIN"], True, False),  # draining
     ("mixed", ["DRAIN"], True, False),  # draining
     ("idle", ["DRAIN", "COMPLETING"], True, False),  # a job still completing
     ("down", ["DRAIN"], False, True),
     ("down", ["NOT_RESPONDING"], False, True),
     ("idle", ["NOT_RESPONDING"], False, False)],  # `idle*`: just resumed, not yet pinged
)
def test_draining_until_no_job_is_left(state: str, flags: list[str], busy: bool,
                                       down: bool) -> None:  # fmt: skip
    got = node(state=state, state_flags=flags)
    assert (got.busy, got.down) == (busy, down)


def test_fleetpulse_reason_carries_the_check_and_the_action_id() -> None:
    reason = nodes.reason_for(P, "xid.79 bus \"lost\"", "act-1")
    assert reason == 'fleetpulse: xid.79_bus_lost_ act-1'
    assert nodes.reason_for(P, "", "act-2", "reboot") == "fleetpulse: reboot unhealthy act-2"
    assert nodes.action_id_in(reason, P) == "act-1"
    assert nodes.action_id_in(reason + " : reboot issued", P) == "act-1"
    assert nodes.action_id_in("disk swap act-1", P) is None
    assert nodes.ours(node(state_flags=["DRAIN"], reason=reason), P)
    assert not nodes.ours(node(reason=reason), P)  # the reason stays after a resume


def test_the_comment_records_outcomes_but_never_replaces_a_persons() -> None:
    fresh = node()
    comment = nodes.with_applied(fresh, P, "act-1", "cordoned")
    assert comment == "fleetpulse: act-1=cordoned"
    again = nodes.with_applied(node(comment=comment), P, "act-2", "drained")
    assert nodes.applied(node(comment=again), P) == {"act-1": "cordoned", "act-2": "drained"}
    many = node(comment=comment)
    for i in range(20):
        many = node(comment=nodes.with_applied(many, P, f"a-{i}", "cordoned"))
    assert list(nodes.applied(many, P)) == [f"a-{i}" for i in range(12, 20)]
    persons = node(comment="ticket 4711")
    assert nodes.with_applied(persons, P, "act-1", "cordoned") is None
    assert nodes.applied(persons, P) == {}


def test_a_persons_drain_maintenance_and_their_reboot_hold_the_node() -> None:
    assert nodes.held(node(), P) is None
    assert nodes.held(node(state_flags=["DRAIN"], reason=f"{P} x act-1"), P) is None
    theirs = nodes.held(node(state_flags=["DRAIN"], reason="bad DIMM", reason_set_by_user="ann"), P)
    assert theirs == "is drained by ann (bad DIMM)"
    assert "maintenance" in (nodes.held(node(state_flags=["MAINTENANCE", "RESERVED"]), P) or "")
    assert "maint1" in (nodes.held(node(), P, ["maint1"]) or "")
    assert "reboot" in (nodes.held(node(state_flags=["REBOOT_REQUESTED"], reason="kernel"), P)
                        or "")  # fmt: skip


def test_pool_from_the_partition_or_a_feature_zone_from_a_feature() -> None:
    n = node(active_features="h100,zone-z1,pool-a3", partitions=["batch", "debug"])
    assert nodes.place(n, SETTINGS) == nodes.Place("batch", "z1")
    by_feature = SlurmSettings(pool_feature_prefix="pool-", zone_feature_prefix="")
    assert nodes.place(n, by_feature) == nodes.Place("a3", "unknown")
    assert nodes.place(node(partitions=[], active_features="h100"), SETTINGS) == \
        nodes.Place("unknown", "lab")  # fmt: skip


@pytest.mark.parametrize(
    ("gres", "want"),
    [("gpu:h100:8", ("h100", 8)), ("gpu:8", ("gpu", 8)), ("", ("none", 0)),
     ("gpu:h100:4(S:0),gpu:h100:4(S:1)", ("h100", 8)), ("nic:2,gpu:a100:2", ("a100", 2)),
     ("gpu:h100:x", ("none", 0))],
)
def test_the_accelerator_comes_from_gres(gres: str, want: tuple[str, int]) -> None:
    assert nodes.accelerator(node(gres=gres)) == want


def test_inventory_names_pool_zone_accelerator_and_source() -> None:
    record = nodes.inventory(node(), "hpc", 5, SETTINGS)
    assert (record.pool, record.zone, record.accelerator, record.capacity, record.source) == \
        ("batch", "lab", "h100", 8, "slurm")  # fmt: skip


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [("gpu-[1-3,7],login1", ["gpu-1", "gpu-2", "gpu-3", "gpu-7", "login1"]),
     ("n[08-10]", ["n08", "n09", "n10"]), ("a,b", ["a", "b"]), ("", []),
     ("rack[1-2]-gpu", ["rack1-gpu", "rack2-gpu"])],
)
def test_host_lists_expand(hostlist: str, names: list[str]) -> None:
    assert nodes.expand_hostlist(hostlist) == names


def test_only_active_maintenance_reservations_hold_a_node() -> None:
    text = "\n".join([
        "ReservationName=m1 StartTime=x EndTime=y Nodes=gpu-[1-2] Flags=MAINT,SPEC_NODES State=ACTIVE",
        "ReservationName=m2 Nodes=gpu-3 Flags=MAINT State=INACTIVE",
        "ReservationName=r3 Nodes=gpu-3 Flags=SPEC_NODES State=ACTIVE"])  # fmt: skip
    assert nodes.maintenance_reservations(text, "gpu-2") == ["m1"]
    assert nodes.maintenance_reservations(text, "gpu-3") == []
    assert nodes.maintenance_reservations("No reservations in the system", "gpu-1") == []


def test_jobs_are_named_for_a_blocked_drain() -> None:
    assert nodes.jobs_of("12 alice train\n13 bob\n") == ["12 (alice, train)", "13 (bob)"]


def kinds(old: SlurmNode | None, new: SlurmNode) -> list[tuple[str, str, str | None]]:
    return [(k, actor, aid) for k, actor, aid, _ in nodes.changes(old, new, P)]


def test_changes_report_peoples_drains_and_resumes_not_fleetpulses() -> None:
    idle = node()
    theirs = node(state_flags=["DRAIN"], reason="bad DIMM", reason_set_by_user="ann",
                  reason_changed_at=1700000000)  # fmt: skip
    assert kinds(idle, theirs) == [("cordoned", "ann", None)]
    (_, _, _, why), = nodes.changes(idle, theirs, P)
    assert "ann" in why and "bad DIMM" in why and "2023-11-14T22:13:20Z" in why
    assert kinds(theirs, idle) == [("uncordoned", "slurm", None)]
    mine = node(state_flags=["DRAIN"], reason=f"{P} xid.79 act-1",
                comment="fleetpulse: act-1=cordoned")  # fmt: skip
    assert kinds(idle, mine) == []  # the actuator echoes its own drain
    resumed = node(comment="fleetpulse: act-1=cordoned act-2=uncordoned")
    assert kinds(mine, resumed) == []  # and its own resume
    assert kinds(mine, node(comment=mine.comment)) == [("uncordoned", "slurm", None)]  # a person's


def test_changes_report_down_maintenance_reboots_and_new_nodes() -> None:
    idle = node()
    down = node(state="down", state_flags=["NOT_RESPONDING"], reason="Not responding")
    assert kinds(idle, down) == [("not_ready", "slurm", None)]
    assert kinds(down, idle) == [("ready", "slurm", None)]
    maintenance = node(state_flags=["MAINTENANCE", "RESERVED"])
    assert kinds(idle, maintenance) == [("held", "slurm", None)]
    assert kinds(maintenance, idle) == [("uncordoned", "slurm", None)]
    drained = node(state_flags=["DRAIN"], reason="bad DIMM")
    assert kinds(node(state_flags=["DRAIN", "MAINTENANCE"], reason="bad DIMM"), drained) == []
    rebooting = node(state="down", state_flags=["DRAIN", "REBOOT_ISSUED"],
                     reason=f"{P} reboot xid.79 act-9 : reboot issued")  # fmt: skip
    assert kinds(idle, rebooting) == []  # down on purpose, and FleetPulse's reason
    assert kinds(rebooting, node(boot_time=1001)) == [("repaired", "slurm", "act-9")]
    assert kinds(idle, node(boot_time=1002)) == []  # slurmd's boot time wanders a second or two
    assert kinds(idle, node(boot_time=2000)) == [("repaired", "slurm", None)]  # unasked
    assert kinds(None, idle) == [("created", "slurm", None)]


def test_a_failed_poll_is_never_read_as_no_drains() -> None:
    sent: list[Any] = []
    broken = Slurm(SlurmSettings(bin_dir="/nonexistent/slurm/bin"))
    watcher = SlurmWatcher(broken, SETTINGS, "hpc", sent.append)
    drained = node(state_flags=["DRAIN"], reason="bad DIMM")
    watcher.known = {"gpu-1": drained}
    with pytest.raises(SinkError, match="could not start"):
        watcher.poll()
    assert sent == [] and watcher.known == {"gpu-1": drained}
    assert watcher.stats.poll_errors == 1
    ready, why = watcher.readiness()
    assert not ready and "could not start" in why
    stop = threading.Event()
    stop.set()
    watcher.run(stop)  # returns at once when stopped


def test_a_node_that_leaves_gets_tombstones() -> None:
    watcher = SlurmWatcher(Slurm(SETTINGS), SETTINGS, "hpc", lambda outs: None)
    outs = watcher.diff({"gpu-1": node()}, {})
    assert [(o.topic, o.key, o.value is None) for o in outs] == [
        ("events.node", "hpc/gpu-1", False), ("inventory", "hpc/gpu-1", True),
        ("node-state", "hpc/gpu-1", True)]
    first = watcher.diff(None, {"gpu-1": node()})
    assert [o.topic for o in first] == ["inventory"]  # the first poll takes stock only
