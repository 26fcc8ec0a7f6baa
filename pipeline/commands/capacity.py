"""`fleetpulse capacity`: the current capacity per region, zone, accelerator type and how it is
bought, from the lake (a table, or capacity_snapshot/1 records as JSON), with any capacity
crunch and where the spare capacity of the same type or family is.

    fleetpulse capacity                    # the table, at the end of the newest data
    fleetpulse capacity --json             # one capacity_snapshot/1 per line
    fleetpulse capacity --until 2026-01-01T12:00 --type nvidia-h100-80gb

Figures are the capacity stage's own snapshots (fleet.capacity, the lake's capacity_snapshots
table), the latest per key, when the lake has them at that time; otherwise the same fold as the
stage's (pipeline/capacity) run over the lake's other tables (pipeline/report/capacity.py says
what those can and cannot tell it). Which of the two it used is said after the table (on
stderr with --json). Prices from the dated catalog, or [capacity] negotiated_prices; each cost
names the price it used.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import msgspec

from pipeline.capacity import crunch
from pipeline.catalog.accelerators import equivalents
from pipeline.config import Settings
from pipeline.lake.query import Lake, parse_time, require_lake
from pipeline.model import CapacitySnapshot
from pipeline.report.capacity import SNAPSHOT_COLUMNS, lake_snapshots, snapshot_row


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="current capacity per zone and accelerator type, from the lake",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    parser.add_argument("--until", help="as of this time (default: end of the newest data)")
    parser.add_argument("--type", dest="accelerator_type", help="only this accelerator type")
    parser.add_argument("--json", action="store_true",
                        help="capacity_snapshot/1 records, one JSON object a line")  # fmt: skip
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace, settings: Settings) -> int:
    root = require_lake(args.lake or settings.lake.path, settings.lake)
    with Lake(root, settings.lake) as lake:
        until = parse_time(args.until) if args.until else lake.latest()
        if until is None:
            print("fleetpulse: the lake holds no data yet", file=sys.stderr)
            return 1
        seen = lake_snapshots(lake, until, settings.capacity)
    shown = seen.snapshots
    if args.accelerator_type:
        shown = [s for s in shown if s.accelerator_type == args.accelerator_type]
    if args.json:
        for snapshot in shown:
            sys.stdout.write(msgspec.json.encode(snapshot).decode() + "\n")
        print(f"fleetpulse: capacity {seen.words()}", file=sys.stderr)
        return 0
    write_table(shown, sys.stdout)
    print(f"\nCapacity {seen.words()}.")
    for found in crunch.crunches(shown, settings.capacity, equivalents):
        notes = crunch.alert_annotations(found)
        print(f"\n{crunch.ALERTNAME} {found.scope}: {notes['description']}")
    return 0


def write_table(shown: list[CapacitySnapshot], out: TextIO) -> None:
    rows = [snapshot_row(s) for s in shown]
    titles = [title for _, title in SNAPSHOT_COLUMNS]
    keys = [key for key, _ in SNAPSHOT_COLUMNS]
    widths = [max([len(t), *(len(r[k]) for r in rows)]) for t, k in zip(titles, keys, strict=True)]
    out.write("  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip() + "\n")
    for row in rows:
        cells = (row[k].ljust(w) for k, w in zip(keys, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")
    if not rows:
        out.write("(no capacity: no device reported in the last day of data)\n")
