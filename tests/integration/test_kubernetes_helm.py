"""The Helm chart (deploy/helm/fleetpulse) and the Containerfile: helm lint, helm template
with the default and the secure values, and every rendered object created with a server-side
dry run on the real kube-apiserver. ServiceMonitor and PrometheusRule are Prometheus
Operator CRDs the bare API server does not have: they are checked for shape here and left out
of the dry run (SKIPPED_KINDS), nothing else is; they render only where the cluster serves
monitoring.coreos.com/v1, so these renders say it does (OPERATOR)."""

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
OPERATOR = ["--api-versions", "monitoring.coreos.com/v1"]  # as if the operator's CRDs were there
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
    docs = render(helm, f"r{uuid.uuid4().hex[:6]}", namespace, *VALUES[values], *OPERATOR)
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
    docs = render(helm, "fp", "fleet", *VALUES["secure"], *OPERATOR)
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
    assert env["FLEETPULSE_KAFKA__SASL_USERNAME"] == "fleetpulse-worker"
    assert env["FLEETPULSE_KAFKA__SSL_CAFILE"] == "/etc/fleetpulse/kafka-ca/ca.crt"
    volumes = {v["name"]: v["secret"] for v in worker["template"]["spec"]["volumes"]
               if "secret" in v}  # fmt: skip
    assert volumes["kafka-principal"]["secretName"] == "fleetpulse-kafka-worker"
    assert volumes["kafka-ca"]["secretName"] == "fleetpulse-kafka-ca"
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
    assert result.returncode != 0
    assert "kafka.caSecret is required with kafka.securityProtocol SSL" in result.stderr


# Every workload the chart can run, each with the principal it must run as (pipeline/wire/acl.py).
ALL_ON = [*VALUES["secure"], "--set", "ingest.cloudmon.enabled=true",
          "--set", "ingest.capacity.enabled=true"]  # fmt: skip
WORKLOAD_ROLE = {
    ("Deployment", "fp-fleetpulse-worker"): "worker",
    ("Job", "fp-fleetpulse-topics"): "topics",
    ("Deployment", "fp-fleetpulse-ingest-prometheus"): "ingest-prometheus",
    ("Deployment", "fp-fleetpulse-ingest-cloudmon"): "ingest-cloudmon",
    ("Deployment", "fp-fleetpulse-ingest-capacity"): "ingest-capacity",
    ("DaemonSet", "fp-fleetpulse-xid"): "ingest-xid",
    ("StatefulSet", "fp-fleetpulse-lake"): "lake",
    ("Deployment", "fp-fleetpulse-alerts"): "alerts",
    ("Deployment", "fp-fleetpulse-actuator"): "actuator",
    ("Deployment", "fp-fleetpulse-watcher"): "watcher",
}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def _credentials(doc: dict[str, Any]) -> tuple[str | None, list[str]]:
    """A workload's SASL user and the Secrets holding a Kafka password that its pod mounts."""
    pod = _pod(doc)
    users = {e["value"] for c in pod["containers"] for e in c.get("env", [])
             if e["name"] == "FLEETPULSE_KAFKA__SASL_USERNAME"}  # fmt: skip
    assert len(users) <= 1, users
    secrets = [v["secret"]["secretName"] for v in pod.get("volumes", [])
               if "secret" in v and v["name"] != "kafka-ca"]  # fmt: skip
    return next(iter(users), None), secrets


def test_each_workload_runs_as_its_own_principal(helm: str) -> None:
    """Issue 33: every pod shared one SASL account that could write every topic, the XID
    DaemonSet (root on every GPU node) included. Now each workload has its own user and mounts
    its own Secret, only the password key of it; the lake's compaction has no Kafka at all."""
    from pipeline.wire.acl import BY_NAME

    docs = render(helm, "fp", "fleet", *ALL_ON)
    workloads = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in WORKLOADS}
    assert set(workloads) == {*WORKLOAD_ROLE, ("CronJob", "fp-fleetpulse-lake-compaction")}
    found = {key: _credentials(doc) for key, doc in workloads.items()}
    assert found.pop(("CronJob", "fp-fleetpulse-lake-compaction")) == (None, [])
    users = {key: user for key, (user, _) in found.items()}
    secrets = {key: mounted for key, (_, mounted) in found.items()}
    assert all(len(mounted) == 1 for mounted in secrets.values()), secrets
    assert len(set(users.values())) == len(users), f"a user shared: {users}"
    assert len({m[0] for m in secrets.values()}) == len(secrets), f"a Secret shared: {secrets}"
    xid = ("DaemonSet", "fp-fleetpulse-xid")
    assert (users[xid], secrets[xid]) == ("gpu-xid-reader", ["kafka-user-gpu-xid-reader"])
    # every other workload under its role's default principal, the ACL table's user name
    expected = {key: BY_NAME[role].principal for key, role in WORKLOAD_ROLE.items() if key != xid}
    assert {key: user for key, user in users.items() if key != xid} == expected
    for key, doc in workloads.items():
        for volume in _pod(doc).get("volumes", []):
            if volume["name"] == "kafka-principal":  # the password alone, nothing else
                assert [i["key"] for i in volume["secret"]["items"]] == ["sasl-password"], key


def test_two_workloads_sharing_a_principal_are_refused(helm: str) -> None:
    shared = subprocess.run(
        [helm, "template", "fp", str(CHART), *VALUES["secure"],
         "--set", "kafka.principals.actuator.username=fleetpulse-worker"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shared.returncode != 0
    assert 'kafka.principals.actuator and .worker share the user "fleetpulse-worker"' in (
        shared.stderr)
    old = subprocess.run(
        [helm, "template", "fp", str(CHART), *VALUES["secure"],
         "--set", "kafka.existingSecret=fleetpulse-kafka"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert old.returncode != 0 and "kafka.existingSecret are gone" in old.stderr


def test_the_inventory_is_enforced_with_the_watcher_by_default(helm: str) -> None:
    docs = render(helm, "fp", "fleet")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("Deployment", "fp-fleetpulse-watcher") in by
    worker = _pod(by[("Deployment", "fp-fleetpulse-worker")])["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["FLEETPULSE_INVENTORY__ENFORCE"] == "true"
    alone = subprocess.run(
        [helm, "template", "fp", str(CHART), "--set", "watcher.enabled=false"],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert alone.returncode != 0
    assert "inventory.enforce=true needs an inventory source" in alone.stderr
    loaded = render(helm, "fp", "fleet", "--set", "watcher.enabled=false",
                    "--set", "inventory.externalSource=true")  # fmt: skip
    assert not any(d["metadata"]["name"] == "fp-fleetpulse-watcher" for d in loaded)


def test_containerfile_passes_hadolint() -> None:
    hadolint = Path(__import__("sys").executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(REPO / "Containerfile")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
