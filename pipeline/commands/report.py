"""`fleetpulse report`: write one self-contained HTML report about the fleet."""

from __future__ import annotations

import argparse
import sys

from pipeline.config import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write an HTML fleet report (utilization, health, XIDs, capacity, cost of idle)",
        description="Write one self-contained HTML file (no network needed to view it) with "
        "charts of fleet utilization per pool, health changes and actions, XIDs by node and "
        "time, capacity headroom and cost of idle; tables of top offenders, open actions, TPU "
        "slice availability and degraded ICI links, cost per useful accelerator-hour, MTBF "
        "per pool and quota headroom; and a section per node or slice those tables link to, over "
        "--since/--until (default: the last 24 h of data in the lake).",
    )
    parser.add_argument("--out", "-o", default="report.html", help="file to write")
    parser.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    parser.add_argument("--since", help="start: a duration before --until (24h, 7d) or a time")
    parser.add_argument("--until", help="end: a time (UTC if no zone) or 'now'")
    parser.add_argument("--pool", help="only this pool")
    parser.set_defaults(handler=_report, bucket=None)


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.commands.sql import fetch_window, window_params
    from pipeline.lake.query import Lake, require_lake
    from pipeline.report.html import build_report

    root = require_lake(args.lake or settings.lake.path, settings.lake)
    window, fetch = fetch_window(args)  # --since and --until: Iceberg fetches those days
    with Lake(root, settings.lake, fetch_range=fetch) as lake:
        window = window or window_params(args, lake)
        html = build_report(lake, window["since"], window["until"], args.pool,
                            settings.capacity)
        skipped = len(lake.skipped)
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(html)
    note = f"; {skipped} unreadable lake files skipped" if skipped else ""
    print(f"wrote {args.out} ({len(html) // 1024} KiB{note})", file=sys.stderr)
    return 0
