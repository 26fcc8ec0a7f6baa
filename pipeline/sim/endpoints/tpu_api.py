"""A Cloud TPU API stand-in: `google.cloud.tpu.v2alpha1.Tpu/{ListNodes, ListQueuedResources}`
over gRPC, with the library's own proto types.

The real `google.cloud.tpu_v2alpha1.TpuClient` talks to it over a plaintext channel
(pipeline/sources/gcp_clients.py). `parent` = `projects/<project>/locations/<zone>` or
`locations/-` (every zone); paging by `page_size` and an opaque `next_page_token`; another
project is NOT_FOUND, a bad token INVALID_ARGUMENT.

Each simulated TPU slice is a READY node (`labels` cluster/pool, `accelerator_type`,
`accelerator_config.topology`); the simulator's TPU slice maintenance sets its
`upcoming_maintenance` (PENDING on MAINTENANCE_SCHEDULED, ONGOING on MAINTENANCE_STARTED,
cleared on MAINTENANCE_DONE) and a PREEMPTION of a slice makes it PREEMPTED. The simulator's
queued-resource lifecycles (QUEUED_RESOURCE_STATE) are queued resources in their latest state;
a FAILED one carries `failed_data.error` RESOURCE_EXHAUSTED (no capacity before valid_until).
`ListReservations` mirrors the simulator's RESERVATION_CHANGED events of TPU types: a
Reservation named `quota.metric` in the event's zone, `standard.size` = `quota.limit` CHIPS,
`usage.total` = `quota.usage`, state ACTIVE (DELETED removes it).
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from google.cloud import tpu_v2alpha1

from pipeline.model import CapacityEvent
from pipeline.sim.endpoints.compute_api import rfc3339
from pipeline.sim.endpoints.stand_in import page_offset, page_token
from pipeline.sim.fleet import Fleet

SERVICE = "google.cloud.tpu.v2alpha1.Tpu"
_Node = tpu_v2alpha1.Node.pb()
_Queued = tpu_v2alpha1.QueuedResource.pb()
_ListNodesRequest = tpu_v2alpha1.ListNodesRequest.pb()
_ListNodesResponse = tpu_v2alpha1.ListNodesResponse.pb()
_ListQueuedRequest = tpu_v2alpha1.ListQueuedResourcesRequest.pb()
_ListQueuedResponse = tpu_v2alpha1.ListQueuedResourcesResponse.pb()
_Reservation = tpu_v2alpha1.Reservation.pb()
_ListReservationsRequest = tpu_v2alpha1.ListReservationsRequest.pb()
_ListReservationsResponse = tpu_v2alpha1.ListReservationsResponse.pb()
_State = tpu_v2alpha1.QueuedResourceState.State
_Status = tpu_v2alpha1.UpcomingMaintenance.MaintenanceStatus
_Type = tpu_v2alpha1.UpcomingMaintenance.MaintenanceType
MAX_PAGE_SIZE = 1000
RESOURCE_EXHAUSTED = 8


class TpuApiStandIn:
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
        self._nodes: dict[str, Any] = {}
        self._queued: dict[str, Any] = {}
        self._reservations: dict[str, Any] = {}
        self.requests: list[Any] = []
        for tpu in fleet.slices:
            node = _Node(
                name=f"projects/{project}/locations/{tpu.zone}/nodes/{tpu.name}",
                accelerator_type=tpu.accelerator_type,
                state=tpu_v2alpha1.Node.State.READY,
                health=tpu_v2alpha1.Node.Health.HEALTHY,
                runtime_version="v2-alpha-tpuv5",
            )
            node.labels.update({"cluster": tpu.cluster, "pool": tpu.pool})
            node.accelerator_config.topology = tpu.topology
            self._nodes[tpu.name] = node
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ListNodes": grpc.unary_unary_rpc_method_handler(
                    self._list_nodes,
                    request_deserializer=_ListNodesRequest.FromString,
                    response_serializer=_ListNodesResponse.SerializeToString,
                ),
                "ListQueuedResources": grpc.unary_unary_rpc_method_handler(
                    self._list_queued,
                    request_deserializer=_ListQueuedRequest.FromString,
                    response_serializer=_ListQueuedResponse.SerializeToString,
                ),
                "ListReservations": grpc.unary_unary_rpc_method_handler(
                    self._list_reservations,
                    request_deserializer=_ListReservationsRequest.FromString,
                    response_serializer=_ListReservationsResponse.SerializeToString,
                ),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    # -- state from the simulator -------------------------------------------------------------

    def record_capacity(self, event: CapacityEvent) -> None:
        with self._lock:
            if event.kind == "QUEUED_RESOURCE_STATE" and event.target and event.state:
                self._queued_state(event)
            elif event.kind == "RESERVATION_CHANGED" and event.quota is not None:
                self._reservation(event)
            elif event.target_kind == "slice" and event.target in self._nodes:
                self._node_event(self._nodes[event.target], event)

    def _node_event(self, node: Any, event: CapacityEvent) -> None:
        if event.kind in ("MAINTENANCE_SCHEDULED", "MAINTENANCE_STARTED") and event.window:
            upcoming = node.upcoming_maintenance
            upcoming.type_ = _Type.SCHEDULED  # the proto itself names the field type_
            upcoming.can_reschedule = True
            upcoming.window_start_time = rfc3339(event.window.start)
            upcoming.window_end_time = rfc3339(event.window.end)
            upcoming.latest_window_start_time = rfc3339(event.window.start)
            upcoming.maintenance_status = (
                _Status.ONGOING if event.kind == "MAINTENANCE_STARTED" else _Status.PENDING
            )
        elif event.kind == "MAINTENANCE_DONE":
            node.ClearField("upcoming_maintenance")
        elif event.kind == "PREEMPTION":
            node.state = tpu_v2alpha1.Node.State.PREEMPTED

    def _reservation(self, event: CapacityEvent) -> None:
        assert event.quota is not None
        kind = event.accelerator_type or ""
        if kind.startswith("nvidia-"):
            return  # GPU reservations are Compute Engine's
        short = event.quota.metric.rsplit("/", 1)[-1]
        name = f"projects/{self.project}/locations/{event.zone}/reservations/{short}"
        if event.state == "DELETED":
            self._reservations.pop(name, None)
            return
        reservation = _Reservation(name=name, state=tpu_v2alpha1.Reservation.State.ACTIVE)
        reservation.standard.size = int(event.quota.limit)
        reservation.standard.capacity_units = tpu_v2alpha1.Reservation.Standard.CapacityUnits.CHIPS
        reservation.standard.resource_type = kind
        reservation.standard.usage.total = int(event.quota.usage)
        self._reservations[name] = reservation

    def _queued_state(self, event: CapacityEvent) -> None:
        name = f"projects/{self.project}/locations/{event.zone}/queuedResources/{event.target}"
        queued = self._queued.get(name)
        if queued is None:
            queued = self._queued[name] = _Queued(name=name)
            spec = queued.tpu.node_spec.add()
            spec.parent = f"projects/{self.project}/locations/{event.zone}"
            spec.node_id = event.target or ""
            spec.node.accelerator_type = event.accelerator_type or ""
            queued.create_time.FromMilliseconds(event.ts)
        queued.state.Clear()
        queued.state.state = getattr(_State, event.state or "STATE_UNSPECIFIED")
        queued.state.state_initiator = tpu_v2alpha1.QueuedResourceState.StateInitiator.SERVICE
        if event.state == "FAILED":
            queued.state.failed_data.error.code = RESOURCE_EXHAUSTED
            queued.state.failed_data.error.message = (
                f"There is no more capacity in the zone \"{event.zone}\"; you can try in "
                "another zone where Cloud TPU Nodes are offered"
            )

    # -- serving ------------------------------------------------------------------------------

    def _list_nodes(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            items = [self._copy(_Node, n) for n in self._nodes.values()]
        return self._page(request, context, items, _ListNodesResponse, "nodes")

    def _list_queued(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            items = [self._copy(_Queued, q) for q in self._queued.values()]
        return self._page(request, context, items, _ListQueuedResponse, "queued_resources")

    def _list_reservations(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            items = [self._copy(_Reservation, r) for r in self._reservations.values()]
        return self._page(request, context, items, _ListReservationsResponse, "reservations")

    @staticmethod
    def _copy(kind: Any, message: Any) -> Any:
        out = kind()
        out.CopyFrom(message)
        return out

    def _page(
        self,
        request: Any,
        context: grpc.ServicerContext,
        items: list[Any],
        response: Any,
        field: str,
    ) -> Any:
        self.requests.append(request)
        parts = request.parent.split("/")
        if len(parts) != 4 or parts[0] != "projects" or parts[2] != "locations":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad parent {request.parent!r}")
        if parts[1] != self.project:
            context.abort(grpc.StatusCode.NOT_FOUND, f"project {parts[1]!r} not found")
        zone = parts[3]
        chosen = sorted(
            (i for i in items if zone == "-" or f"/locations/{zone}/" in i.name),
            key=lambda i: i.name,
        )
        try:
            offset = page_offset(request.page_token, request.parent, "page_token")
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        size = min(request.page_size or MAX_PAGE_SIZE, MAX_PAGE_SIZE)
        out = response()
        page = chosen[offset : offset + size]
        getattr(out, field).extend(page)
        if offset + len(page) < len(chosen):
            out.next_page_token = page_token(offset + len(page), request.parent)
        return out

    def start(self) -> TpuApiStandIn:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> TpuApiStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

