"""Every stand-in endpoint of a simulated fleet, fed from the simulator's events.

One dcgm-exporter, one kernel log (kernel/<node>/kern.log) and one metadata server per GPU
node, one libtpu runtime server per TPU host, one Cloud Monitoring server for the whole fleet
(with `cloudmon_gke`, the TPU hosts also as GKE nodes; quota metrics too), one Cloud TPU API
and one Compute Engine API (for `ingest capacity`). Endpoints exist from the start (the fleet
is known before the first event), so Prometheus and the ingest adapters can be pointed at them
before data flows. The manifests written to the output folder
say where everything is:

    prometheus-targets.json   file_sd targets, one per node, labels cluster/pool/zone
    tpu-inventory.json        tpu_worker → node/slice/pool, for `ingest cloudmon`
    endpoints.json            every address and kernel-log path, with each TPU host's identity
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.model import (
    CapacityEvent,
    Event,
    FabricSample,
    GpuSample,
    IciSample,
    NodeEvent,
    TpuSample,
    XidEvent,
)
from pipeline.sim.endpoints.cloud_monitoring import CloudMonitoringStandIn
from pipeline.sim.endpoints.compute_api import ComputeStandIn
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter
from pipeline.sim.endpoints.kernel_log import KernelLogWriter
from pipeline.sim.endpoints.metadata_server import MetadataServerStandIn
from pipeline.sim.endpoints.tpu_api import TpuApiStandIn
from pipeline.sim.endpoints.tpu_runtime import TpuRuntimeStandIn
from pipeline.sim.fleet import Fleet
from pipeline.sources.tpu_hosts import TpuHost, TpuWorker, save_inventory, worker_instance_id


def _port(base: int, index: int) -> int:
    return base + index if base else 0


class SimEndpoints:
    """The stand-ins of one fleet; `dispatch(event)` hands each event to its endpoint."""

    def __init__(
        self,
        fleet: Fleet,
        out: Path,
        *,
        host: str = "127.0.0.1",
        gpu_port_base: int = 0,
        tpu_runtime_port_base: int = 0,
        cloudmon_port: int = 0,
        cloudmon_gke: bool = False,
        tpu_api_port: int = 0,
        compute_port: int = 0,
        project: str = "fleetpulse-sim",
        timestamps: bool = True,
        boot_ms: int = 0,
    ) -> None:
        self.fleet = fleet
        self.out = out
        self.exporters = {
            node.name: DcgmExporter(host=host, port=_port(gpu_port_base, i), timestamps=timestamps)
            for i, node in enumerate(fleet.gpu_nodes)
        }
        self.kernel_logs = {
            node.name: KernelLogWriter(
                out / "kernel" / node.name / "kern.log", node.name, boot_ms=boot_ms
            )
            for node in fleet.gpu_nodes
        }
        self.tpu_hosts = {
            tpu_host.node: TpuHost(
                cluster=tpu_slice.cluster,
                node=tpu_host.node,
                pool=tpu_slice.pool,
                zone=tpu_slice.zone,
                slice=tpu_slice.name,
                accelerator_type=tpu_slice.accelerator_type,
                topology=tpu_slice.topology,
                worker_id=tpu_host.worker_id,
            )
            for tpu_slice in fleet.slices
            for tpu_host in tpu_slice.hosts
        }
        self.runtimes = {
            name: TpuRuntimeStandIn(host=host, port=_port(tpu_runtime_port_base, i))
            for i, name in enumerate(self.tpu_hosts)
        }
        self.cloudmon = CloudMonitoringStandIn(
            project=project, host=host, port=cloudmon_port, gke=cloudmon_gke
        )
        self.tpu_api = TpuApiStandIn(fleet, project=project, host=host, port=tpu_api_port)
        self.compute = ComputeStandIn(fleet, project=project, host=host, port=compute_port)
        self.metadata = {
            node.name: MetadataServerStandIn(
                name=node.name, zone=node.zone, cluster=node.cluster, pool=node.pool, host=host
            )
            for node in fleet.gpu_nodes
        }
        self.counts: dict[str, int] = {}

    def start(self) -> SimEndpoints:
        for exporter in self.exporters.values():
            exporter.start()
        for runtime in self.runtimes.values():
            runtime.start()
        self.cloudmon.start()
        self.tpu_api.start()
        self.compute.start()
        for server in self.metadata.values():
            server.start()
        self.write_manifests()
        return self

    def dispatch(self, event: Event) -> None:
        kind = type(event).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if isinstance(event, GpuSample | FabricSample) and event.node in self.exporters:
            self.exporters[event.node].update(event)
        elif isinstance(event, XidEvent) and event.node in self.kernel_logs:
            self.kernel_logs[event.node].write_xid(event)
        elif isinstance(event, TpuSample):
            self.cloudmon.record(event)
            if event.node in self.runtimes:
                self.runtimes[event.node].update_chips(event)
        elif isinstance(event, IciSample) and event.node in self.runtimes:
            self.runtimes[event.node].update_links(event)
        elif isinstance(event, CapacityEvent):  # interruptions, quota, maintenance, queues
            self.cloudmon.record_capacity(event)
            self.tpu_api.record_capacity(event)
            self.compute.record_capacity(event)
            if event.target_kind == "node" and event.target in self.metadata:
                self.metadata[event.target].record_capacity(event)
        elif isinstance(event, NodeEvent) and event.kind == "created":
            self.compute.recreated(event.target)
            if event.target in self.metadata:
                self.metadata[event.target].recreated()
        ts = getattr(event, "ts", None)
        for server in self.metadata.values():  # maintenance notices show 60 s ahead
            if server.pending and ts is not None:
                server.advance(ts)

    def rotate_kernel_logs(self) -> None:
        for writer in self.kernel_logs.values():
            writer.rotate()

    def write_manifests(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        _write_json(self.out / "prometheus-targets.json", self.prometheus_targets())
        save_inventory(self.out / "tpu-inventory.json", self.workers())
        _write_json(self.out / "endpoints.json", self.manifest())

    def prometheus_targets(self) -> list[dict[str, Any]]:
        return [
            {
                "targets": [self.exporters[node.name].address],
                "labels": {"cluster": node.cluster, "pool": node.pool, "zone": node.zone},
            }
            for node in self.fleet.gpu_nodes
        ]

    def workers(self) -> list[TpuWorker]:
        return [
            TpuWorker(
                **{field: getattr(host, field) for field in host.__struct_fields__},
                instance_id=worker_instance_id(host),
            )
            for host in self.tpu_hosts.values()
        ]

    def manifest(self) -> dict[str, Any]:
        return {
            "cloudmon": {"endpoint": self.cloudmon.address, "project": self.cloudmon.project},
            "tpu_api": {"endpoint": self.tpu_api.address, "project": self.tpu_api.project},
            "compute": {"endpoint": self.compute.address, "project": self.compute.project},
            "gpu_nodes": {
                name: {
                    "exporter": exporter.address,
                    "kernel_log": str(self.kernel_logs[name].path),
                    "metadata": self.metadata[name].address,
                }
                for name, exporter in self.exporters.items()
            },
            "tpu_hosts": {
                name: {
                    "runtime": self.runtimes[name].address,
                    **{f: getattr(host, f) for f in host.__struct_fields__},
                }
                for name, host in self.tpu_hosts.items()
            },
        }

    def close(self) -> None:
        for exporter in self.exporters.values():
            exporter.stop()
        for runtime in self.runtimes.values():
            runtime.stop()
        self.cloudmon.stop()
        self.tpu_api.stop()
        self.compute.stop()
        for server in self.metadata.values():
            server.stop()
        for writer in self.kernel_logs.values():
            writer.close()

    def __enter__(self) -> SimEndpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # Prometheus re-reads file_sd files on change: never show it half a file
