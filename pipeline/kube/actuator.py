"""The reference Kubernetes actuator: one fleet.actions record in, the node changed, the
outcome (done, or not done and why) echoed on fleet.events.node with the action's id.

Rules it keeps (docs/actuators.md, docs/kubernetes.md):
- acts only on actions for its own cluster; a `dry_run` action is logged, never carried out or
  echoed; one past `expires_at` is skipped (echoed `skipped`, with how stale it was);
- idempotent by `action_id`: what it carried out is recorded on the node (the
  `fleetpulse.io/actions` annotation, in the same patch as the change), so a redelivered action
  changes nothing and its outcome is echoed again;
- never touches a node a person holds (their cordon, the hold annotation, the maintenance
  label): it echoes `held` instead; it releases only cordons it made (`fleetpulse.io/cordoned-by`);
- drains through the Eviction API (policy/v1) so PodDisruptionBudgets are respected; DaemonSet
  and mirror pods stay; a PDB's 429 is retried with backoff until kubernetes.drain_timeout_s,
  then the drain is echoed `blocked`;
- repair kinds become the `fleetpulse.io/repair=<kind>` label (and annotations) for a repair
  controller, echoed `repair_requested`, and only on a node FleetPulse cordoned and drained
  (nothing left but DaemonSet and mirror pods); otherwise the repair is refused;
- defends itself whatever the policy decided (pipeline/kube/defences.py): no `expires_at`, a
  `ts` too old or ahead, a key that is not the target's, a target that does not exist or whose
  labels disagree, a slice that selects a non-TPU node, a removal over the actuator's caps:
  each refused, echoed `refused` with the reason and counted;
- people win: before every patch attempt (409 retries included) and between eviction rounds
  it asks again whether a person holds the node; a condition is set with the node's
  resourceVersion, so FleetPulseUnhealthy never lands on a node a person took meanwhile;
- an action the API server refuses for good (400/422: a name it cannot take) raises
  `ApiRefusedError`; the Kafka side dead-letters it after kubernetes.api_rejections tries.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.actuate.base import ActuatorStats as _SharedStats
from pipeline.actuate.base import BaseActuator, RefusedError, Result
from pipeline.config import KubernetesSettings
from pipeline.errors import SinkError
from pipeline.kube import defences, nodes
from pipeline.kube.client import UNREACHABLE
from pipeline.kube.defences import REMOVALS, REPAIR_KINDS, Refusal
from pipeline.kube.release import release, uncordoned_by_person
from pipeline.model import Action
from pipeline.retry import Backoff

log = logging.getLogger(__name__)

__all__ = ["REPAIR_KINDS", "Actuator", "ActuatorStats", "ApiRefusedError", "Result"]
# worst first: the outcome a slice reports when its nodes differ
_PRECEDENCE = ("refused", "held", "skipped", "blocked", "repair_requested", "drained",
               "cordoned", "uncordoned")  # fmt: skip
_CONFLICT_RETRIES = 5
_MIRROR = "kubernetes.io/config.mirror"


@dataclass
class ActuatorStats(_SharedStats):
    """The shared counts (pipeline/actuate/base.py), and the Eviction API's."""

    evictions: int = 0
    eviction_refusals: int = 0  # 429s from a PodDisruptionBudget, each retry counted


class ApiRefusedError(RefusedError):
    """The API server refused a request for good (400/422): the action can never be carried
    out as written (e.g. a slice name no label selector can hold)."""


class _HeldError(Exception):
    """A person holds the node (seen before a patch or between eviction rounds)."""


class Actuator(BaseActuator[KubernetesSettings]):
    """Carries out actions against one cluster's API server (`core`: a CoreV1Api).
    `handle(action, key)` (pipeline/actuate/base.py) raises SinkError when the API server
    cannot be reached or fails, ApiRefusedError when it refuses for good."""

    section = "kubernetes"

    def __init__(
        self,
        core: Any,
        settings: KubernetesSettings,
        cluster: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] | None = None,
        stats: ActuatorStats | None = None,
    ) -> None:
        super().__init__(settings, cluster, clock=clock, sleep=sleep,
                         stats=stats or ActuatorStats())  # fmt: skip
        self.core = core

    def _on_target(self, action: Action) -> Result:
        found = self._nodes(action)
        if not found:
            return self._refuse(Refusal("not_found", f"no node for {action.target.kind} "
                                        f"{action.target.name}"))  # fmt: skip
        refusal = defences.agrees(action, found, self.settings)
        if refusal is None and action.kind in REMOVALS and any(map(self._in_service, found)):
            refusal = self.take_removal(action)
        if refusal is not None:
            return self._refuse(refusal)
        results = [self._on_node(node, action) for node in found]
        worst = min(results, key=lambda r: _PRECEDENCE.index(r.kind))
        if len(results) > 1:
            return Result(worst.kind, f"{len(results)} nodes; {worst.reason}")
        return worst

    def _in_service(self, node: Any) -> bool:
        """Neither out by FleetPulse already nor a person's: acting on it is a new removal."""
        held = nodes.held_by_person(node, self.settings.held_annotation,
                                    self.settings.maintenance_label)  # fmt: skip
        return held is None and nodes.cordoned_by_us(node) is None

    def _nodes(self, action: Action) -> list[Any]:
        if action.target.kind == "node":
            node = self._read(action.target.name)
            return [] if node is None else [node]
        selector = f"{self.settings.slice_label}={action.target.name}"
        found = self._call(self.core.list_node, label_selector=selector)
        return sorted(found.items, key=lambda node: node.metadata.name)

    def _on_node(self, node: Any, action: Action) -> Result:
        name = node.metadata.name
        done = nodes.applied(node).get(action.action_id)
        if done is not None:
            self.count("replayed")
            return Result(done, "already carried out; the replay changed nothing")
        if uncordoned_by_person(node):  # a person's uncordon the releaser has not cleared yet
            release(self.core, name, self.settings, who="a person's uncordon", uncordon=False)
            node = self._read(name)
            if node is None:
                return self._refuse(Refusal("not_found", f"node {name} does not exist"))
        released = nodes.released_at(node)
        if action.kind in REMOVALS and released is not None and action.ts < released:
            # a person took the node back after this was decided: theirs is the later word
            return Result("skipped", f"decided before a person released node {name} "
                          f"({nodes.node_annotations(node)[nodes.RELEASED]})")  # fmt: skip
        held = self._held(node)
        if action.kind == "uncordon":
            return self._uncordon(node, action, held)
        if held is not None:
            return Result("held", f"node {name} {held}: left to the person")
        try:
            if action.kind == "cordon":
                return self._cordon(node, action)
            if action.kind == "drain":
                return self._drain(node, action)
            if action.kind in REPAIR_KINDS:
                return self._request_repair(node, action)
        except _HeldError as exc:
            return Result("held", f"node {name} {exc}: left to the person")
        return Result("skipped", f"{action.kind} is not supported by this actuator")

    def _held(self, node: Any) -> str | None:
        return nodes.held_by_person(node, self.settings.held_annotation,
                                    self.settings.maintenance_label)  # fmt: skip

    # --- cordon / uncordon ----------------------------------------------------------------

    def _cordon(self, node: Any, action: Action, record: str | None = "cordoned") -> Result:
        check = nodes.label_value(action.reason.checks[0] if action.reason.checks else "")

        def change(node: Any) -> dict[str, Any]:
            taints = [t for t in _taints(node) if t["key"] != nodes.TAINT_KEY]
            taints.append({"key": nodes.TAINT_KEY, "value": check, "effect": "NoSchedule"})
            ours = nodes.cordoned_by_us(node) or action.action_id
            meta: dict[str, Any] = {nodes.CORDONED_BY: ours, nodes.CORDON_REASON: _short(action)}
            if record is not None:
                meta[nodes.ACTIONS] = nodes.with_applied(node, action.action_id, record)
            return {"spec": {"unschedulable": True, "taints": taints},
                    "metadata": {"annotations": meta}}  # fmt: skip

        # the condition first: the patch below records the action as applied, and a failure
        # between the two would make the redelivered action a replay with no condition set
        node = self._condition(node, True, action, check)
        try:
            self._patch(node, change)
        except _HeldError:
            # a person took the node between the two patches: our condition goes too
            self._condition(self._read(node.metadata.name) or node, False, action, "held")
            raise
        return Result("cordoned", f"unschedulable, tainted {nodes.TAINT_KEY}={check}:NoSchedule")

    def _uncordon(self, node: Any, action: Action, held: str | None) -> Result:
        name = node.metadata.name
        if nodes.cordoned_by_us(node) is None:
            if held is not None:
                return Result("held", f"node {name} {held}: FleetPulse releases only its own")
            return Result("skipped", f"node {name} is not cordoned by FleetPulse")
        if held is not None:  # our cordon, but a person has since marked it: leave it
            return Result("held", f"node {name} {held}: left cordoned for the person")
        def change(node: Any) -> dict[str, Any]:
            taints = [t for t in _taints(node) if t["key"] != nodes.TAINT_KEY]
            done = nodes.with_applied(node, action.action_id, "uncordoned")
            return {"spec": {"unschedulable": False, "taints": taints or None},
                    "metadata": {"annotations": {nodes.CORDONED_BY: None,
                                                 nodes.CORDON_REASON: None,
                                                 nodes.ACTIONS: done}}}  # fmt: skip

        node = self._condition(node, False, action, "released")  # first, as for a cordon
        try:
            self._patch(node, change)
        except _HeldError as exc:
            return Result("held", f"node {name} {exc}: left cordoned for the person")
        return Result("uncordoned", "schedulable again; taint and condition cleared")

    def _condition(self, node: Any, unhealthy: bool, action: Action, reason: str) -> Any:
        """Set FleetPulseUnhealthy on the node's status, guarded by its resourceVersion: a
        node changed meanwhile is read again and, for True, asked again whether a person
        holds it (never set on a held node). The node as it is after the patch."""
        from kubernetes.client.exceptions import ApiException

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        condition = {
            "type": nodes.CONDITION,
            "status": "True" if unhealthy else "False",
            "reason": "FleetPulse" + "".join(p.capitalize() for p in reason.split("_"))[:100],
            "message": f"{action.reason.summary} (action {action.action_id})"[:1024],
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        name = node.metadata.name
        for _ in range(_CONFLICT_RETRIES):
            if unhealthy:
                self._check_hold(node)
            body = {"metadata": {"resourceVersion": node.metadata.resource_version},
                    "status": {"conditions": [condition]}}  # fmt: skip
            try:
                return self.core.patch_node_status(
                    name, body, _content_type="application/strategic-merge-patch+json",
                    _request_timeout=self.settings.request_timeout_s)  # fmt: skip
            except ApiException as exc:
                if exc.status != 409:
                    raise _api_error(f"setting {nodes.CONDITION} on node {name}", exc) from None
            except UNREACHABLE as exc:
                raise SinkError(f"kubernetes API unreachable: {exc}") from None
            node = self._read(name)
            if node is None:
                raise SinkError(f"node {name} went away while its condition was set")
        raise SinkError(f"node {name}: status still conflicting after {_CONFLICT_RETRIES} tries")

    def _check_hold(self, node: Any) -> None:
        held = self._held(node)
        if held is not None:
            raise _HeldError(held)

    # --- drain ----------------------------------------------------------------------------

    def _drain(self, node: Any, action: Action) -> Result:
        name = node.metadata.name
        if nodes.cordoned_by_us(node) is None:
            self._cordon(node, action, record=None)  # a drain leaves the node cordoned
        deadline = self.clock() + self.settings.drain_timeout_s
        backoff = Backoff(self.settings.eviction_backoff_initial_s,
                          self.settings.eviction_backoff_max_s)  # fmt: skip
        while True:
            refused = [pod for pod in self._evictable(name) if not self._evict(pod)]
            if not refused:
                break
            if self.clock() >= deadline:
                pods = ", ".join(f"{p.metadata.namespace}/{p.metadata.name}" for p in refused)
                self._record(name, action, "blocked")
                return Result("blocked", f"a PodDisruptionBudget refused evicting {pods} "
                              f"for {self.settings.drain_timeout_s:g} s")  # fmt: skip
            self.sleep(min(backoff.next_delay(), max(0.0, deadline - self.clock())))
            if self.stopping.is_set():
                raise SinkError(f"stopping during the drain of node {name}: carried on later")
            stopped = self._still_ours(name)  # between rounds: has a person taken it?
            if stopped is not None:
                return stopped
        self._record(name, action, "drained")
        return Result("drained", "every pod evicted (DaemonSet and mirror pods stay)")

    def _still_ours(self, name: str) -> Result | None:
        """None while the node is still FleetPulse's to drain; else why the drain stops."""
        node = self._read(name)
        if node is None:
            return Result("skipped", f"node {name} went away during the drain")
        held = self._held(node)
        if held is not None:
            return Result("held", f"node {name} {held} during the drain: drain stopped")
        if nodes.cordoned_by_us(node) is None:  # a person uncordoned it: a full release
            if uncordoned_by_person(node):
                release(self.core, name, self.settings, who="a person's uncordon",
                        uncordon=False)  # fmt: skip
            return Result("skipped", f"node {name} was uncordoned by a person during the "
                          f"drain: drain stopped, FleetPulse's marks cleared")  # fmt: skip
        return None

    def _evictable(self, name: str) -> list[Any]:
        pods = self._call(self.core.list_pod_for_all_namespaces,
                          field_selector=f"spec.nodeName={name}").items  # fmt: skip
        return [pod for pod in pods if _evictable(pod)]

    def _evict(self, pod: Any) -> bool:
        """Ask to evict the pod: True once it is on its way out, False if a PDB said no."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(metadata=client.V1ObjectMeta(
            name=pod.metadata.name, namespace=pod.metadata.namespace))  # fmt: skip
        try:
            self.core.create_namespaced_pod_eviction(
                pod.metadata.name, pod.metadata.namespace, body,
                _request_timeout=self.settings.request_timeout_s)  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return True  # already gone
            if exc.status == 429:
                self.count("eviction_refusals")
                return False
            where = f"evicting {pod.metadata.namespace}/{pod.metadata.name}"
            raise _api_error(where, exc) from None
        except UNREACHABLE as exc:
            raise SinkError(f"kubernetes API unreachable: {exc}") from None
        self.count("evictions")
        return True

    # --- repair requests ------------------------------------------------------------------

    def _request_repair(self, node: Any, action: Action) -> Result:
        not_ready = self._undrained(node)
        if not_ready is not None:
            return self._refuse(Refusal("not_drained", not_ready))

        def change(node: Any) -> dict[str, Any]:
            annotations: dict[str, Any] = {
                nodes.REPAIR_ACTION_ID: action.action_id,
                nodes.REPAIR_REASON: _short(action),
                nodes.REPAIR_DEVICE: action.device,
                nodes.ACTIONS: nodes.with_applied(node, action.action_id, "repair_requested"),
            }
            return {"metadata": {"labels": {nodes.REPAIR_LABEL: action.kind},
                                 "annotations": annotations}}  # fmt: skip

        self._patch(node, change)
        return Result("repair_requested",
                      f"labelled {nodes.REPAIR_LABEL}={action.kind} for the repair controller")

    def _undrained(self, node: Any) -> str | None:
        """Why the node is not ready for a repair (FleetPulse's cordon and a finished drain),
        or None."""
        name = node.metadata.name
        if nodes.cordoned_by_us(node) is None:
            return (f"node {name} is not cordoned by FleetPulse: a repair comes only after "
                    f"FleetPulse's cordon and drain")  # fmt: skip
        left = self._evictable(name)
        if left:
            pods = ", ".join(f"{p.metadata.namespace}/{p.metadata.name}" for p in left[:5])
            return (f"node {name} is not drained ({len(left)} pods left: {pods}): a repair "
                    f"comes only after a finished drain")  # fmt: skip
        return None

    # --- API plumbing ---------------------------------------------------------------------

    def _record(self, name: str, action: Action, outcome: str) -> None:
        node = self._read(name)
        if node is None:
            return
        with contextlib.suppress(_HeldError):  # a person took it: not even our bookkeeping
            self._patch(node, lambda node: {"metadata": {"annotations": {
                nodes.ACTIONS: nodes.with_applied(node, action.action_id, outcome)}}})  # fmt: skip

    def _read(self, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_node(name, _request_timeout=self.settings.request_timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(f"reading node {name}", exc) from None
        except UNREACHABLE as exc:
            raise SinkError(f"kubernetes API unreachable: {exc}") from None

    def _patch(self, node: Any, change: Callable[[Any], dict[str, Any]]) -> None:
        """A merge patch guarded by the node's resourceVersion: a node changed meanwhile is a
        409, and the change is worked out again from the node as it is now. Before every
        attempt, the node is asked again whether a person holds it (_HeldError)."""
        from kubernetes.client.exceptions import ApiException

        name = node.metadata.name
        for _ in range(_CONFLICT_RETRIES):
            self._check_hold(node)
            body = change(node)
            body["metadata"] = {**body.get("metadata", {}),
                                "resourceVersion": node.metadata.resource_version}  # fmt: skip
            try:
                self.core.patch_node(name, body, _content_type="application/merge-patch+json",
                                     field_manager=nodes.FIELD_MANAGER,
                                     _request_timeout=self.settings.request_timeout_s)  # fmt: skip
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise _api_error(f"patching node {name}", exc) from None
            except UNREACHABLE as exc:
                raise SinkError(f"kubernetes API unreachable: {exc}") from None
            node = self._read(name)
            if node is None:
                return
        raise SinkError(f"patching node {name}: still conflicting after {_CONFLICT_RETRIES} tries")

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(*args, _request_timeout=self.settings.request_timeout_s, **kwargs)
        except ApiException as exc:
            raise _api_error("kubernetes API", exc) from None
        except UNREACHABLE as exc:
            raise SinkError(f"kubernetes API unreachable: {exc}") from None


def _api_error(what: str, exc: Any) -> Exception:
    """400/422: the request can never succeed as written (ApiRefusedError, dead-lettered after a
    few tries); anything else may pass later (SinkError: retried, nothing committed)."""
    if exc.status in (400, 422):
        return ApiRefusedError(f"{what}: HTTP {exc.status} {exc.reason}: {str(exc.body)[:500]}")
    return SinkError(f"{what}: HTTP {exc.status} {exc.reason}")


def _taints(node: Any) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
        for t in ((node.spec.taints or []) if node.spec is not None else [])
    ]


def _evictable(pod: Any) -> bool:
    """Not a DaemonSet's pod (it would come back at once), not a mirror (static) pod, not
    already finished or on its way out."""
    meta = pod.metadata
    if any(owner.kind == "DaemonSet" for owner in meta.owner_references or []):
        return False
    if _MIRROR in (meta.annotations or {}):
        return False
    if meta.deletion_timestamp is not None:
        return False
    return pod.status is None or pod.status.phase not in ("Succeeded", "Failed")


def _short(action: Action) -> str:
    return f"{action.reason.summary} (action {action.action_id})"[:1024]
