"""Least privilege, on an API server running with RBAC and a token file: the chart's
actuator ServiceAccount, with a token from the TokenRequest API, can do what the actuator
needs (and the actuator works with it), and cannot delete a node or read a secret."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pipeline.config import KubernetesSettings
from pipeline.kube.actuator import Actuator
from tests.integration.test_kubernetes_actuator import CLUSTER, action
from tests.integration.test_kubernetes_helm import render
from tests.kube_fixture import Kube


def _as(kube: Kube, helm: str, component: str) -> Any:
    """A CoreV1Api authenticated as the chart's `component` ServiceAccount."""
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    namespace = f"rbac-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    release = f"r{uuid.uuid4().hex[:6]}"
    dynamic = DynamicClient(kube.api_client)
    account = ""
    for doc in render(helm, release, namespace):
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding") and \
                doc["metadata"]["name"].endswith(f"-{component}"):  # fmt: skip
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            resource.create(body=doc, namespace=namespace if resource.namespaced else None)
            account = doc["metadata"]["name"] if doc["kind"] == "ServiceAccount" else account
    token = kube.core.create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token  # fmt: skip
    configuration = client.Configuration()
    source = kube.api_client.configuration
    configuration.host, configuration.ssl_ca_cert = source.host, source.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(configuration))


def _status(call: Any) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_the_actuator_token_can_do_its_job_and_nothing_else(kube: Kube, helm: str) -> None:
    core = _as(kube, helm, "actuator")
    name = kube.node()
    kube.pod(name)
    runner = Actuator(core, KubernetesSettings(drain_timeout_s=5), CLUSTER)
    cordon = runner.handle(action(name, "cordon"))
    drain = runner.handle(action(name, "drain"))
    assert cordon is not None and cordon.kind == "cordoned"
    assert drain is not None and drain.kind == "drained"  # patch nodes, nodes/status, evict
    assert _status(lambda: core.delete_node(name)) == 403
    assert _status(lambda: core.list_namespaced_secret("default")) == 403
    assert _status(lambda: core.read_namespaced_secret("any", "kube-system")) == 403
    pod = kube.pod(name)
    assert _status(lambda: core.delete_namespaced_pod(pod, "default")) == 403
    assert _status(lambda: core.list_namespaced_config_map("default")) == 403
    assert kube.core.read_node(name).spec.unschedulable is True


@pytest.mark.parametrize("verb", ["patch", "delete"])
def test_the_watcher_token_only_reads_nodes(kube: Kube, helm: str, verb: str) -> None:
    core = _as(kube, helm, "watcher")
    name = kube.node()
    assert _status(lambda: core.list_node()) == 200
    if verb == "patch":
        call = lambda: core.patch_node(name, {"spec": {"unschedulable": True}},  # noqa: E731
                                       _content_type="application/merge-patch+json")
    else:
        call = lambda: core.delete_node(name)  # noqa: E731
    assert _status(call) == 403
