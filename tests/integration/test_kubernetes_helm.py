"""The Helm chart (deploy/helm/fleetpulse) and the Containerfile: helm lint, helm template
with the default and the secure values, and every rendered object created with a server-side
dry run on the real kube-apiserver. ServiceMonitor and PrometheusRule are Prometheus
Operator CRDs the bare API server does not have: they are checked for shape here and left out
of the dry run (SKIPPED_KINDS), nothing else is."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_fixture import REPO, Kube

CHART = REPO / "deploy" / "helm" / "fleetpulse"
VALUES = {"default": [], "secure": ["-f", str(CHART / "ci" / "secure-values.yaml")]}
SKIPPED_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: not on a bare API server
ACTUATOR_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
]


def render(helm: str, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", namespace, *args],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint(helm: str, values: str) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *VALUES[values]],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_rendered_object_passes_a_server_side_dry_run(
    helm: str, kube: Kube, values: str
) -> None:
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    namespace = f"fp-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    docs = render(helm, f"r{uuid.uuid4().hex[:6]}", namespace, *VALUES[values])
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "DaemonSet", "StatefulSet", "CronJob", "Job", "ServiceAccount",
            "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Service"} <= kinds  # fmt: skip
    assert kinds >= SKIPPED_KINDS
    dynamic = DynamicClient(kube.api_client)
    for doc in docs:
        if doc["kind"] in SKIPPED_KINDS:
            continue
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        created = resource.create(body=doc, namespace=namespace if resource.namespaced else None,
                                  dry_run="All")  # fmt: skip
        assert created.metadata.name == doc["metadata"]["name"]


def test_the_chart_wires_what_the_issue_asks_for(helm: str) -> None:
    docs = render(helm, "fp", "fleet", *VALUES["secure"])
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    actuator_role = by[("ClusterRole", "fp-fleetpulse-actuator")]
    assert actuator_role["rules"] == ACTUATOR_RULES  # least privilege, exactly
    assert by[("ClusterRole", "fp-fleetpulse-watcher")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    worker = by[("Deployment", "fp-fleetpulse-worker")]["spec"]
    container = worker["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLEETPULSE_KAFKA__SASL_PASSWORD_FILE"] == "/etc/fleetpulse/kafka/sasl-password"
    assert env["FLEETPULSE_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    secret = next(v for v in worker["template"]["spec"]["volumes"] if v["name"] == "kafka-secret")
    assert secret["secret"]["secretName"] == "fleetpulse-kafka"
    xid = by[("DaemonSet", "fp-fleetpulse-xid")]["spec"]["template"]["spec"]
    mounts = xid["containers"][0]["volumeMounts"]
    assert next(m for m in mounts if m["name"] == "kmsg")["readOnly"] is True
    node_env = next(e for e in xid["containers"][0]["env"] if e["name"] == "FLEETPULSE_SOURCES__NODE")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    lake = by[("StatefulSet", "fp-fleetpulse-lake")]["spec"]
    assert lake["volumeClaimTemplates"][0]["metadata"]["name"] == "lake"
    rules = by[("PrometheusRule", "fp-fleetpulse")]["spec"]["groups"][0]["rules"]
    assert {"FleetPulseConsumerLag", "FleetPulseDeadLetters", "FleetPulseStateResets",
            "FleetPulseBudgetExhausted", "FleetPulseCommonCause"} <= {r["alert"] for r in rules}  # fmt: skip
    dashboard = by[("ConfigMap", "fp-fleetpulse-dashboard")]["data"]["fleetpulse.json"]
    assert '"title": "FleetPulse"' in dashboard and "fleetpulse_worker_consumer_lag" in dashboard


def test_more_workers_than_partitions_is_refused(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "fp", str(CHART), "--set", "worker.replicas=7"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "worker.replicas (7) must be <= kafka.partitions (6)" in result.stderr


def test_a_secured_kafka_needs_its_secret(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "fp", str(CHART), "--set", "kafka.securityProtocol=SSL"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "kafka.existingSecret is required" in result.stderr


def test_containerfile_passes_hadolint() -> None:
    hadolint = Path(__import__("sys").executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(REPO / "Containerfile")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
