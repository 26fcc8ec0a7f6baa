"""`fleetpulse lake compact|status`: maintain the Parquet lake."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config import Settings
from pipeline.sinks.lake_tables import TABLES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("lake", help="compact or inspect the Parquet lake",
                                   description=__doc__)
    actions = parser.add_subparsers(dest="lake_command", metavar="ACTION", required=True)
    compact = actions.add_parser(
        "compact",
        help="merge each partition's small files (safe while the sink runs)",
        description="Merge the small files of each date/hour partition into files of up to "
        "lake.compact_rows rows, once a partition holds lake.compact_min_files of them. Only "
        "files the sink has committed are touched, so it is safe to run while the sink writes; "
        "readers never see a row twice or miss one. Also removes temporary files older than "
        "lake.stale_tmp_s (left by a crash).",
    )
    compact.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    compact.add_argument("--table", action="append", choices=sorted(TABLES),
                         help="only this table (repeatable; default: all)")
    compact.set_defaults(handler=_compact)
    status = actions.add_parser("status", help="files and rows per table")
    status.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    status.set_defaults(handler=_status)


def _compact(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks.lake_compact import compact

    report = compact(args.lake or settings.lake.path, settings.lake, args.table)
    print(f"{report.directories} partitions: merged {report.files_merged} files into "
          f"{report.files_written} ({report.rows} rows); removed {report.tmp_removed} stale "
          "temporary files")
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    import pyarrow.parquet as pq

    from pipeline.sinks.lake import visible_files

    root = Path(args.lake or settings.lake.path)
    for name in TABLES:
        files = visible_files(root, name)
        rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
        print(f"{name:12} {len(files):6} files {rows:12} rows")
    return 0
