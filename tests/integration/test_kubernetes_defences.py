"""The actuator's own defences against a real kube-apiserver: what it refuses whatever the
record says (no expires_at, old, keyed or labelled unlike its target, a GPU pool named as a
slice, over its caps, a repair before a drain), each echoed `refused` and counted, with the
nodes left as they were."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
import pytest

from pipeline.kube.actuator import Actuator, ApiRefusedError
from pipeline.model import Target
from tests.integration.test_kubernetes_actuator import (
    CLUSTER,
    SETTINGS,
    action,
    actuator,
    slice_action,
    tpu_labels,
)
from tests.kube_fixture import PLACE, Kube


def _untouched(kube: Kube, name: str, version: str) -> None:
    node = kube.core.read_node(name)
    assert node.metadata.resource_version == version, "the node was changed"
    assert not node.spec.unschedulable


@pytest.mark.parametrize(("why", "change"), [
    ("no_expires_at", {"expires_at": None}),
    ("too_old", {"ts": 1_001_894_400_000}),  # 2001-10-01
    ("ahead", {"ts": int(time.time() * 1000) + 3_600_000}),
])  # fmt: skip
def test_an_action_that_is_not_credible_is_refused(
    kube: Kube, why: str, change: dict[str, Any]
) -> None:
    name = kube.node()
    version = kube.core.read_node(name).metadata.resource_version
    runner = actuator(kube)
    echo = runner.handle(action(name, "drain", **change))
    assert echo is not None and echo.kind == "refused", echo
    assert runner.stats.refusals == {why: 1}
    _untouched(kube, name, version)


def test_a_record_keyed_for_another_target_is_refused(kube: Kube) -> None:
    name, other = kube.node(), kube.node()
    runner = actuator(kube)
    echo = runner.handle(action(name, "cordon"), key=f"{CLUSTER}/{other}")
    assert echo is not None and echo.kind == "refused" and other in echo.reason
    assert not kube.core.read_node(name).spec.unschedulable
    assert runner.handle(action(name, "cordon"), key=f"{CLUSTER}/{name}").kind == "cordoned"  # type: ignore[union-attr]


@pytest.mark.parametrize(("pool", "zone"), [("unknown-pool", "z-a"), ("a3", "z-b")])
def test_a_target_whose_labels_disagree_is_refused(kube: Kube, pool: str, zone: str) -> None:
    name = kube.node()
    version = kube.core.read_node(name).metadata.resource_version
    target = Target(cluster=CLUSTER, kind="node", name=name, pool=pool, zone=zone)
    runner = actuator(kube)
    echo = runner.handle(action(name, "drain", target=target))
    assert echo is not None and echo.kind == "refused" and "pool a3, zone z-a" in echo.reason
    assert runner.stats.refusals == {"labels": 1}
    _untouched(kube, name, version)


def test_a_slice_named_after_a_gpu_node_pool_is_refused(kube: Kube) -> None:
    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    gpus = [kube.node(labels={**PLACE, SETTINGS.slice_label: pool,
                              "nvidia.com/gpu.product": "H100"}, gpus=8) for _ in range(3)]  # fmt: skip
    runner = actuator(kube)
    echo = runner.handle(slice_action(pool, "drain"))
    assert echo is not None and echo.kind == "refused" and "GPU node" in echo.reason
    assert not any(kube.core.read_node(n).spec.unschedulable for n in gpus)
    assert runner.stats.refusals == {"gpu_slice": 1} and runner.stats.removals == 0


def test_a_slice_with_a_node_that_is_not_tpu_is_refused(kube: Kube) -> None:
    name = f"tpu-{uuid.uuid4().hex[:6]}"
    kube.node(labels=tpu_labels(name))
    plain = kube.node(labels={SETTINGS.slice_label: name, "topology.kubernetes.io/zone": "z-a"})
    echo = actuator(kube).handle(slice_action(name, "cordon"))
    assert echo is not None and echo.kind == "refused" and plain in echo.reason
    assert not kube.core.read_node(plain).spec.unschedulable


def test_removals_are_capped_per_pool_and_a_removed_target_counts_once(kube: Kube) -> None:
    settings = msgspec.structs.replace(SETTINGS, max_removals_per_pool=2)
    runner = Actuator(kube.core, settings, CLUSTER)
    names = [kube.node() for _ in range(3)]
    kinds = [runner.handle(action(n, "cordon")).kind for n in names]  # type: ignore[union-attr]
    assert kinds == ["cordoned", "cordoned", "refused"]
    # the first node is out already: its drain is no new removal
    assert runner.handle(action(names[0], "drain")).kind == "drained"  # type: ignore[union-attr]
    assert runner.stats.removals == 2 and runner.stats.refusals == {"cap": 1}
    assert not kube.core.read_node(names[2]).spec.unschedulable


def test_a_repair_needs_our_cordon_and_a_finished_drain(kube: Kube) -> None:
    runner = actuator(kube)
    never = kube.node()
    echo = runner.handle(action(never, "reboot"))
    assert echo is not None and echo.kind == "refused" and "not cordoned" in echo.reason
    name, app = kube.node(), f"db-{uuid.uuid4().hex[:6]}"
    kube.pod(name, labels={"app": app})
    kube.pod(name, owner="DaemonSet")
    budget = kube.pdb({"app": app}, allowed=0)
    assert runner.handle(action(name, "drain")).kind == "blocked"  # type: ignore[union-attr]
    echo = runner.handle(action(name, "reboot"))
    assert echo is not None and echo.kind == "refused" and "not drained (1 pods" in echo.reason
    assert "fleetpulse.io/repair" not in (kube.core.read_node(name).metadata.labels or {})
    kube.pdb_allows(budget, 1)
    assert runner.handle(action(name, "drain")).kind == "drained"  # type: ignore[union-attr]
    echo = runner.handle(action(name, "reboot"))  # the DaemonSet pod stays: drained all the same
    assert echo is not None and echo.kind == "repair_requested", echo
    assert runner.stats.refusals == {"not_drained": 2}


def test_a_name_the_api_server_refuses_raises_for_the_dead_letter(kube: Kube) -> None:
    with pytest.raises(ApiRefusedError, match="HTTP 400"):
        actuator(kube).handle(slice_action("a:b", "cordon"))
