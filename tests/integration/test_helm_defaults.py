"""The chart's defaults install anywhere (issue 34, item 5): dry run until flipped on purpose,
Prometheus Operator objects only where their CRDs are served, every container under a memory
limit, the XID reader on GPU nodes only and admitted by Pod Security in a namespace of its own
while every other pod passes "restricted" (checked by the real kube-apiserver's PodSecurity
admission on server-side dry runs of the rendered pod templates)."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest

from tests.integration.test_kubernetes_helm import ALL_ON, CHART, OPERATOR, WORKLOADS, _pod, render
from tests.kube_fixture import Kube

DRY_RUN = "FLEETPULSE_POLICY__DRY_RUN"


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in WORKLOADS}


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{name}/{c['name']}": c for name, doc in _workloads(docs).items()
            for c in _pod(doc)["containers"]}  # fmt: skip


def test_every_container_is_in_dry_run_until_flipped_on_purpose(helm: str) -> None:
    default = _containers(render(helm, "fp", "fleet", *ALL_ON))
    assert {name: _env(c).get(DRY_RUN) for name, c in default.items()} == {
        name: "true" for name in default}
    live = _containers(render(helm, "fp", "fleet", "--set", "dryRun=false"))
    assert _env(live["fp-fleetpulse-worker/worker"])[DRY_RUN] == "false"


def test_the_notes_say_dry_run_and_how_to_leave_it(helm: str, kube: Kube) -> None:
    notes = _notes(helm, kube)
    assert "DRY RUN (dryRun=true, the default)" in notes
    assert "--reuse-values --set dryRun=false" in notes
    # a bare cluster: no operator objects, and the notes say so and what to do instead
    assert "No ServiceMonitor or PrometheusRule was installed" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    live = _notes(helm, kube, "--set", "dryRun=false")
    assert "DRY RUN" not in live and "LIVE: dryRun=false" in live


def test_operator_objects_render_only_where_their_crds_are_served(helm: str) -> None:
    bare = {d["kind"] for d in render(helm, "fp", "fleet")}
    assert not bare & {"ServiceMonitor", "PrometheusRule"}
    assert "Service" in bare  # the metrics Service still lets any Prometheus find the pods
    served = {d["kind"] for d in render(helm, "fp", "fleet", *OPERATOR)}
    assert {"ServiceMonitor", "PrometheusRule"} <= served


def test_every_container_has_a_memory_limit(helm: str) -> None:
    containers = _containers(render(helm, "fp", "fleet", *ALL_ON))
    assert len(containers) == 11  # every workload the chart can run, the compaction included
    missing = [name for name, c in containers.items()
               if not c.get("resources", {}).get("limits", {}).get("memory")]  # fmt: skip
    assert missing == []
    unlimited = subprocess.run(
        [helm, "template", "fp", str(CHART), "--set", "watcher.resources.limits=null"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert unlimited.returncode != 0
    assert "watcher.resources.limits.memory is required" in unlimited.stderr


def test_the_xid_reader_selects_gpu_nodes_by_default(helm: str) -> None:
    xid = _pod(_workloads(render(helm, "fp", "fleet"))["fp-fleetpulse-xid"])
    terms = xid["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert keys == ["nvidia.com/gpu.present", "cloud.google.com/gke-accelerator"]
    mine = _pod(_workloads(render(helm, "fp", "fleet", "--set", "xid.gpuNodeAffinity=false",
                                  "--set", "xid.nodeSelector.gpu=yes"))["fp-fleetpulse-xid"])  # fmt: skip
    assert "affinity" not in mine and mine["nodeSelector"] == {"gpu": "yes"}


def test_pod_security_restricted_for_all_but_the_xid_reader_in_its_own_namespace(
    helm: str, kube: Kube
) -> None:
    """Every pod but the XID reader is admitted by a namespace enforcing "restricted"; the
    reader is refused there and admitted in the privileged namespace the chart creates."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient

    release, xid_ns = "fp", f"fp-xid-{uuid.uuid4().hex[:6]}"
    namespace = _namespace(kube, {"pod-security.kubernetes.io/enforce": "restricted"})
    docs = render(helm, release, namespace, *ALL_ON, "--set", f"xid.namespace={xid_ns}",
                  "--set", "xid.createNamespace=true")  # fmt: skip
    (created_ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert created_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    DynamicClient(kube.api_client).resources.get(api_version="v1", kind="Namespace").create(
        body=created_ns)
    # the pods' ServiceAccounts, for the ServiceAccount admission plugin (no controller here
    # makes each namespace's default one)
    default = {"metadata": {"name": "default"}}
    for ns, account in [(namespace, default), (xid_ns, default),
                        *((namespace, d) for d in docs if d["kind"] == "ServiceAccount")]:
        kube.core.create_namespaced_service_account(ns, account)
    workloads = _workloads(docs)
    xid = workloads.pop("fp-fleetpulse-xid")
    assert xid["metadata"]["namespace"] == xid_ns
    for name, doc in workloads.items():
        kube.core.create_namespaced_pod(namespace, _as_pod(name, doc), dry_run="All")
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod(namespace, _as_pod("xid", xid), dry_run="All")
    why = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and 'violates PodSecurity "restricted' in why, why
    kube.core.create_namespaced_pod(xid_ns, _as_pod("xid", xid), dry_run="All")
    kube.core.delete_namespace(xid_ns, body=client.V1DeleteOptions())


def _as_pod(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A workload's pod template as a Pod (a StatefulSet's claim templates as emptyDirs)."""
    spec = dict(_pod(doc))
    claims = doc["spec"].get("volumeClaimTemplates", [])
    spec["volumes"] = [*spec.get("volumes", []),
                       *({"name": c["metadata"]["name"], "emptyDir": {}} for c in claims)]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name[:63]}, "spec": spec}


def _namespace(kube: Kube, labels: dict[str, str]) -> str:
    from kubernetes import client

    name = f"fp-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=name, labels=labels)))  # fmt: skip
    return name


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _notes(helm: str, kube: Kube, *args: str) -> str:
    """The NOTES a `helm install` prints (a client-side dry run against the test server)."""
    done = subprocess.run(
        [helm, "install", "fp", str(CHART), "--dry-run=client", "--namespace", "fleet",
         "--kubeconfig", kube.kubeconfig, *args],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]
