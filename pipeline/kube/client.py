"""The official `kubernetes` client, configured once from [kubernetes]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from urllib3.exceptions import HTTPError

from pipeline.config import KubernetesSettings
from pipeline.errors import ConfigError

# the API server cannot be reached: a socket error, or urllib3's own (MaxRetryError, a
# timeout, a broken TLS handshake are not OSErrors): each is retried, never a crash
UNREACHABLE: tuple[type[BaseException], ...] = (OSError, HTTPError)


@dataclass(frozen=True)
class Apis:
    core: Any  # kubernetes.client.CoreV1Api
    api_client: Any


def connect(settings: KubernetesSettings) -> Apis:
    """Clients for the configured cluster: in-cluster (the pod's ServiceAccount token), or a
    kubeconfig (kubernetes.kubeconfig, else $KUBECONFIG / ~/.kube/config)."""
    from kubernetes import client, config  # the client only where Kubernetes is used
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if settings.in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=settings.kubeconfig or None,
                context=settings.context or None,
                client_configuration=configuration,
            )
    except (ConfigException, OSError) as exc:
        where = "in-cluster" if settings.in_cluster else (settings.kubeconfig or "$KUBECONFIG")
        raise ConfigError(
            f"kubernetes: cannot load the {where} configuration "
            f"(kubernetes.kubeconfig / kubernetes.in_cluster): {exc}"
        ) from None
    api_client = client.ApiClient(configuration)
    return Apis(core=client.CoreV1Api(api_client), api_client=api_client)


def cluster_name(settings: KubernetesSettings, default: str) -> str:
    return settings.cluster or default
