"""`fleetpulse serve-sim`: the simulated fleet behind real protocols, at wall-clock pace.

    fleetpulse serve-sim --out sim-endpoints --duration 900 --gpu-nodes 4 --tpu-slices 1
    PROMETHEUS_TARGETS=sim-endpoints/prometheus-targets.json PROMETHEUS_SCRAPE_INTERVAL=5s \
        deploy/prometheus/prometheus.sh start
    FLEETPULSE_SOURCES__PROMETHEUS_URL=http://127.0.0.1:19090 fleetpulse ingest prometheus

Serves a dcgm-exporter /metrics and a GCE metadata server per GPU node, a Cloud Monitoring
ListTimeSeries server (TPU metrics, interruptions, GPU/TPU quota), a Cloud TPU API (nodes,
queued resources; gRPC), a Compute Engine API (instances; REST), a libtpu runtime-metrics
server per TPU host, and appends XID lines to a kernel log per GPU node
(OUT/kernel/<node>/kern.log, rotated every --rotate-every seconds). For `ingest capacity`:
FLEETPULSE_CAPACITY__MONITORING_ENDPOINT / TPU_ENDPOINT / COMPUTE_ENDPOINT / METADATA_URL
from endpoints.json. The simulation starts now
(its event time is the wall clock) and runs at --speed times real time; Prometheus only
accepts sample timestamps near its own clock, so keep --speed 1 when it scrapes. OUT holds
prometheus-targets.json (file_sd), tpu-inventory.json (for `ingest cloudmon`) and
endpoints.json (every address). Flags override the [sim] section of the config.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import Settings
from pipeline.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve-sim",
        help="serve the simulated fleet as dcgm-exporter, Cloud Monitoring, libtpu, kernel logs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("sim-endpoints"), help="manifests, logs")
    parser.add_argument("--duration", type=int, metavar="S", help="simulated seconds")
    parser.add_argument("--speed", type=float, default=1.0, help="times real time (default 1)")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument("--gpu-nodes", type=int, metavar="N", help="8-GPU nodes")
    parser.add_argument("--tpu-slices", type=int, metavar="N", help="TPU slices")
    parser.add_argument("--interval", type=int, metavar="S", help="telemetry interval (s)")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="a fault TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]] (see `simulate --help`)",
    )
    parser.add_argument("--no-random-faults", action="store_true", help="only the --inject faults")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--gpu-port-base", type=int, default=0, help="first exporter port (0: any)")
    parser.add_argument(
        "--tpu-runtime-port-base", type=int, default=0, help="first libtpu port (0: any)"
    )
    parser.add_argument("--cloudmon-port", type=int, default=0, help="Cloud Monitoring port")
    parser.add_argument("--tpu-api-port", type=int, default=0, help="Cloud TPU API port")
    parser.add_argument("--compute-port", type=int, default=0, help="Compute Engine API port")
    parser.add_argument(
        "--cloudmon-gke",
        action="store_true",
        help="Cloud Monitoring also serves the TPU slices as GKE nodes (k8s_node, k8s_container, "
        "k8s_node_pool), for `ingest cloudmon` with sources.cloudmon_mode=gke",
    )
    parser.add_argument(
        "--rotate-every",
        type=float,
        default=0.0,
        metavar="S",
        help="rotate the kernel logs this often, wall-clock seconds (default: never)",
    )
    parser.add_argument(
        "--linger",
        type=float,
        default=30.0,
        metavar="S",
        help="keep serving this long after the last event (default 30)",
    )
    parser.add_argument(
        "--no-timestamps",
        action="store_true",
        help="print no sample timestamps on /metrics (as the real exporter): Prometheus stamps",
    )
    parser.set_defaults(handler=_run)


def sim_settings(args: argparse.Namespace, settings: Settings, now_ms: int) -> Any:
    overrides = {
        "duration_s": args.duration,
        "seed": args.seed,
        "gpu_nodes": args.gpu_nodes,
        "tpu_slices": args.tpu_slices,
        "gpu_interval_s": args.interval,
        "tpu_interval_s": args.interval,
        "ici_interval_s": args.interval,
    }
    chosen = {key: value for key, value in overrides.items() if value is not None}
    if args.no_random_faults:
        chosen["random_faults"] = False
    return msgspec.structs.replace(settings.sim, start_ms=now_ms - now_ms % 1000, **chosen)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.endpoints.fleet import SimEndpoints
    from pipeline.sim.engine import Simulation
    from pipeline.sim.faults import parse_forced

    if args.speed <= 0:
        raise SystemExit("fleetpulse serve-sim: --speed must be positive")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sim_config = sim_settings(args, settings, int(time.time() * 1000))
    try:  # a bad --inject is the same clear error as in `simulate` and `demo`
        sim = Simulation(sim_config, [parse_forced(spec) for spec in args.inject])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    with SimEndpoints(
        sim.fleet,
        args.out,
        host=args.host,
        gpu_port_base=args.gpu_port_base,
        tpu_runtime_port_base=args.tpu_runtime_port_base,
        cloudmon_port=args.cloudmon_port,
        cloudmon_gke=args.cloudmon_gke,
        tpu_api_port=args.tpu_api_port,
        compute_port=args.compute_port,
        project=settings.sources.cloudmon_project,
        timestamps=not args.no_timestamps,
        boot_ms=sim.start_ms - 600_000,
    ) as endpoints:
        print(
            f"serving {len(endpoints.exporters)} GPU nodes, {len(endpoints.runtimes)} TPU hosts, "
            f"Cloud Monitoring at {endpoints.cloudmon.address}, TPU API at "
            f"{endpoints.tpu_api.address}, Compute at {endpoints.compute.address}; "
            f"manifests in {args.out}",
            flush=True,
        )
        replay(sim, endpoints, speed=args.speed, stop=stop, rotate_every_s=args.rotate_every)
        stop.wait(args.linger)
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(endpoints.counts.items()))
        print(f"served {counts}", flush=True)
    return 0


def replay(
    sim: Any, endpoints: Any, *, speed: float, stop: threading.Event, rotate_every_s: float = 0.0
) -> None:
    """Hand each tick's events to the endpoints when the wall clock reaches their time."""
    wall_start = time.time()
    next_rotation = wall_start + rotate_every_s if rotate_every_s > 0 else float("inf")
    for tick in sim.ticks():
        if not tick:
            continue
        due = wall_start + (tick[0].ts - sim.start_ms) / 1000 / speed
        if stop.wait(max(0.0, due - time.time())):
            return
        for event in tick:
            endpoints.dispatch(event)
        if time.time() >= next_rotation:
            endpoints.rotate_kernel_logs()
            next_rotation += rotate_every_s
