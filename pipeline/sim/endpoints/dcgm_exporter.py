"""A dcgm-exporter stand-in: the latest simulated GpuSample as Prometheus text on /metrics.

The text is what dcgm-exporter 4.x (released, `Hostname` label) prints (reference/data-shapes.md
§1): metric name = DCGM field name, `# HELP`/`# TYPE` from the field catalog, labels
`gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname,
DCGM_FI_DRIVER_VERSION` (no pci_bus_id when the reading has none, as before 2024) and, for a GPU
that runs a job, the pod attributes `container, namespace, pod` (pod = the job name). Integers
print as integers and other values with Go's `%f`, as the exporter does.

The same endpoint also serves the node's network ports as node_exporter's infiniband and
netdev collectors print them (`node_infiniband_*{device, port}`, `node_network_*{device}`),
from the latest FabricSample, with a `node` label (what a Kubernetes scrape config relabels
`__meta_kubernetes_pod_node_name` to), and the training jobs' own per-rank step compute time
(`job_step_compute_seconds{node, gpu, pod}`, where a reading carries one): one target per node
stands in for all three exporters.

One deliberate difference: each sample carries an explicit timestamp (the simulated event time,
ms) unless `timestamps=False`. The real exporter prints none and Prometheus stamps the scrape
time; with the stamp the pipeline sees the simulator's event time and the ground truth lines
up. Prometheus only accepts stamps near its own clock, so a simulator behind this endpoint
runs at wall-clock pace.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from pipeline.catalog import dcgm_field
from pipeline.model import FabricSample, GpuReading, GpuSample
from pipeline.sim.endpoints.stand_in import HttpStandIn

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_GENERIC_HELP = "DCGM field (not in the FleetPulse catalog)."


def render_exposition(
    samples: Iterable[GpuSample], *, timestamps: bool = True, hostname_label: str = "Hostname"
) -> str:
    """Prometheus text for the given node samples, grouped by metric as the exporter does."""
    series: dict[str, list[str]] = {}
    for sample in samples:
        for gpu in sample.gpus:
            labels = _labels(sample, gpu, hostname_label)
            stamp = f" {sample.ts}" if timestamps else ""
            for name, value in gpu.metrics.items():
                if not math.isfinite(value):
                    continue  # HEAD dcgm-exporter skips blank values rather than print them
                series.setdefault(name, []).append(f"{name}{{{labels}}} {_value(value)}{stamp}")
    lines: list[str] = []
    for name in sorted(series, key=_catalog_order):
        help_text, kind = _help_and_type(name)
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(series[name])
    return "\n".join(lines) + "\n" if lines else ""


STEP_METRIC = "job_step_compute_seconds"


def render_job_steps(samples: Iterable[GpuSample], *, timestamps: bool = True) -> str:
    """The training jobs' own per-rank gauge (sources/prometheus_step.py): one series per GPU
    whose reading carries a step compute time, labelled node, gpu and the job's pod."""
    lines: list[str] = []
    for sample in samples:
        stamp = f" {sample.ts}" if timestamps else ""
        for gpu in sample.gpus:
            if gpu.step_compute_s is None or gpu.mig_instance is not None:
                continue
            pairs = [("gpu", str(gpu.index)), ("namespace", "default"), ("node", sample.node),
                     ("pod", gpu.job or "")]  # fmt: skip
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)
            lines.append(f"{STEP_METRIC}{{{labels}}} {_value(gpu.step_compute_s)}{stamp}")
    if not lines:
        return ""
    head = [
        f"# HELP {STEP_METRIC} Seconds the rank's last training step computed (no waits).",
        f"# TYPE {STEP_METRIC} gauge",
    ]
    return "\n".join([*head, *lines]) + "\n"


def render_node_exporter(samples: Iterable[FabricSample], *, timestamps: bool = True) -> str:
    """node_exporter's text for the ports of the given nodes (infiniband and netdev series)."""
    series: dict[str, list[str]] = {}
    for sample in samples:
        stamp = f" {sample.ts}" if timestamps else ""
        for port in sample.ports:
            for name, value in port.metrics.items():
                if name.startswith("node_infiniband_"):
                    pairs = [("device", port.device), ("port", str(port.port))]
                else:
                    pairs = [("device", port.netdev or port.device)]
                pairs.append(("node", sample.node))
                labels = ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)
                series.setdefault(name, []).append(f"{name}{{{labels}}} {_value(value)}{stamp}")
    lines: list[str] = []
    for name in sorted(series):
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} node_exporter {name}.", f"# TYPE {name} {kind}", *series[name]]
    return "\n".join(lines) + "\n" if lines else ""


def _labels(sample: GpuSample, gpu: GpuReading, hostname_label: str) -> str:
    pairs = [("gpu", str(gpu.index)), ("UUID", gpu.uuid)]
    if gpu.pci_bus_id is not None:  # exporters before 2024 print no pci_bus_id
        pairs.append(("pci_bus_id", gpu.pci_bus_id))
    pairs += [("device", f"nvidia{gpu.index}"), ("modelName", gpu.model)]
    if gpu.mig_instance is not None:
        pairs += [("GPU_I_PROFILE", gpu.mig_profile or ""), ("GPU_I_ID", str(gpu.mig_instance))]
    pairs += [(hostname_label, sample.node), ("DCGM_FI_DRIVER_VERSION", sample.driver)]
    if gpu.job is not None:
        pairs += [("container", "main"), ("namespace", "default"), ("pod", gpu.job)]
    return ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return f"{value:f}"


def _help_and_type(name: str) -> tuple[str, str]:
    field = dcgm_field(name)
    if field is None:
        return _GENERIC_HELP, "gauge"
    return field.description, "counter" if field.kind == "counter" else "gauge"


def _catalog_order(name: str) -> tuple[int, str]:
    field = dcgm_field(name)
    return (field.field_id if field else 1_000_000, name)


class DcgmExporter(HttpStandIn):
    """An HTTP /metrics endpoint serving the latest sample of each node it was given.

    One instance per node is what a real fleet looks like (a DaemonSet pod per node, one
    Prometheus target each); an instance may also hold several nodes, told apart by the
    `Hostname` label, which is how a per-group target looks.
    """

    thread_name = "dcgm-exporter"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timestamps: bool = True,
        hostname_label: str = "Hostname",
    ) -> None:
        self.timestamps = timestamps
        self.hostname_label = hostname_label
        self._latest: dict[str, GpuSample] = {}
        self._ports: dict[str, FabricSample] = {}
        self._lock = threading.Lock()
        self._listen(host, port, _handler_for(self))
        # Counted at the start and the end of each /metrics request, so a caller can tell that
        # a scrape began after an update and has been answered.
        self.scrapes_started = 0
        self.scrapes_served = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def update(self, sample: GpuSample | FabricSample) -> None:
        with self._lock:
            if isinstance(sample, FabricSample):
                self._ports[sample.node] = sample
            else:
                self._latest[sample.node] = sample

    def latest(self) -> list[GpuSample]:
        with self._lock:
            return list(self._latest.values())

    def render(self) -> str:
        with self._lock:
            ports = list(self._ports.values())
        latest, stamped = self.latest(), self.timestamps
        return (
            render_exposition(latest, timestamps=stamped, hostname_label=self.hostname_label)
            + render_node_exporter(ports, timestamps=stamped)
            + render_job_steps(latest, timestamps=stamped)
        )



def _handler_for(exporter: DcgmExporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            exporter.scrapes_started += 1
            body = exporter.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            exporter.scrapes_served += 1

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape would drown the simulator's output

    return Handler
