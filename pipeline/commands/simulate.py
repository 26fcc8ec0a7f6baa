"""`fleetpulse simulate`: a synthetic GPU/TPU fleet with injected faults and its ground truth.

    fleetpulse simulate --to jsonl --out run1 --duration 3600 --intensity 500
    fleetpulse simulate --to kafka --duration 600 --inject G1@120 --inject T2@300:SLICE
    fleetpulse simulate --to jsonl --out quiet --no-random-faults --inject G8/thermal@60

Outputs: `--to jsonl` writes OUT/events.jsonl (one topic value per line, event-time order),
OUT/events.truth.jsonl (one injected fault per line), OUT/fleet.json (nodes, slices, jobs,
settings) and OUT/inventory.jsonl (one inventory/1 value per node and slice: what
`fleetpulse inventory load` and `fleetpulse replay --inventory` read); `--to kafka` sends each
event to its topic (keyed by node, slice, zone or target, acks=all) and writes the ground
truth, fleet.json and inventory.jsonl to OUT if given; `--to stdout` prints the events.
Flags override the [sim] section of the config. Same settings and seed: identical output.

Fault specs for --inject: TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]], TARGET being a GPU node,
TPU slice, job, zone or driver name and DEVICE a GPU index, chip id or directed ICI link index.
Types: G1-G10, N1-N3, F1-F3, J1-J4, S1-S4, S6, H4, H5, T1-T4, C1 (see `--list-faults`; H1-H3
and S5 are properties of the fleet, drawn with it). `--intensity` multiplies the rates, but no
type fires more than `--max-rate` times per node-hour (per node-sized unit: a job counts 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import Settings, SimSettings
from pipeline.errors import ConfigError
from pipeline.sim.inventory import from_fleet
from pipeline.sources.inventory_file import FILE_NAME as INVENTORY_FILE
from pipeline.sources.inventory_file import write_inventory
from pipeline.wire import codec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run the fleet simulator (telemetry, XIDs, capacity events + ground truth)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--to",
        choices=("jsonl", "kafka", "stdout"),
        default="jsonl",
        help="where events go (default: jsonl)",
    )
    parser.add_argument("--out", type=Path, help="output folder (required for --to jsonl)")
    parser.add_argument("--duration", type=int, metavar="S", help="simulated seconds")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument(
        "--start-ms", type=_start_ms, metavar="MS",
        help="event time of the first tick, in ms since the epoch, or `now` (default: the "
        "[sim] section's, 2026-01-01T00:00Z: actions from such a run are born expired for an "
        "actuator on a real clock; use `now` with --realtime to drive one)",
    )
    parser.add_argument(
        "--realtime", action="store_true",
        help="with --to kafka or stdout: send each tick when the wall clock reaches its event "
        "time (from the start), not as fast as possible",
    )
    parser.add_argument("--gpu-nodes", type=int, metavar="N", help="8-GPU nodes")
    parser.add_argument("--tpu-slices", type=int, metavar="N", help="TPU slices")
    parser.add_argument("--clusters", type=int, metavar="N", help="clusters (one region each)")
    parser.add_argument(
        "--interval",
        type=int,
        metavar="S",
        help="sample interval of GPU, TPU and ICI telemetry (default 10)",
    )
    parser.add_argument(
        "--intensity",
        type=float,
        metavar="X",
        help="multiply fault rates (e.g. 500: a rare fault within minutes)",
    )
    parser.add_argument(
        "--noise-intensity",
        type=float,
        metavar="X",
        help="multiply the rates of noise (benign XIDs, SBE bursts)",
    )
    parser.add_argument(
        "--fleet-multiplier",
        type=float,
        metavar="M",
        help="m_fleet: scale hardware fault rates (fault model §1.1)",
    )
    parser.add_argument(
        "--max-rate",
        type=float,
        metavar="R",
        help="cap on any type's rate per node-hour (default 0.05)",
    )
    parser.add_argument(
        "--only", metavar="TYPES", help="draw only these types at random, e.g. G1,G5,T2/ici"
    )
    parser.add_argument(
        "--no-random-faults", action="store_true", help="inject only the --inject faults"
    )
    parser.add_argument("--no-diurnal", action="store_true", help="no day/night cycle")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="force a fault, e.g. G1@300 or T2/ici@60:SLICE:5 (repeatable)",
    )
    parser.add_argument(
        "--list-faults",
        action="store_true",
        help="print the fault types with their rates and labels, then exit",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_handle)


def sim_settings(args: argparse.Namespace, base: SimSettings) -> SimSettings:
    """The [sim] settings with the command-line overrides applied (and validated)."""
    overrides: dict[str, Any] = {
        "duration_s": args.duration,
        "seed": args.seed,
        "start_ms": args.start_ms,
        "gpu_nodes": args.gpu_nodes,
        "tpu_slices": args.tpu_slices,
        "clusters": args.clusters,
        "intensity": args.intensity,
        "noise_intensity": args.noise_intensity,
        "fleet_multiplier": args.fleet_multiplier,
        "max_rate_per_node_h": args.max_rate,
    }
    if args.only:
        overrides["fault_types"] = tuple(_type_name(t) for t in args.only.split(",") if t.strip())
    if args.interval is not None:
        overrides.update(
            gpu_interval_s=args.interval, tpu_interval_s=args.interval, ici_interval_s=args.interval
        )
    if args.no_random_faults:
        overrides["random_faults"] = False
    if args.no_diurnal:
        overrides["diurnal"] = False
    merged = {
        **msgspec.structs.asdict(base),
        **{k: v for k, v in overrides.items() if v is not None},
    }
    try:
        return msgspec.convert(merged, SimSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid simulator option: {str(exc).replace('$.', '')}") from None


def _start_ms(text: str) -> int:
    if text.strip().lower() == "now":
        return int(time.time() * 1000)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected milliseconds since the epoch or `now`, got {text!r}"
        ) from None


def _paced(advance: Any, step_s: float, sleep: Any = time.sleep) -> Any:
    """A progress callback that also holds each tick back until its event time has come on
    the wall clock, counted from the first tick."""
    began = time.monotonic()

    def tick_done(done: int, total: int) -> None:
        if advance is not None:
            advance(done, total)
        wait = began + done * step_s - time.monotonic()
        if wait > 0:
            sleep(wait)

    return tick_done


def _type_name(text: str) -> str:
    code, sep, variant = text.strip().partition("/")
    return f"{code.upper()}{sep}{variant.lower()}"


def _handle(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim import FAULT_TYPES, Simulation, parse_forced

    if args.list_faults:
        for ft in FAULT_TYPES:
            cordon = "must-not-cordon" if ft.must_not_cordon else ""
            print(
                f"{ft.key:16} {ft.klass:10} {ft.unit:9} {ft.rate_per_h:9.2e}/h "
                f"{ft.scale:8} {ft.expected:12} {cordon:15} {ft.title}"
            )
        return 0
    if args.to == "jsonl" and args.out is None:
        raise ConfigError("--to jsonl needs --out DIR")
    if args.to == "jsonl" and args.realtime:
        raise ConfigError(
            "--realtime paces --to kafka or --to stdout; --to jsonl is written at once"
        )
    try:
        forced = [parse_forced(spec) for spec in args.inject]
        sim = Simulation(sim_settings(args, settings.sim), forced)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    started = time.perf_counter()
    with _Progress(args.quiet or args.to == "stdout" or args.realtime, sim.n_ticks) as advance:
        if args.realtime:
            advance = _paced(advance, sim.step_s)
        count = _run(args, settings, sim, advance)
    elapsed = time.perf_counter() - started
    if args.out is not None:
        _write_manifest(args.out, sim)
    _summary(sim, count, elapsed, args)
    return 0


def _run(args: argparse.Namespace, settings: Settings, sim: Any, advance: Any) -> int:
    from pipeline.sim import produce_kafka, truth_path, write_jsonl
    from pipeline.sim.output import write_truth

    if args.to == "jsonl":
        return int(write_jsonl(sim, args.out / "events.jsonl", advance))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_truth(sim.ground_truth, truth_path(args.out / "events.jsonl"))
    if args.to == "kafka":
        return int(produce_kafka(sim, settings.kafka, advance))
    count = 0
    out = sys.stdout.buffer
    for i, tick in enumerate(sim.ticks()):
        for event in tick:
            out.write(codec.encode(event) + b"\n")
        count += len(tick)
        if advance is not None:
            out.flush()  # a paced run's reader sees each tick when it is due
            advance(i + 1, sim.n_ticks)
    out.flush()
    return count


class _Progress:
    """A rich progress bar on stderr for runs long enough to want one."""

    def __init__(self, quiet: bool, total: int) -> None:
        self.quiet = quiet or total < 50 or not sys.stderr.isatty()
        self.total = total

    def __enter__(self) -> Any:
        if self.quiet:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
        )
        self._bar.__enter__()
        task = self._bar.add_task("simulating ticks", total=self.total)
        return lambda done, total: self._bar.update(task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if not self.quiet:
            self._bar.__exit__(None, None, None)


def _write_manifest(out: Path, sim: Any) -> None:
    fleet = sim.fleet
    manifest = {
        "settings": msgspec.to_builtins(sim.settings),
        "start_ms": sim.start_ms,
        "end_ms": sim.end_ms,
        "node_days": sim.node_days,
        "gpu_nodes": [
            {
                "name": n.name,
                "cluster": n.cluster,
                "pool": n.pool,
                "zone": n.zone,
                "rack": n.rack,
                "model": n.model.name,
                "driver": n.driver,
                "uuids": list(n.uuids),
            }
            for n in fleet.gpu_nodes
        ],
        "tpu_slices": [
            {
                "name": s.name,
                "cluster": s.cluster,
                "pool": s.pool,
                "zone": s.zone,
                "accelerator_type": s.accelerator_type,
                "topology": s.topology,
                "hosts": [h.node for h in s.hosts],
            }
            for s in fleet.slices
        ],
        "jobs": [
            {
                "name": j.name,
                "kind": j.kind,
                "platform": j.platform,
                "members": [fleet.gpu_nodes[m].name for m in j.members]
                if j.platform == "gpu"
                else [fleet.slices[j.members[0]].name],
            }
            for j in sim.workload.jobs
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(manifest, indent=1) + "\n")
    write_inventory(out / INVENTORY_FILE, from_fleet(fleet, sim.start_ms))


def _summary(sim: Any, count: int, elapsed: float, args: argparse.Namespace) -> None:
    stream = sys.stderr if args.to == "stdout" else sys.stdout
    groups: Counter[str] = Counter()
    seen: set[str] = set()
    for fault in sim.ground_truth:
        if fault.group not in seen:
            seen.add(fault.group)
            groups[fault.fault_type] += 1
    simulated = (sim.end_ms - sim.start_ms) / 1000
    print(
        f"{count} events over {simulated:.0f} simulated s in {elapsed:.1f} s "
        f"({simulated / max(elapsed, 1e-9):.0f}x real time)",
        file=stream,
    )
    faults = ", ".join(f"{code} {n}" for code, n in sorted(groups.items())) or "none"
    print(f"injected: {faults}", file=stream)
    if args.out is not None:
        print(
            f"wrote {args.out}/events.jsonl, events.truth.jsonl, fleet.json, {INVENTORY_FILE}"
            if args.to == "jsonl"
            else f"wrote {args.out}/events.truth.jsonl, fleet.json, {INVENTORY_FILE}",
            file=stream,
        )
