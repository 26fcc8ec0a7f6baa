"""The real Google Cloud clients of `ingest capacity`, for the real APIs or for stand-ins.

Each takes an endpoint: "" means the real API with Application Default Credentials; a gRPC
stand-in is `host:port` (plaintext channel); Compute Engine is REST-only, and its stand-in is
`http://host:port` (the REST transport takes the scheme from `api_endpoint`). Stand-ins get
anonymous credentials: no credential lookup, no token refresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.errors import SourceError

T = TypeVar("T")

NO_CREDENTIALS = (
    "{api} needs Google Cloud credentials and found none (Application Default Credentials). "
    "Provide them with `gcloud auth application-default login`, "
    "GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json, or a service account on GCE/GKE "
    "({role}). To read a stand-in instead, set capacity.{setting} "
    "(FLEETPULSE_CAPACITY__{env})."
)


def api_call(what: str, call: Callable[[], T]) -> T:
    """Run one API call; the client's errors become SourceError (retried with backoff)."""
    from google.api_core import exceptions

    try:
        return call()
    except exceptions.RetryError as exc:
        raise SourceError(f"{what}: gave up retrying: {exc}") from exc
    except exceptions.GoogleAPICallError as exc:
        raise SourceError(f"{what}: {exc}") from exc


def _no_credentials(api: str, role: str, setting: str) -> SourceError:
    return SourceError(
        NO_CREDENTIALS.format(api=api, role=role, setting=setting, env=setting.upper())
    )


def monitoring_client(endpoint: str) -> Any:
    from pipeline.sources.cloudmon import metric_service_client

    return metric_service_client(endpoint)


def tpu_client(endpoint: str) -> Any:
    """`google.cloud.tpu_v2alpha1.TpuClient` (v2alpha1: nodes' upcoming_maintenance)."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import tpu_v2alpha1

    if not endpoint:
        try:
            return tpu_v2alpha1.TpuClient()
        except DefaultCredentialsError as exc:
            raise _no_credentials("The TPU API", "roles/tpu.viewer", "tpu_endpoint") from exc
    import grpc
    from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport

    channel = grpc.insecure_channel(endpoint)
    return tpu_v2alpha1.TpuClient(transport=TpuGrpcTransport(channel=channel))


def instances_client(endpoint: str) -> Any:
    """`google.cloud.compute_v1.InstancesClient` (REST)."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import compute_v1

    if not endpoint:
        try:
            return compute_v1.InstancesClient()
        except DefaultCredentialsError as exc:
            raise _no_credentials(
                "The Compute Engine API", "roles/compute.viewer", "compute_endpoint"
            ) from exc
    from google.auth.credentials import AnonymousCredentials

    return compute_v1.InstancesClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options={"api_endpoint": endpoint},
    )
