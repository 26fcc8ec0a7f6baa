"""`fleetpulse demo`: a simulated fleet through the whole pipeline, in one process, no Kafka."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import msgspec
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.backtest.score import ClassScore
from pipeline.config import Settings
from pipeline.demo import DemoResult, run_demo
from pipeline.errors import ConfigError
from pipeline.sim.faults import ForcedFault, parse_forced


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="simulate a mixed GPU/TPU fleet and run the whole pipeline in-process",
        description="Simulate a mixed fleet (GPU nodes and TPU slices) with faults injected at a "
        "boosted rate, run detection, the health machine and the policy in one process (no "
        "Kafka), write the Parquet lake, the actions and an HTML report, and score what was "
        "found against the simulator's ground truth.",
    )
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="output folder")
    parser.add_argument("--gpu-nodes", type=int, default=64, help="8-GPU nodes (default 64)")
    parser.add_argument("--tpu-slices", type=int, default=4, help="TPU slices (default 4)")
    parser.add_argument("--hours", type=float, default=2.0, help="simulated hours (default 2)")
    parser.add_argument(
        "--intensity", type=float, default=300.0, help="fault-rate multiplier (default 300)"
    )
    parser.add_argument("--seed", type=int, default=None, help="simulator seed (config: sim.seed)")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="also inject this fault: TYPE[/VARIANT]@SECONDS[:TARGET[:DEVICE]], e.g. G1@600 "
        "(repeatable; `fleetpulse simulate --list-faults` lists the types)",
    )
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    parser.add_argument(
        "--no-inventory",
        action="store_true",
        help="do not feed and enforce the simulated fleet's inventory: pools, zones and "
        "budgets come from telemetry (the behaviour before inventories)",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    console = Console()
    if not console.is_terminal:
        # A pipe or a file: never break a line (a command or a path) at an imagined width;
        # what reads it wraps as it likes. Tables still fit the default width.
        console = Console(soft_wrap=True)
    sim = msgspec.structs.replace(
        settings.sim,
        gpu_nodes=args.gpu_nodes,
        tpu_slices=args.tpu_slices,
        duration_s=int(args.hours * 3600),
        intensity=args.intensity,
        seed=settings.sim.seed if args.seed is None else args.seed,
    )
    # the demo's lake is its own local folder, whatever lake.uri says (docs/lake-iceberg.md)
    lake = msgspec.structs.replace(settings.lake, uri="")
    settings = msgspec.structs.replace(settings, sim=sim, lake=lake)
    console.print(
        f"[bold]FleetPulse demo[/]: {sim.gpu_nodes} GPU nodes ({sim.gpu_nodes * 8} GPUs) and "
        f"{sim.tpu_slices} TPU slices, {args.hours:g} simulated hours, faults ×{sim.intensity:g}, "
        f"seed {sim.seed}"
    )
    try:
        forced = [parse_forced(spec) for spec in args.inject]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.no_inventory:
        print(
            "fleetpulse demo: no inventory (--no-inventory): pools, zones and budgets come from "
            "telemetry",
            file=sys.stderr,
        )
    started = time.monotonic()
    result = _run_with_progress(settings, args.out, console, forced, not args.no_inventory)
    if not args.no_report:
        from pipeline.report.html import write_report  # DuckDB only when a report is wanted

        result.report_file = write_report(result.lake_dir, args.out / "report.html", settings.lake,
                                          capacity=settings.capacity)
    _summary(console, result, time.monotonic() - started)
    return 0


def _run_with_progress(
    settings: Settings, out: Path, console: Console, forced: list[ForcedFault], inventory: bool
) -> DemoResult:
    total_ms = settings.sim.duration_s * 1000
    columns = (
        TextColumn("simulated"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    )
    # No live bar without a terminal: rich cannot redraw it there, and what it leaves behind
    # is blank lines in the output.
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("demo", total=total_ms, clock="0:00", stats="")

        def update(elapsed_ms: int, result: DemoResult) -> None:
            minutes = elapsed_ms // 60_000
            stats = (
                f"{result.events_in:,} records · {len(result.findings):,} findings · "
                f"{len(result.actions):,} actions"
            )
            progress.update(
                task, completed=elapsed_ms, clock=f"{minutes // 60}:{minutes % 60:02d}", stats=stats
            )

        return run_demo(settings, out, update, faults=forced, inventory=inventory)


def _summary(console: Console, result: DemoResult, seconds: float) -> None:
    assert result.score is not None
    score = result.score
    console.print(
        f"\nProcessed [bold]{result.events_in:,}[/] records in {seconds:.0f} s "
        f"({result.node_days:.1f} node-days of telemetry)."
    )
    console.print(_faults_table(result))
    console.print(_actions_table(result))
    precision = "n/a" if score.precision is None else f"{score.precision:.2f}"
    console.print(
        f"Precision [bold]{precision}[/] over {score.episodes} cordon episodes · "
        f"cordons caused by confounders: [bold]{score.confounder_cordons}[/] · "
        f"unexplained cordons: [bold]{score.false_cordons}[/]"
    )
    console.print(f"\nLake:    {result.lake_dir}/  (Parquet, one folder per table)")
    console.print(f"Actions: {result.actions_file}")
    if result.report_file is not None:
        console.print(f"Report:  {result.report_file}")
    lake = result.lake_dir
    fp = _command_name()
    console.print("\nTry next:")
    # One line each, whatever the width: a command broken mid-string cannot be pasted.
    for command in (
        f"{fp} sql --lake {lake} --query top_offenders",
        f'{fp} sql --lake {lake} "select kind, count(*) from actions group by 1"',
        f"{fp} report --lake {lake} --out fleet.html",
        f"{fp} worker --help    (the same pipeline on Kafka)",
    ):
        console.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)


def _command_name() -> str:
    """`fleetpulse` if it is on PATH, else the venv's script as the user can type it."""
    if shutil.which("fleetpulse"):
        return "fleetpulse"
    script = Path(sys.executable).parent / "fleetpulse"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def _faults_table(result: DemoResult) -> Table:
    assert result.score is not None
    table = Table(title="Injected faults and what FleetPulse found", title_justify="left")
    columns = ("class", "injected", "found", "acted", "withheld", "missed", "recall",
               "median time to detect", "p95")
    for column in columns:
        table.add_column(column, justify="left" if column == "class" else "right")
    for klass, bucket in sorted(result.score.by_class.items()):
        table.add_row(klass, *_class_cells(bucket))
    confounders = sum(1 for f in result.ground_truth if f.must_not_cordon)
    table.add_row("confounders", str(confounders), *["-"] * (len(columns) - 2), style="dim")
    return table


def _class_cells(bucket: ClassScore) -> list[str]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value / 1000:.1f} s"

    recall = "-" if bucket.recall is None else f"{bucket.recall:.2f}"
    return [
        str(bucket.faults),
        str(bucket.found),
        str(bucket.acted),
        str(bucket.withheld),
        str(bucket.missed),
        recall,
        seconds(bucket.delay_quantile(0.5)),
        seconds(bucket.delay_quantile(0.95)),
    ]


def _actions_table(result: DemoResult) -> Table:
    table = Table(title="Decisions", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    kinds = sorted({a.kind for a in result.actions})
    for kind in kinds:
        live = sum(1 for a in result.actions if a.kind == kind and not a.dry_run)
        dry = sum(1 for a in result.actions if a.kind == kind and a.dry_run)
        table.add_row(f"action: {kind}", f"{live}" + (f" (+{dry} dry run)" if dry else ""))
    withheld = result.withheld()
    table.add_row("proposals withheld by the policy", str(len(withheld)))
    for name, count in sorted(result.alerts_firing.items()):
        table.add_row(f"alert fired: {name}", str(count))
    return table
