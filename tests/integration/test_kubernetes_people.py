"""People win, against a real kube-apiserver: a person's uncordon is a full release, a hold
that lands while the actuator works (before a retried patch, between eviction rounds) stops
it, FleetPulseUnhealthy never lands on a held node, and `fleetpulse node release` takes a node
back on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

from pipeline.kube import nodes
from pipeline.kube.actuator import Actuator
from pipeline.kube.release import Releaser
from tests.integration.test_kubernetes_actuator import CLUSTER, SETTINGS, action, actuator
from tests.kube_fixture import Kube

HOLD = {"metadata": {"annotations": {SETTINGS.held_annotation: "oncall: mine"}}}
UNCORDON = {"spec": {"unschedulable": False}}  # what `kubectl uncordon` sends
CORDON = {"spec": {"unschedulable": True}}


def _patch(kube: Kube, name: str, body: dict[str, Any]) -> None:
    kube.core.patch_node(name, body, _content_type="application/merge-patch+json")


def _condition(kube: Kube, name: str) -> str | None:
    node = kube.core.read_node(name)
    found = {c.type: c.status for c in node.status.conditions or []}
    return found.get(nodes.CONDITION)


def _marks(kube: Kube, name: str) -> dict[str, Any]:
    node = kube.core.read_node(name)
    return {
        "unschedulable": bool(node.spec.unschedulable),
        "taint": any(t.key == nodes.TAINT_KEY for t in node.spec.taints or []),
        "condition": _condition(kube, name),
        "repair": (node.metadata.labels or {}).get(nodes.REPAIR_LABEL),
        "cordoned_by": (node.metadata.annotations or {}).get(nodes.CORDONED_BY),
    }


RELEASED = {"unschedulable": False, "taint": False, "condition": "False", "repair": None,
            "cordoned_by": None}  # fmt: skip


class _PersonFirst:
    """The real client; a person's change lands just before the first call of `method`."""

    def __init__(self, kube: Kube, method: str, name: str, body: dict[str, Any]) -> None:
        self._kube, self._method, self._name, self._body = kube, method, name, body
        self.landed = False

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self._kube.core, attr)
        if attr != self._method:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.landed:
                self.landed = True
                _patch(self._kube, self._name, self._body)
            return real(*args, **kwargs)

        return call


def test_a_persons_uncordon_is_a_full_release(kube: Kube) -> None:
    name = kube.node()
    kube.pod(name)
    runner = actuator(kube)
    for kind in ("cordon", "drain", "reboot"):
        runner.handle(action(name, kind))
    assert _marks(kube, name)["repair"] == "reboot"
    decided_before = action(name, "cordon")
    _patch(kube, name, UNCORDON)
    releaser = Releaser(kube.core, SETTINGS)
    releaser.sweep()
    assert _marks(kube, name) == RELEASED
    assert releaser.stats.releases >= 1
    # what was decided before the person took the node back is not carried out
    late = runner.handle(decided_before)
    assert late is not None and late.kind == "skipped" and "before a person" in late.reason
    assert not kube.core.read_node(name).spec.unschedulable
    # a person's later cordon is theirs: FleetPulse's uncordon leaves it
    _patch(kube, name, CORDON)
    echo = runner.handle(action(name, "uncordon"))
    assert echo is not None and echo.kind == "held", echo
    assert kube.core.read_node(name).spec.unschedulable is True


def test_a_persons_cordon_after_their_uncordon_is_theirs_with_no_releaser(kube: Kube) -> None:
    name = kube.node()
    runner = actuator(kube)
    runner.handle(action(name, "cordon"))
    _patch(kube, name, UNCORDON)  # no releaser ran: our annotation is still there ...
    _patch(kube, name, CORDON)
    node = kube.core.read_node(name)
    assert nodes.CORDONED_BY in node.metadata.annotations
    assert nodes.cordoned_by_us(node) is None  # ... but the API server says who cordoned it
    echo = runner.handle(action(name, "uncordon"))
    assert echo is not None and echo.kind == "held", echo
    assert kube.core.read_node(name).spec.unschedulable is True


def test_a_hold_before_a_retried_patch_stops_the_cordon(kube: Kube) -> None:
    name = kube.node()
    core = _PersonFirst(kube, "patch_node", name, HOLD)  # the patch then conflicts (409)
    echo = Actuator(core, SETTINGS, CLUSTER).handle(action(name, "cordon"))
    assert core.landed
    assert echo is not None and echo.kind == "held", echo
    assert not kube.core.read_node(name).spec.unschedulable
    assert _condition(kube, name) != "True"  # set before the cordon, taken back


def test_the_condition_never_lands_on_a_node_held_meanwhile(kube: Kube) -> None:
    name = kube.node()
    core = _PersonFirst(kube, "patch_node_status", name, HOLD)
    echo = Actuator(core, SETTINGS, CLUSTER).handle(action(name, "cordon"))
    assert echo is not None and echo.kind == "held", echo
    assert _condition(kube, name) is None  # never set at all


def _drain_with_person(kube: Kube, body: dict[str, Any]) -> tuple[str, Any, float]:
    """A drain a PodDisruptionBudget blocks; the person's change lands at the first backoff."""
    name, app = kube.node(), f"db-{uuid.uuid4().hex[:6]}"
    kube.pod(name, labels={"app": app})
    kube.pdb({"app": app}, allowed=0)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        if not slept:
            _patch(kube, name, body)
        slept.append(seconds)

    runner = Actuator(kube.core, SETTINGS, CLUSTER, sleep=sleep)
    echo = runner.handle(action(name, "drain"))
    return name, echo, sum(slept)


def test_a_hold_between_eviction_rounds_stops_the_drain(kube: Kube) -> None:
    _, echo, slept = _drain_with_person(kube, HOLD)
    assert echo is not None and echo.kind == "held" and "during the drain" in echo.reason
    assert slept < SETTINGS.drain_timeout_s  # stopped at once, not at the drain timeout


def test_a_persons_uncordon_during_a_drain_stops_it_and_releases(kube: Kube) -> None:
    name, echo, _ = _drain_with_person(kube, UNCORDON)
    assert echo is not None and echo.kind == "skipped" and "uncordoned by a person" in echo.reason
    assert _marks(kube, name) == RELEASED


def test_node_release_command_takes_a_node_back(kube: Kube) -> None:
    name = kube.node()
    runner = actuator(kube)
    runner.handle(action(name, "cordon"))
    env = {**os.environ, "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER}
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "node", "release", name,
                           "--kubeconfig", kube.kubeconfig, "--no-echo"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _marks(kube, name) == RELEASED
    # a person's own cordon is not FleetPulse's to release
    theirs = kube.node(unschedulable=True)
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "node", "release", theirs,
                           "--kubeconfig", kube.kubeconfig, "--no-echo"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert kube.core.read_node(theirs).spec.unschedulable is True
    missing = subprocess.run([sys.executable, "-m", "pipeline.cli", "node", "release", "nope-x",
                              "--kubeconfig", kube.kubeconfig, "--no-echo"],
                             env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert missing.returncode == 2 and "no such node" in missing.stderr
