"""`make bench` / `python -m bench`: run every benchmark, print one table, write the results.

    python -m bench                    # full run (~15-20 min on 2 busy cores)
    python -m bench --quick            # short pass (~5 min): smaller runs, fewer repetitions
    python -m bench --only latency     # one benchmark (repeatable, or comma-separated)
    python -m bench --table            # print the table from the last results, run nothing
    python -m bench --only lake --no-readme   # leave README.md as it is

Each benchmark writes bench/results/<name>.json (quick runs: <name>-quick.json) with its
figures, settings and machine; the table is rebuilt from those files and written to
bench/results/summary.md (summary-quick.md) and, for full runs and --table, into the README's
"Latest results" between its <!-- bench:start/end --> markers, with the paragraphs of figures
(bench/prose.py) between theirs (quick runs leave the README). The Kafka parts need the
broker that `make bench` starts (deploy/with-services.sh); without one they report "skipped".
Benchmarks are not tests: nothing here passes or fails on a speed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import summary

Runner = Callable[[bool], Any]


def _throughput(quick: bool) -> Any:
    from bench import throughput

    return throughput.run(quick)


def _latency(quick: bool) -> Any:
    from bench import latency

    return latency.run(quick)


def _detection(quick: bool) -> Any:
    from bench import detection

    return detection.run(quick)


def _lake(quick: bool) -> Any:
    from bench import lake

    return lake.run(quick)


def _lake_iceberg(quick: bool) -> Any:
    from bench import lake_iceberg

    return lake_iceberg.run(quick)


def _profile(quick: bool) -> Any:
    from bench import profile

    return profile.run(quick, worker=not quick)


def _latency_take(quick: bool) -> Any:
    from bench import latency, throughput

    return latency.run(quick, take=throughput.TAKE)


def _sim(quick: bool) -> Any:
    from bench import sim

    return sim.main(["--minutes", "5", "--repeat", "2"] if quick else [])


def _remediation(quick: bool) -> Any:
    from bench import remediation

    return remediation.main(["--repeat", "2"] if quick else [])


def _scaling(quick: bool) -> Any:
    from bench import scaling

    return scaling.run(quick)


def _capacity(quick: bool) -> Any:
    from bench import capacity

    return capacity.main(["--quick"] if quick else [])


def _compression(quick: bool) -> Any:
    from bench import bench_compression

    return bench_compression.main(["--nodes", "16", "--minutes", "2"] if quick else [])


def _sizing(quick: bool) -> Any:
    """Full runs only (~1 min): a quick one would replace the measured sizes with noisier ones."""
    from bench import sizing

    return None if quick else sizing.main([])


def _prometheus(quick: bool) -> Any:
    from bench import bench_prometheus

    return bench_prometheus.main(["--gpus", "1000", "--repeat", "1"] if quick else [])


BENCHMARKS: dict[str, Runner] = {
    "throughput": _throughput,
    "latency": _latency,
    "latency-take": _latency_take,
    "detection": _detection,
    "lake": _lake,
    "lake-iceberg": _lake_iceberg,
    "profile": _profile,
    "sim": _sim,
    "remediation": _remediation,
    "scaling": _scaling,
    "capacity": _capacity,
    "compression": _compression,
    "prometheus": _prometheus,
    "sizing": _sizing,  # after scaling: docs/sizing.md's workers come from its 1-worker run
}
# write one result file whatever the mode: a quick pass would overwrite their full figures
FULL_ONLY = summary.WITHOUT_QUICK
# run only when named (--only): the worker.take variant of the latency benchmark, and the
# Prometheus adapter's poll cost (it starts its own Prometheus over generated exporters: minutes),
# and the Iceberg lake on s3proxy against the local lake (bench/lake_iceberg.py: minutes)
OPTIONAL = frozenset({"latency-take", "prometheus", "lake-iceberg"})


def chosen(only: list[str], quick: bool) -> list[str]:
    names = [n.strip() for part in only for n in part.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown}; known: {', '.join(BENCHMARKS)}")
    if names:
        return names
    return [n for n in BENCHMARKS if not (quick and n in FULL_ONLY) and n not in OPTIONAL]


def print_table(console: Console, quick: bool) -> None:
    rows, machines = summary.collect(quick)
    table = Table(title=f"FleetPulse benchmarks ({'quick' if quick else 'full'})",
                  show_lines=False)
    for column in summary.COLUMNS:
        table.add_column(column, overflow="fold")
    for r in rows:
        met = "" if r.met is None else ("[green]yes[/]" if r.met else "[red]no[/]")
        table.add_row(r.bench, r.figure, r.value, r.baseline, r.ratio, r.goal, met)
    console.print(table)
    dates = sorted({f"{m.get('date', '?')} on {m.get('cpu', '?')} ({m.get('cores', '?')} cores)"
                    for m in machines.values()})
    console.print("measured " + "; ".join(dates))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short pass: smaller, fewer runs")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only these ({', '.join(BENCHMARKS)})")
    parser.add_argument("--table", action="store_true",
                        help="print the last results only (and rewrite summary.md, README.md)")
    parser.add_argument("--no-readme", action="store_true",
                        help="do not rewrite the README's results section")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    failed: list[str] = []
    if not args.table:
        for name in chosen(args.only, args.quick):
            console.rule(f"[bold]{name}[/]")
            started = time.perf_counter()
            try:
                BENCHMARKS[name](args.quick)
            except Exception:  # one broken benchmark must not hide the others' figures
                failed.append(name)
                console.print(f"[red]{name} failed[/]\n{traceback.format_exc()}")
            console.print(f"{name}: {time.perf_counter() - started:.0f} s")
    print_table(console, args.quick)
    path = summary.write_markdown(args.quick)
    console.print(f"table written to {path}")
    if not (args.quick or args.no_readme):
        changed = summary.write_readme()
        console.print(f"{summary.README.name}: generated sections "
                      f"{'rewritten' if changed else 'unchanged'}")
        from bench import sizing_doc

        changed = sizing_doc.write()
        console.print(f"{sizing_doc.DOC.name}: generated sections "
                      f"{'rewritten' if changed else 'unchanged'}")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
