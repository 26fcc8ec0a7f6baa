"""The node watcher: Kubernetes nodes → fleet.events.node and fleet.inventory.

List, then watch from the list's resourceVersion; when the server says 410 Gone (the version
is too old to resume from), list again and diff against what was known, so nothing that
happened meanwhile is missed. Every node present becomes an inventory/1 record (pool, zone,
accelerator, GPU/TPU capacity); a node that leaves gets tombstones on fleet.inventory and
fleet.node-state and a `deleted` node event. Changes people (or the cloud, or a repair
controller) make become node events: cordon/uncordon, the hold annotation, the maintenance
label, the Ready condition, a finished repair. FleetPulse's own cordons are left to the
actuator's echo.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.actuate.kafka import Out
from pipeline.config import KubernetesSettings
from pipeline.errors import SinkError
from pipeline.kube import nodes
from pipeline.kube.client import UNREACHABLE
from pipeline.model import Event, NodeEvent
from pipeline.retry import Backoff
from pipeline.wire.codec import encode
from pipeline.wire.topics import scoped

__all__ = ["NodeWatcher", "Out", "WatcherStats"]
log = logging.getLogger(__name__)
# waits between tries while the API server is away: 1 s, doubling, at most 30 s
_RETRY_INITIAL_S, _RETRY_MAX_S = 1.0, 30.0


@dataclass
class WatcherStats:
    lists: int = 0
    relists: int = 0  # after 410 Gone
    watch_events: int = 0
    node_events: int = 0
    inventory_records: int = 0
    tombstones: int = 0
    nodes: int = 0
    api_errors: int = 0  # lists and watches that failed (API server away, 5xx): waited, retried


class NodeWatcher:
    """Turns node objects into records; `emit` sends a batch and returns once acknowledged
    (raising SinkError when it was not)."""

    def __init__(
        self,
        core: Any,
        settings: KubernetesSettings,
        cluster: str,
        emit: Callable[[list[Out]], None],
        *,
        clock: Callable[[], float] = time.time,
        stats: WatcherStats | None = None,
    ) -> None:
        self.core, self.settings, self.cluster, self.emit = core, settings, cluster, emit
        self.clock = clock
        self.stats = stats or WatcherStats()
        self.known: dict[str, Any] = {}  # node name -> last version seen
        self.resource_version: str | None = None

    # --- pure-ish: node versions to records -------------------------------------------------

    def _now(self) -> int:
        return int(self.clock() * 1000)

    def _event(self, node: Any, kind: str, action_id: str | None, reason: str) -> Out:
        where = nodes.place(node, self.settings.pool_label)
        event = NodeEvent(
            ts=self._now(),
            cluster=self.cluster,
            target_kind="node",
            target=node.metadata.name,
            pool=where.pool,
            zone=where.zone,
            kind=kind,  # type: ignore[arg-type]  # NodeEventKind by construction
            actor="kubernetes" if action_id is None else "repair-controller",
            action_id=action_id,
            reason=reason,
        )
        self.stats.node_events += 1
        return self._out("events.node", event)

    def _out(self, topic: str, event: Event) -> Out:
        name = event.target if isinstance(event, NodeEvent) else getattr(event, "name", "")
        return Out(topic, scoped(self.cluster, name), encode(event))

    def _inventory(self, node: Any) -> Out:
        self.stats.inventory_records += 1
        return self._out("inventory", nodes.inventory(node, self.cluster, self._now(),
                                                      self.settings.pool_label))  # fmt: skip

    def _gone(self, node: Any) -> list[Out]:
        key = scoped(self.cluster, node.metadata.name)
        self.stats.tombstones += 2
        return [
            self._event(node, "deleted", None, "node object deleted"),
            Out("inventory", key, None),
            Out("node-state", key, None),
        ]

    def on_change(self, old: Any | None, new: Any) -> list[Out]:
        """Records for one node's new version (old None: a node not seen before)."""
        found = nodes.changes(
            old, new, self.settings.held_annotation, self.settings.maintenance_label
        )
        outs = [self._event(new, kind, action_id, reason) for kind, action_id, reason in found]
        if old is None or nodes.inventory(old, self.cluster, 0, self.settings.pool_label) != \
                nodes.inventory(new, self.cluster, 0, self.settings.pool_label):  # fmt: skip
            outs.append(self._inventory(new))
        return outs

    # --- list and watch ---------------------------------------------------------------------

    def relist(self, *, first: bool) -> None:
        """List every node; the first list only takes stock (inventory for all), a re-list
        diffs against what was known (created, deleted, changed meanwhile)."""
        listed = self._call(self.core.list_node)
        self.resource_version = listed.metadata.resource_version
        current = {node.metadata.name: node for node in listed.items}
        outs: list[Out] = []
        if first:
            outs = [self._inventory(node) for node in current.values()]
            self.stats.lists += 1
        else:
            for name, node in current.items():
                outs += self.on_change(self.known.get(name), node)
            for name, node in self.known.items():
                if name not in current:
                    outs += self._gone(node)
            self.stats.relists += 1
        self.emit(outs)
        self.known = current
        self.stats.nodes = len(current)

    def apply(self, kind: str, node: Any) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) → records, sent before moving on."""
        name = node.metadata.name
        self.stats.watch_events += 1
        if kind == "DELETED":
            outs = self._gone(self.known.pop(name, node))
        elif kind in ("ADDED", "MODIFIED"):
            outs = self.on_change(self.known.get(name), node)
            self.known[name] = node
        else:
            return
        if outs:
            self.emit(outs)
        self.stats.nodes = len(self.known)

    def run(self, stop: threading.Event) -> None:
        """List, then watch until `stop`; re-list on 410 Gone. Returns as soon as `stop` is
        set: a watch blocks in a socket read for up to watch_timeout_s (5 min), so it runs in
        a daemon thread that is left behind (nothing is lost: a new watcher lists again)."""
        # the HTTP client retries a refused connection three times at once, each with a
        # warning: while the API server is away the watcher's own line per try says enough
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        failed: list[BaseException] = []
        done = threading.Event()

        def loop() -> None:
            try:
                self._run(stop)
            except BaseException as exc:  # handed to the caller's thread
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=loop, name="node-watch", daemon=True).start()
        while not done.is_set() and not stop.wait(0.2):
            pass
        if failed:
            raise failed[0]

    def _run(self, stop: threading.Event) -> None:
        """List and watch; while the API server is away (or Kafka refuses the records) say so
        in one line, wait and list again, diffing against what was known."""
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S)
        first = True
        while not stop.is_set():
            try:
                self.relist(first=first)
                first = False
                backoff.reset()
                self._watch(stop)
            except SinkError as exc:
                self.stats.api_errors += 1
                delay = backoff.next_delay()
                log.warning("%s; trying again in %.0f s", exc, delay)
                stop.wait(delay)

    def _watch(self, stop: threading.Event) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        log.info("watching nodes from resourceVersion %s", self.resource_version)
        while not stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.core.list_node,
                    resource_version=self.resource_version,
                    timeout_seconds=self.settings.watch_timeout_s,
                    allow_watch_bookmarks=True,
                ):
                    if event["type"] != "BOOKMARK":
                        self.apply(event["type"], event["object"])
                    self.resource_version = stream.resource_version or self.resource_version
                    if stop.is_set():
                        stream.stop()
            except ApiException as exc:
                if exc.status != 410:
                    raise SinkError(f"watching nodes: HTTP {exc.status} {exc.reason}") from None
                log.info("watch: resourceVersion %s is gone, listing again", self.resource_version)
                self.relist(first=False)
            except UNREACHABLE as exc:
                raise SinkError(f"watching nodes: API server unreachable: {_why(exc)}") from None

    def _call(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(_request_timeout=self.settings.request_timeout_s, **kwargs)
        except ApiException as exc:
            raise SinkError(f"listing nodes: HTTP {exc.status} {exc.reason}") from None
        except UNREACHABLE as exc:
            raise SinkError(f"listing nodes: API server unreachable: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    """The root of a client error, in one line (urllib3 wraps the refused connection)."""
    reason = getattr(exc, "reason", None)
    return str(reason if isinstance(reason, BaseException) else exc).splitlines()[0]
