"""People win: a person's uncordon is a full release of the node from FleetPulse.

`kubectl uncordon` changes only spec.unschedulable; FleetPulse's other marks (the NoSchedule
taint, which still keeps pods off, the FleetPulseUnhealthy condition, the repair label and its
annotations, the cordoned-by annotation) would stay, and a person's later cordon would read as
FleetPulse's. `release` clears them all in one patch guarded by the node's resourceVersion and
notes who released it (`fleetpulse.io/released`, so the watcher does not take the removed
repair label for a finished repair). `Releaser` runs beside the actuator: it lists and watches
the nodes and releases every node a person uncordoned while FleetPulse's cordon marks were on
it. `fleetpulse node release NODE` calls `release` on purpose (and uncordons a FleetPulse
cordon too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.config import KubernetesSettings
from pipeline.errors import SinkError
from pipeline.kube import nodes
from pipeline.kube.client import UNREACHABLE

log = logging.getLogger(__name__)
_CONFLICT_RETRIES = 5
_REPAIR_ANNOTATIONS = (nodes.REPAIR_ACTION_ID, nodes.REPAIR_REASON, nodes.REPAIR_DEVICE)


@dataclass
class ReleaseStats:
    releases: int = 0  # nodes a person uncordoned, released of FleetPulse's marks
    watch_restarts: int = 0


def has_cordon_marks(node: Any) -> bool:
    """FleetPulse's cordon marks: the cordoned-by annotation or its taint."""
    taints = (node.spec.taints or []) if node.spec is not None else []
    return nodes.CORDONED_BY in nodes.node_annotations(node) or any(
        t.key == nodes.TAINT_KEY for t in taints
    )


def uncordoned_by_person(node: Any) -> bool:
    """Schedulable while FleetPulse's cordon marks are on it: only a person does that (our own
    uncordon removes the marks in the same patch as spec.unschedulable)."""
    return not nodes.cordoned(node) and has_cordon_marks(node)


def release(core: Any, name: str, settings: KubernetesSettings, *, who: str,
            uncordon: bool, clock: Callable[[], float] = time.time) -> bool:  # fmt: skip
    """Clear FleetPulse's marks on node `name` (and, with `uncordon`, FleetPulse's own cordon;
    never a person's). False when the node does not exist."""
    from kubernetes.client.exceptions import ApiException

    for _ in range(_CONFLICT_RETRIES):
        node = _read(core, name, settings)
        if node is None:
            return False
        _condition_false(core, node, settings, who, clock)
        try:
            core.patch_node(name, _release_patch(node, who, uncordon, clock),
                            _content_type="application/merge-patch+json",
                            field_manager=nodes.FIELD_MANAGER,
                            _request_timeout=settings.request_timeout_s)  # fmt: skip
            return True
        except ApiException as exc:
            if exc.status != 409:
                raise SinkError(f"releasing node {name}: HTTP {exc.status} {exc.reason}") from None
        except UNREACHABLE as exc:
            raise SinkError(f"kubernetes API unreachable: {exc}") from None
    raise SinkError(f"releasing node {name}: still conflicting after {_CONFLICT_RETRIES} tries")


def _release_patch(node: Any, who: str, uncordon: bool,
                   clock: Callable[[], float]) -> dict[str, Any]:  # fmt: skip
    taints = [t for t in _taints(node) if t["key"] != nodes.TAINT_KEY]
    annotations: dict[str, Any] = dict.fromkeys(
        (nodes.CORDONED_BY, nodes.CORDON_REASON, *_REPAIR_ANNOTATIONS))
    now = clock()
    annotations[nodes.RELEASED] = f"{_iso(now)[:-1]}.{int(now * 1000) % 1000:03d}Z by {who}"[:256]
    spec: dict[str, Any] = {"taints": taints or None}
    ours = nodes.cordoned_by_us(node) is not None
    if uncordon and ours:
        spec["unschedulable"] = False
    return {"spec": spec,
            "metadata": {"labels": {nodes.REPAIR_LABEL: None}, "annotations": annotations,
                         "resourceVersion": node.metadata.resource_version}}  # fmt: skip


def _condition_false(core: Any, node: Any, settings: KubernetesSettings, who: str,
                     clock: Callable[[], float]) -> None:  # fmt: skip
    conditions = (node.status.conditions or []) if node.status is not None else []
    if not any(c.type == nodes.CONDITION and c.status == "True" for c in conditions):
        return
    now = _iso(clock())
    condition = {"type": nodes.CONDITION, "status": "False", "reason": "FleetPulseReleased",
                 "message": f"released by {who}"[:1024], "lastHeartbeatTime": now,
                 "lastTransitionTime": now}  # fmt: skip
    _call(core.patch_node_status, settings, node.metadata.name,
          {"status": {"conditions": [condition]}},
          _content_type="application/strategic-merge-patch+json")  # fmt: skip


class Releaser:
    """Beside the actuator: list, then watch the nodes; a node a person uncordoned is released
    (`release`) as soon as it is seen. Re-lists when the watch ends or its version is gone."""

    def __init__(self, core: Any, settings: KubernetesSettings, *,
                 stats: ReleaseStats | None = None) -> None:  # fmt: skip
        self.core, self.settings = core, settings
        self.stats = stats or ReleaseStats()

    def sweep(self) -> str:
        """Release every node that needs it now; the list's resourceVersion."""
        listed = _call(self.core.list_node, self.settings)
        for node in listed.items:
            self.consider(node)
        return str(listed.metadata.resource_version)

    def consider(self, node: Any) -> None:
        if uncordoned_by_person(node):
            name = node.metadata.name
            if release(self.core, name, self.settings, who="a person's uncordon",
                       uncordon=False):  # fmt: skip
                self.stats.releases += 1
                log.info("node %s uncordoned by a person: FleetPulse's marks cleared", name)

    def run(self, stop: threading.Event) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not stop.is_set():
            try:
                version = self.sweep()
                stream, wait = watch.Watch(), self.settings.watch_timeout_s
                for event in stream.stream(self.core.list_node, resource_version=version,
                                           timeout_seconds=wait):  # fmt: skip
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.consider(event["object"])
                    if stop.is_set():
                        stream.stop()
            except (SinkError, ApiException, *UNREACHABLE) as exc:
                log.warning("releaser: %s; listing again", exc)
                stop.wait(min(5.0, self.settings.eviction_backoff_max_s))
            self.stats.watch_restarts += 1


def _read(core: Any, name: str, settings: KubernetesSettings) -> Any | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_node(name, _request_timeout=settings.request_timeout_s)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise SinkError(f"reading node {name}: HTTP {exc.status} {exc.reason}") from None
    except UNREACHABLE as exc:
        raise SinkError(f"kubernetes API unreachable: {exc}") from None


def _call(method: Callable[..., Any], settings: KubernetesSettings, *args: Any,
          **kwargs: Any) -> Any:  # fmt: skip
    from kubernetes.client.exceptions import ApiException

    try:
        return method(*args, _request_timeout=settings.request_timeout_s, **kwargs)
    except ApiException as exc:
        raise SinkError(f"kubernetes API: HTTP {exc.status} {exc.reason}") from None
    except UNREACHABLE as exc:
        raise SinkError(f"kubernetes API unreachable: {exc}") from None


def _taints(node: Any) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
        for t in ((node.spec.taints or []) if node.spec is not None else [])
    ]


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
