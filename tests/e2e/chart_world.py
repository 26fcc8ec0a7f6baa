"""The world around the chart's processes in tests/e2e/test_chart_harness.py: the simulator's
fleet as Node objects with pods and budgets, its telemetry sent on the wall clock (a node's
faulty telemetry until it is fixed, then its healthy one, after a reboot's silence), and the
controllers a bare API server lacks, played by the test: the kubelet (an evicted pod is
gone) and the disruption controller (a budget allows a disruption again)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import Event, Inventory
from pipeline.sim import ForcedFault, Simulation
from pipeline.sim.inventory import from_fleet
from streams.testing import produce_events
from tests.kube_fixture import Kube

CLUSTER = "fp-us-central1"  # the simulator's cluster
REPAIRED_NODE, PERSONS_NODE = "h100-train-000", "h200-train-000"  # of the simulator's names
HISTORY_S = 60  # telemetry before the faults, sent at once
FAULT_S = 6  # the lost GPU is back this long after it fell off the bus
TICK_S = 2


class Running(Protocol):
    """What the world needs of the running release (test_chart_harness.Release)."""

    k8s: Kube
    namespace: str
    kafka: KafkaSettings
    procs: dict[str, subprocess.Popen[bytes]]
    nodes: list[str]

    def tails(self) -> str: ...


def fleet(suffix: str, start_ms: int, faults: bool = True) -> tuple[Simulation, dict[str, str]]:
    """The simulator's four GPU nodes with a lost GPU on two (or none), and its node names ->
    this test's (Node names are cluster-wide: a suffix keeps runs apart)."""
    sim_settings = msgspec.structs.replace(
        load_settings(environ={}).sim, gpu_nodes=4, clusters=1, tpu_slices=0, seed=5,
        duration_s=HISTORY_S + 240, random_faults=False, diurnal=False, gpu_interval_s=TICK_S,
        start_ms=start_ms)  # fmt: skip
    forced = [ForcedFault(fault_type="G1", at_s=HISTORY_S + 2, duration_s=FAULT_S,
                          target=f"{CLUSTER}-{node}", device=3)
              for node in (REPAIRED_NODE, PERSONS_NODE)]  # fmt: skip
    sim = Simulation(sim_settings, forced if faults else [])
    names = {n.name: f"{n.name}-{suffix}" for n in sim.fleet.gpu_nodes}
    return sim, names


def create_nodes(release: Running, sim: Simulation, names: dict[str, str]) -> None:
    from kubernetes import client

    k8s, now = release.k8s, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for item in from_fleet(sim.fleet, sim.start_ms):
        labels = {"cloud.google.com/gke-nodepool": item.pool, "topology.kubernetes.io/zone":
                  item.zone, "nvidia.com/gpu.product": item.accelerator or "",
                  "nvidia.com/gpu.present": "true"}  # fmt: skip
        name = names[item.name]
        release.nodes.append(name)
        k8s.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        k8s.core.patch_node_status(name, {"status": {
            "capacity": {"nvidia.com/gpu": str(item.capacity)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "harness", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}},
            _content_type="application/strategic-merge-patch+json")  # fmt: skip


def workload(k8s: Kube, namespace: str, node: str, app: str,
              allowed: int) -> tuple[list[str], str]:  # fmt: skip
    """Two pods of `app` on `node` under a budget allowing `allowed` disruptions (its name),
    and a DaemonSet's pod (it stays)."""
    pods = [k8s.pod(node, labels={"app": app}, namespace=namespace) for _ in range(2)]
    k8s.pod(node, owner="DaemonSet", namespace=namespace)
    return pods, k8s.pdb({"app": app}, allowed, namespace)


@dataclass
class World:
    """The telemetry and the controllers, advanced by `step` while a test waits (`until`)."""

    release: Running
    ticks: list[list[Event]]  # the fleet with its faults
    healthy: list[list[Event]]  # the same fleet without: a node's telemetry once it is fixed
    start_ms: int
    fault_ms: int
    budget: str  # the PodDisruptionBudget the disruption controller refills
    sent: int = 0
    live: bool = False  # telemetry flows (once the inventory is in)
    broken: set[str] = field(default_factory=set)  # nodes whose faulty telemetry is sent
    rebooting: dict[str, int] = field(default_factory=dict)  # node -> the tick it is back
    fault_at: float = 0.0  # monotonic time the fault's tick went out
    producer: Any = None

    def step(self) -> None:
        self._send_due()
        self._kubelet()
        time.sleep(0.1)

    def until(self, what: str, done: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := done()):
            for key, proc in self.release.procs.items():
                assert proc.poll() is None, f"{key} exited {proc.returncode}\n{self.release.tails()}"
            assert time.monotonic() < deadline, f"not {what} in {timeout:.0f} s\n{self.release.tails()}"
            self.step()
        return found

    def _send_due(self) -> None:
        if not self.live:
            return
        due = (time.time() * 1000 - self.start_ms) // (TICK_S * 1000) + 1
        batch: list[Event] = []
        while self.sent < min(due, len(self.ticks)):
            tick = self._tick(self.sent)
            if not self.fault_at and getattr(tick[0], "ts", 0) >= self.fault_ms:
                self.fault_at = time.monotonic()
            batch += tick
            self.sent += 1
        if batch:
            settings = msgspec.structs.replace(load_settings(environ={}), kafka=self.release.kafka)
            produce_events(settings, batch, self.producer)

    def reboot(self, node: str, ticks: int = 3) -> None:
        """The node is fixed: silent for `ticks` scrapes (a reboot), then healthy."""
        self.broken.discard(node)
        self.rebooting[node] = self.sent + ticks

    def rebooted(self, node: str) -> bool:
        return self.sent >= self.rebooting[node]

    def _tick(self, i: int) -> list[Event]:
        def node(e: Event) -> str | None:
            return getattr(e, "node", None)

        silent = {n for n, back in self.rebooting.items() if i < back}
        broken = [e for e in self.ticks[i] if node(e) in self.broken]
        return broken + [e for e in self.healthy[i]
                         if node(e) not in self.broken and node(e) not in silent]  # fmt: skip

    def _kubelet(self) -> None:
        """An evicted pod is gone at once (the kubelet), and the budget allows one disruption
        again once no pod of it is terminating (its replacement runs elsewhere)."""
        k8s, namespace = self.release.k8s, self.release.namespace
        pods = k8s.core.list_namespaced_pod(namespace).items
        leaving = [p for p in pods if p.metadata.deletion_timestamp is not None]
        for pod in leaving:
            k8s.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        pdb = k8s.policy.read_namespaced_pod_disruption_budget(self.budget, namespace)
        if not leaving and pdb.status.disruptions_allowed == 0:
            # as the disruption controller: the evicted pods are gone, one may go again
            k8s.policy.patch_namespaced_pod_disruption_budget_status(
                self.budget, namespace, {"status": {"disruptionsAllowed": 1, "disruptedPods": None}},
                _content_type="application/merge-patch+json")  # fmt: skip


def ticks(sim: Simulation, names: dict[str, str]) -> list[list[Event]]:
    """The simulator's ticks with this test's node names, without its own inventory (the
    watcher's is the one the worker counts)."""
    out = []
    for tick in sim.ticks():
        out.append([_renamed(e, names) for e in tick if not isinstance(e, Inventory)])
    return out


def _renamed(event: Event, names: dict[str, str]) -> Event:
    def swap(value: Any) -> Any:
        if isinstance(value, str):
            return names.get(value, value)
        if isinstance(value, list):
            return [swap(v) for v in value]
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        return value

    return msgspec.convert(swap(msgspec.to_builtins(event)), type(event))
