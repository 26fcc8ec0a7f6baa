"""A real kube-apiserver (+ etcd) for the Kubernetes tests, from deploy/kubernetes/kube.sh.

`make test` (deploy/with-services.sh) builds it once and starts it on KUBE_API_PORT; a test
session started without it starts one itself (building the binary first if it is not cached,
~5 min) and stops it at the end. Only the API server runs: nodes are plain objects, pods are
bound with spec.nodeName, and PodDisruptionBudget status is written by the test (there is no
disruption controller). Names are unique per test so tests never share objects.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# where a test node is unless the test says otherwise: the pool and zone the actuator tests'
# actions name (the actuator refuses an action whose pool or zone its node's labels deny)
PLACE = {"cloud.google.com/gke-nodepool": "a3", "topology.kubernetes.io/zone": "z-a"}
KUBE_SH = REPO / "deploy" / "kubernetes" / "kube.sh"
HELM_SH = REPO / "deploy" / "kubernetes" / "helm.sh"


@dataclass
class Kube:
    kubeconfig: str
    api_client: Any
    core: Any
    policy: Any
    rbac: Any

    def node(self, prefix: str = "n", *, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, unschedulable: bool = False,
             gpus: int = 0) -> str:  # fmt: skip
        from kubernetes import client

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        labels = PLACE if labels is None else labels
        self.core.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations),
            spec=client.V1NodeSpec(unschedulable=unschedulable or None)))  # fmt: skip
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status: dict[str, Any] = {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}  # fmt: skip
        if gpus:
            status["capacity"] = {"nvidia.com/gpu": str(gpus)}
        self.core.patch_node_status(name, {"status": status},
                                    _content_type="application/strategic-merge-patch+json")
        return name

    def pod(self, node: str, *, labels: dict[str, str] | None = None,
            owner: str | None = None, mirror: bool = False, namespace: str = "default") -> str:  # fmt: skip
        """A Running, Ready pod bound to `node` (what a kubelet would report)."""
        from kubernetes import client

        name = f"p-{uuid.uuid4().hex[:8]}"
        owners = None
        if owner:
            owners = [client.V1OwnerReference(api_version="apps/v1", kind=owner, name="ds",
                                              uid=str(uuid.uuid4()), controller=True)]
        annotations = {"kubernetes.io/config.mirror": "x"} if mirror else None
        self.core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels=labels, owner_references=owners,
                                         annotations=annotations),
            spec=client.V1PodSpec(node_name=node,
                                  containers=[client.V1Container(name="c", image="busybox")])))  # fmt: skip
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {
            "phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}},
            _content_type="application/strategic-merge-patch+json")  # fmt: skip
        return name

    def pdb(self, selector: dict[str, str], allowed: int, namespace: str = "default") -> str:
        """A PodDisruptionBudget with its status written as the disruption controller would."""
        from kubernetes import client

        name = f"pdb-{uuid.uuid4().hex[:8]}"
        self.policy.create_namespaced_pod_disruption_budget(namespace,
            client.V1PodDisruptionBudget(metadata=client.V1ObjectMeta(name=name),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=1, selector=client.V1LabelSelector(match_labels=selector))))  # fmt: skip
        self.pdb_allows(name, allowed, namespace)
        return name

    def pdb_allows(self, name: str, allowed: int, namespace: str = "default") -> None:
        current = self.policy.read_namespaced_pod_disruption_budget(name, namespace)
        self.policy.patch_namespaced_pod_disruption_budget_status(name, namespace, {"status": {
            "observedGeneration": current.metadata.generation, "disruptionsAllowed": allowed,
            "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}},
            _content_type="application/merge-patch+json")  # fmt: skip

    def pods_on(self, node: str) -> dict[str, Any]:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return {p.metadata.name: p for p in pods.items}


def _env() -> dict[str, str]:
    return {**os.environ, "KUBE_API_PORT": os.environ.get("KUBE_API_PORT", "26443"),
            "KUBE_ETCD_PORT": os.environ.get("KUBE_ETCD_PORT", "23790")}  # fmt: skip


def kubeconfig_path() -> str:
    out = subprocess.run(["bash", str(KUBE_SH), "env"], env=_env(), check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return out.strip().split("=", 1)[1]


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    """The running API server (with-services.sh started it), or one started here."""
    from kubernetes import client, config

    env = _env()
    running = subprocess.run(["bash", str(KUBE_SH), "status"], env=env,
                             capture_output=True).returncode == 0  # fmt: skip
    if not running:
        subprocess.run(["bash", str(KUBE_SH), "start"], env=env, check=True, timeout=900)
    try:
        path = kubeconfig_path()
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=configuration)
        api = client.ApiClient(configuration)
        yield Kube(path, api, client.CoreV1Api(api), client.PolicyV1Api(api),
                   client.RbacAuthorizationV1Api(api))
    finally:
        if not running:
            subprocess.run(["bash", str(KUBE_SH), "stop"], env=env, check=True, timeout=120)


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary, built once from the Go module proxy (with-services.sh builds it)."""
    out = subprocess.run(["bash", str(HELM_SH), "path"], check=True, capture_output=True,
                         text=True, timeout=900).stdout  # fmt: skip
    return out.strip().splitlines()[-1]
