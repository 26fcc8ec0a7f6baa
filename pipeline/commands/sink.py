"""`fleetpulse sink lake`: consume the output topics into the Parquet lake."""

from __future__ import annotations

import argparse
import logging

from pipeline.cli_parser import DeprecatedAlias
from pipeline.config import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sink", help="run an output sink", description=__doc__)
    sinks = parser.add_subparsers(dest="sink", metavar="SINK", required=True)
    lake = sinks.add_parser(
        "lake",
        help="Kafka → Parquet lake (utilization, findings, actions, node state, alerts, "
        "capacity, XID)",
        description="Consume utilization, findings, actions, node-state changes, alerts, "
        "capacity and XID topics into Parquet files under <lake>/<table>/date=…/hour=…/. "
        "Offsets are committed only after the files are renamed into place; a restart after a "
        "crash replays and overwrites, never duplicates. Run several for more partitions: they "
        "share the consumer group lake.group_id. SIGTERM flushes and commits, then exits.",
    )
    lake.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    # --to was this command's name for what every other command calls --lake.
    lake.add_argument("--to", dest="lake", action=DeprecatedAlias, use="--lake")
    lake.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                      help="flush, commit and exit after SECONDS without a record")
    lake.set_defaults(handler=_lake)


def _lake(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.lake.sink import run_until_signalled  # Kafka client only when needed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    root = args.lake or settings.lake.path
    edge, lake = run_until_signalled(settings, root, args.exit_when_idle)
    print(f"lake sink: {edge.records} records, {lake.rows} rows in {lake.files} files, "
          f"{edge.dead_lettered} dead letters, {lake.tombstones} tombstones skipped, "
          f"{edge.commits} commits → {root}")
    return 0
