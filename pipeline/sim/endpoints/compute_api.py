"""A Compute Engine API stand-in: `instances.aggregatedList` and `instances.list`, REST JSON.

The real `google.cloud.compute_v1.InstancesClient` (REST-only) talks to it with
`client_options={"api_endpoint": "http://127.0.0.1:PORT"}` and anonymous credentials
(pipeline/sources/gcp_clients.py). Paths and shapes as the v1 API:
`GET /compute/v1/projects/{project}/aggregated/instances` answers
`{"kind": "compute#instanceAggregatedList", "items": {"zones/<zone>": {"instances": [...]}}}`
and `GET /compute/v1/projects/{project}/zones/{zone}/instances` answers
`{"kind": "compute#instanceList", "items": [...]}`, both paged by `maxResults` (≤ 500) and an
opaque `pageToken` → `nextPageToken`; errors are `{"error": {"code", "message", "errors"}}`.

Each simulated GPU node is an instance: GKE's labels `goog-k8s-cluster-name`,
`goog-k8s-node-pool-name`, `guestAccelerators` (type URL of the node's GKE accelerator,
count 8), `scheduling.onHostMaintenance` TERMINATE. The simulator's host maintenance of a node
sets `resourceStatus.upcomingMaintenance` (SCHEDULED, PENDING on MAINTENANCE_SCHEDULED, ONGOING
on MAINTENANCE_STARTED, gone on MAINTENANCE_DONE). Serving pools' nodes are spot VMs
(`scheduling.provisioningModel` SPOT); a PREEMPTION makes one TERMINATED until the node is
created again.

Reservations (`reservations.aggregatedList`, `GET .../aggregated/reservations`, paged the same
way) mirror the simulator's RESERVATION_CHANGED events of GPU types: `quota.metric` names the
reservation, `quota.limit` its GPUs, `quota.usage` those in use. A name starting `agg-` is an
aggregate reservation (`aggregateReservation.reservedResources` / `inUseResources` by
accelerator count), any other a specific one (`specificReservation.count` VMs of
a3-highgpu-8g, `inUseCount` of them); state DELETED removes it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

from pipeline.ids import stable_id
from pipeline.model import CapacityEvent
from pipeline.sim.endpoints.stand_in import HttpStandIn, page_offset, page_token
from pipeline.sim.fleet import GPUS_PER_NODE, Fleet

MAX_RESULTS = 500
_AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$")
_ZONAL = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances$")
_RESERVATIONS = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/reservations$")


def rfc3339(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[
        :-4
    ] + "Z"


class ComputeStandIn(HttpStandIn):
    thread_name = "compute"

    def __init__(
        self,
        fleet: Fleet,
        *,
        project: str = "fleetpulse-sim",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.project = project
        self._lock = threading.Lock()
        self._listen(host, port, _handler_for(self))
        self.requests: list[str] = []  # every path asked for, for tests
        base = f"{self.address}/compute/v1/projects/{project}"
        self._instances: dict[str, dict[str, Any]] = {
            node.name: {
                "kind": "compute#instance",
                "id": str(10**15 + index),
                "name": node.name,
                "zone": f"{base}/zones/{node.zone}",
                "selfLink": f"{base}/zones/{node.zone}/instances/{node.name}",
                "status": "RUNNING",
                "machineType": f"{base}/zones/{node.zone}/machineTypes/a3-highgpu-8g",
                "labels": {
                    "goog-k8s-cluster-name": node.cluster,
                    "goog-k8s-node-pool-name": node.pool,
                    "goog-gke-node": "",
                },
                "guestAccelerators": [
                    {
                        "acceleratorType": f"{base}/zones/{node.zone}/acceleratorTypes/"
                        f"{node.model.gke_accelerator}",
                        "acceleratorCount": GPUS_PER_NODE,
                    }
                ],
                "scheduling": {
                    "onHostMaintenance": "TERMINATE",
                    "automaticRestart": node.pool_kind != "serve",
                    # serving pools run on spot VMs: those are the ones preempted
                    "provisioningModel": "SPOT" if node.pool_kind == "serve" else "STANDARD",
                },
                "resourceStatus": {},
            }
            for index, node in enumerate(fleet.gpu_nodes)
        }
        self._reservations: dict[str, dict[str, Any]] = {}

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- state from the simulator -------------------------------------------------------------

    def record_capacity(self, event: CapacityEvent) -> None:
        if event.kind == "RESERVATION_CHANGED":
            self._reservation(event)
            return
        if event.target_kind != "node" or event.target not in self._instances:
            return
        with self._lock:
            instance = self._instances[event.target]
            status = instance["resourceStatus"]
            if event.kind in ("MAINTENANCE_SCHEDULED", "MAINTENANCE_STARTED") and event.window:
                status["upcomingMaintenance"] = {
                    "type": "SCHEDULED",
                    "canReschedule": False,
                    "windowStartTime": rfc3339(event.window.start),
                    "windowEndTime": rfc3339(event.window.end),
                    "latestWindowStartTime": rfc3339(event.window.start),
                    "maintenanceStatus": "ONGOING"
                    if event.kind == "MAINTENANCE_STARTED"
                    else "PENDING",
                    "maintenanceOnShutdown": False,
                    "maintenanceReasons": ["PLANNED_UPDATE"],
                }
            elif event.kind == "MAINTENANCE_DONE":
                status.pop("upcomingMaintenance", None)
            elif event.kind == "PREEMPTION":
                instance["status"] = "TERMINATED"

    def _reservation(self, event: CapacityEvent) -> None:
        kind = event.accelerator_type or ""
        if event.quota is None or not kind.startswith("nvidia-"):
            return  # TPU reservations are the TPU API's
        name = event.quota.metric.rsplit("/", 1)[-1]
        with self._lock:
            if event.state == "DELETED":
                self._reservations.pop(name, None)
                return
            self._reservations[name] = self._reservation_body(
                name, event.zone, kind, int(event.quota.limit), int(event.quota.usage)
            )

    def _reservation_body(
        self, name: str, zone: str, kind: str, gpus: int, in_use: int
    ) -> dict[str, Any]:
        base = f"{self.address}/compute/v1/projects/{self.project}/zones/{zone}"
        body: dict[str, Any] = {
            "kind": "compute#reservation",
            "id": str(int(stable_id("r", zone, name)[2:], 16) % 10**15),
            "name": name,
            "zone": base,
            "selfLink": f"{base}/reservations/{name}",
            "status": "READY",
        }
        accelerator = f"{base}/acceleratorTypes/{kind}"
        if name.startswith("agg-"):
            body["aggregateReservation"] = {
                "reservedResources": [
                    {"accelerator": {"acceleratorCount": gpus, "acceleratorType": accelerator}}
                ],
                "inUseResources": [
                    {"accelerator": {"acceleratorCount": in_use, "acceleratorType": accelerator}}
                ],
            }
        else:
            body["specificReservation"] = {
                "count": str(gpus // GPUS_PER_NODE),
                "inUseCount": str(in_use // GPUS_PER_NODE),
                "instanceProperties": {
                    "machineType": "a3-highgpu-8g",
                    "guestAccelerators": [
                        {"acceleratorType": kind, "acceleratorCount": GPUS_PER_NODE}
                    ],
                },
            }
        return body

    def recreated(self, node: str) -> None:
        with self._lock:
            if node in self._instances:
                self._instances[node]["status"] = "RUNNING"

    # -- serving ------------------------------------------------------------------------------

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        aggregated, zonal = _AGGREGATED.match(path), _ZONAL.match(path)
        reservations = _RESERVATIONS.match(path)
        match = aggregated or zonal or reservations
        if match is None:
            return _error(404, "notFound", f"The requested URL {path} was not found.")
        if match["project"] != self.project:
            missing = f"The resource 'projects/{match['project']}' was not found"
            return _error(404, "notFound", missing)
        try:
            size = int(query.get("maxResults", MAX_RESULTS))
            offset = page_offset(query.get("pageToken", ""), path, "pageToken")
        except ValueError as exc:
            return _error(400, "invalid", str(exc))
        if not 0 <= size <= MAX_RESULTS:
            return _error(400, "invalid", f"Invalid value for field 'maxResults': {size}")
        if reservations is not None:
            return 200, self._reservations_page(path, offset, size)
        with self._lock:
            chosen = sorted(
                (json.loads(json.dumps(i)) for i in self._instances.values()),
                key=lambda i: (i["zone"], i["name"]),
            )
        if zonal is not None:
            chosen = [i for i in chosen if i["zone"].endswith(f"/zones/{zonal['zone']}")]
        page = chosen[offset : offset + (size or MAX_RESULTS)]
        body: dict[str, Any] = {"id": f"projects/{self.project}/aggregated/instances"}
        if aggregated is not None:
            items: dict[str, Any] = {}
            for instance in page:
                scope = "zones/" + instance["zone"].rsplit("/", 1)[-1]
                items.setdefault(scope, {"instances": []})["instances"].append(instance)
            body.update(kind="compute#instanceAggregatedList", items=items)
        else:
            body.update(kind="compute#instanceList", items=page)
        if offset + len(page) < len(chosen):
            body["nextPageToken"] = page_token(offset + len(page), path)
        return 200, body

    def _reservations_page(self, path: str, offset: int, size: int) -> dict[str, Any]:
        with self._lock:
            chosen = sorted(
                (json.loads(json.dumps(r)) for r in self._reservations.values()),
                key=lambda r: (r["zone"], r["name"]),
            )
        page = chosen[offset : offset + (size or MAX_RESULTS)]
        items: dict[str, Any] = {}
        for reservation in page:
            scope = "zones/" + reservation["zone"].rsplit("/", 1)[-1]
            items.setdefault(scope, {"reservations": []})["reservations"].append(reservation)
        body: dict[str, Any] = {
            "kind": "compute#reservationAggregatedList",
            "id": f"projects/{self.project}/aggregated/reservations",
            "items": items,
        }
        if offset + len(page) < len(chosen):
            body["nextPageToken"] = page_token(offset + len(page), path)
        return body



def _error(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }



def _handler_for(server: ComputeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            code, body = server.answer(url.path, dict(urllib.parse.parse_qsl(url.query)))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: http.server would log every request of a test to stderr."""

    return Handler
