"""This host's maintenance and preemption notices from the GCE metadata server (§6.4).

`instance/maintenance-event` reads NONE, or MIGRATE_ON_HOST_MAINTENANCE /
TERMINATE_ON_HOST_MAINTENANCE about 60 s before host maintenance (GPU and TPU hosts do not
live-migrate: TERMINATE), back to NONE after; `instance/preempted` reads TRUE once a spot or
preemptible VM is being preempted. Every request carries `Metadata-Flavor: Google`, and an
answer without it is not from a metadata server (an error). A daemon long-polls
maintenance-event (`?wait_for_change=true&last_etag=<ETag>&timeout_sec=<capacity.metadata_wait_s>`,
returning at once when it changed since that ETag), then reads preempted; `--once` reads both
without waiting. Identity: `instance/name`, `instance/zone` (`projects/N/zones/Z`),
`instance/attributes/cluster-name` and the node pool from `instance/attributes/kube-labels`
(`cloud.google.com/gke-nodepool=…`), as GKE writes them; `sources.cluster` / `sources.pool`
where they are absent. Changes become MAINTENANCE_STARTED / MAINTENANCE_DONE and PREEMPTION.

The base URL: capacity.metadata_url, else http://$GCE_METADATA_HOST (the convention of the
Google client libraries), else http://metadata.google.internal.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from pipeline.errors import DecodeError, SourceError
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent
from pipeline.sources.base import BadRecord, Parsed, add_validated

SOURCE = "gcp.compute.metadata"
FLAVOR = ("Metadata-Flavor", "Google")
MAINTENANCE_VALUES = ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE")


def metadata_base(configured: str) -> str:
    if configured:
        return configured.rstrip("/")
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    return f"http://{host}"


@dataclass(frozen=True)
class Identity:
    cluster: str
    pool: str
    zone: str
    node: str


@dataclass(frozen=True)
class Reading:
    value: str
    etag: str


class MetadataClient:
    """GETs under /computeMetadata/v1/ with the flavor header both ways."""

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base = base
        self.timeout_s = timeout_s

    def get(self, path: str, *, wait_s: float = 0.0, last_etag: str = "") -> Reading | None:
        """The value at `path`; None when the server has no such entry (404)."""
        query = {}
        if wait_s > 0:
            query = {"wait_for_change": "true", "timeout_sec": str(int(wait_s))}
            if last_etag:
                query["last_etag"] = last_etag
        url = f"{self.base}/computeMetadata/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, headers=dict([FLAVOR]))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s + wait_s) as answer:
                if answer.headers.get(FLAVOR[0]) != FLAVOR[1]:
                    raise SourceError(
                        f"{url}: the answer has no `Metadata-Flavor: Google` header; "
                        "not a metadata server"
                    )
                body = answer.read().decode("utf-8", "replace").strip()
                return Reading(body, answer.headers.get("ETag", ""))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise SourceError(f"metadata server {url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise SourceError(f"metadata server {url}: {exc}") from exc


def read_identity(client: MetadataClient, cluster: str, pool: str) -> Identity:
    name = client.get("instance/name")
    zone = client.get("instance/zone")
    if name is None or zone is None:
        raise SourceError(f"metadata server {client.base}: no instance/name or instance/zone")
    cluster_name = client.get("instance/attributes/cluster-name")
    labels = client.get("instance/attributes/kube-labels")
    node_pool = ""
    for pair in (labels.value if labels else "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "cloud.google.com/gke-nodepool":
            node_pool = value.strip()
    return Identity(
        cluster=cluster_name.value if cluster_name else cluster,
        pool=node_pool or pool,
        zone=zone.value.rsplit("/", 1)[-1],
        node=name.value,
    )


def notice_events(
    seen: dict[str, str], me: Identity, maintenance: str, preempted: str, now_ms: int
) -> Parsed:
    """Events for changed values (`seen`: "maintenance-event" / "preempted" → last value)."""
    parsed = Parsed()
    if maintenance not in MAINTENANCE_VALUES:
        error = DecodeError(
            field="instance/maintenance-event",
            expected=f"one of {list(MAINTENANCE_VALUES)}",
            got=repr(maintenance),
        )
        parsed.bad.append(BadRecord(maintenance.encode(), error))
    else:
        before = seen.get("maintenance-event", "NONE")
        seen["maintenance-event"] = maintenance
        if maintenance != before:
            kind = "MAINTENANCE_DONE" if maintenance == "NONE" else "MAINTENANCE_STARTED"
            make = functools.partial(_event, me, kind, now_ms, maintenance, before)
            add_validated(parsed, make, f"{me.node} {kind} {maintenance}")
    if preempted not in ("TRUE", "FALSE"):
        error = DecodeError(
            field="instance/preempted", expected="TRUE or FALSE", got=repr(preempted)
        )
        parsed.bad.append(BadRecord(preempted.encode(), error))
    else:
        before = seen.get("preempted", "FALSE")
        seen["preempted"] = preempted
        if preempted == "TRUE" and before != "TRUE":
            make = functools.partial(_event, me, "PREEMPTION", now_ms, "TRUE", before)
            add_validated(parsed, make, f"{me.node} PREEMPTION")
    return parsed


def _event(me: Identity, kind: str, now_ms: int, value: str, before: str) -> CapacityEvent:
    path = "preempted" if kind == "PREEMPTION" else "maintenance-event"
    return CapacityEvent(
        event_id=stable_id("cap", SOURCE, me.cluster, me.node, kind, now_ms // 1000),
        ts=now_ms,
        provider="gcp",
        source=SOURCE,
        kind=kind,  # type: ignore[arg-type]
        severity="info" if kind == "MAINTENANCE_DONE" else "warning",
        region=me.zone.rsplit("-", 1)[0],
        zone=me.zone,
        cluster=me.cluster,
        pool=me.pool,
        target_kind="node",
        target=me.node,
        state=value,
        previous_state=before,
        message=f"metadata instance/{path} on {me.node}: {before} -> {value}",
    )
