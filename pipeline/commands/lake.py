"""`fleetpulse lake compact|status`: maintain the lake (local Parquet, or Iceberg tables when
lake.uri is set: docs/lake-iceberg.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.config import Settings
from pipeline.lake.tables import TABLES


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
        "lake.stale_tmp_s (left by a crash). Unreadable (damaged) committed files are moved to "
        "<lake>/_quarantine/<same path>, where no reader looks.",
    )
    compact.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    compact.add_argument("--table", action="append", choices=sorted(TABLES),
                         help="only this table (repeatable; default: all)")
    compact.add_argument("--verify", action="store_true",
                         help="read every file in full first, to find damaged data pages too")
    compact.set_defaults(handler=_compact)
    status = actions.add_parser(
        "status", help="files and rows per table; unreadable and quarantined files")
    status.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    status.add_argument("--verify", action="store_true",
                        help="read every file in full, to find damaged data pages too")
    status.set_defaults(handler=_status)


def _compact(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.lake.check import QUARANTINE_DIR
    from pipeline.lake.compact import compact

    if settings.lake.uri:
        return _compact_iceberg(args, settings)
    root = Path(args.lake or settings.lake.path)
    report = compact(root, settings.lake, args.table, verify=args.verify)
    for moved in report.quarantined:
        print(f"quarantined {moved.path.relative_to(root)} (moved under {QUARANTINE_DIR}/): "
              f"{moved.reason}", file=sys.stderr)
    print(f"{report.directories} partitions: merged {report.files_merged} files into "
          f"{report.files_written} ({report.rows} rows); removed {report.tmp_removed} stale "
          f"temporary files; quarantined {len(report.quarantined)} unreadable files")
    return 0


def _compact_iceberg(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import UTC, datetime

    from pipeline.lake import iceberg_ops

    report = iceberg_ops.compact(settings.lake, args.table, now=datetime.now(UTC),
                             verify=args.verify)
    print(f"{report.partitions} day partitions: merged {report.files_merged} files into "
          f"{report.files_written} ({report.rows} rows); expired {report.snapshots_expired} "
          f"snapshots older than {settings.lake.snapshot_keep_s} s; {report.conflicts} "
          f"commits lost to writers and retried; {report.cache_files_removed} files no "
          "snapshot lists removed from the readers' cache")
    print(f"dropped {report.files_dropped} data files past lake.retention_days; rolled up "
          f"{report.rollup_days} days of utilization by hour ({report.rollup_rows} rows); "
          f"quarantined {len(report.quarantined)} unreadable files")
    for key, reason in report.quarantined:
        print(f"quarantined s3://{key}: {reason}")
    return 0


def _status_iceberg(settings: Settings) -> int:
    from pipeline.lake import iceberg_ops

    print(f"Iceberg tables in {settings.lake.namespace} at {settings.lake.uri}")
    print(f"{'table':18} {'snapshots':>9} {'files':>7} {'rows':>12} {'bytes':>13}  days")
    for table in iceberg_ops.status(settings.lake):
        days = f"{table.oldest_day} .. {table.newest_day}" if table.oldest_day else "-"
        print(f"{table.name:18} {table.snapshots:9} {table.files:7} {table.rows:12} "
              f"{table.bytes:13}  {days}")
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    if settings.lake.uri:
        return _status_iceberg(settings)
    import pyarrow.parquet as pq

    from pipeline.lake.check import QUARANTINE_DIR, quarantined_files, readable_files
    from pipeline.lake.query import require_lake

    root = require_lake(args.lake or settings.lake.path, settings.lake)
    unreadable = []
    for name in TABLES:
        files, broken = readable_files(root, name, deep=args.verify)
        rows = sum(pq.read_metadata(path).num_rows for path in files)
        extra = f" {len(broken):6} unreadable" if broken else ""
        print(f"{name:12} {len(files):6} files {rows:12} rows{extra}")
        unreadable += broken
    if unreadable:
        command = "fleetpulse lake compact" + (" --verify" if args.verify else "")
        print(f"\nunreadable, skipped by readers ({len(unreadable)}; `{command}` quarantines "
              "them once committed):")
        for bad in unreadable:
            print(f"  {bad.path.relative_to(root)}: {bad.reason}")
    quarantined = quarantined_files(root)
    if quarantined:
        print(f"\nquarantined under {root / QUARANTINE_DIR} ({len(quarantined)}):")
        for path in quarantined:
            print(f"  {path.relative_to(root / QUARANTINE_DIR)} ({path.stat().st_size} bytes)")
    return 0
