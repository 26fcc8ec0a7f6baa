"""`fleetpulse inventory load FILE`: the fleet's owner says which nodes and slices exist.

    fleetpulse inventory load fleet-inventory.jsonl
    fleetpulse inventory load out/sim/inventory.jsonl --dry-run

The file holds one inventory/1 value per node or slice, as JSON lines or one JSON array (what
`fleetpulse simulate` writes as OUT/inventory.jsonl). Every value is checked first; a file with
a bad value sends nothing and names every bad line, field, what was expected and what arrived.
Good files go to the compacted fleet.inventory topic, keyed cluster/name, acks=all, so the
latest record of each node or slice is what the worker believes. With [inventory] enforce,
budgets count these members and a target missing from the inventory is never removed.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from pipeline.config import Settings
from pipeline.sources.inventory_file import load_inventory


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inventory",
        help="load the fleet inventory (which nodes and slices exist, in which pool and zone)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="inventory_command", metavar="ACTION", required=True)
    load = actions.add_parser(
        "load",
        help="check an inventory file and send it to fleet.inventory",
        description="Check every inventory/1 value of FILE (JSON lines or a JSON array), then "
        "send them to the compacted fleet.inventory topic keyed cluster/name and print counts. "
        "Nothing is sent when any value is bad.",
    )
    load.add_argument("file", type=Path, metavar="FILE", help="inventory file")
    load.add_argument(
        "--dry-run", action="store_true", help="check the file and print counts; send nothing"
    )
    load.set_defaults(handler=_load)


def _load(args: argparse.Namespace, settings: Settings) -> int:
    # dated by whoever wrote the file: one ahead of now is refused here, as the worker would
    not_after = int(time.time() * 1000) + settings.clock.max_ahead_s * 1000
    records = load_inventory(args.file, not_after_ms=not_after)
    kinds = Counter(record.kind for record in records)
    clusters = len({record.cluster for record in records})
    pools = len({(record.cluster, record.pool) for record in records})
    shape = (
        f"{len(records)} records ({kinds['node']} nodes, {kinds['slice']} slices) in "
        f"{clusters} cluster(s), {pools} pool(s)"
    )
    if args.dry_run:
        print(f"{args.file}: {shape}; dry run, nothing sent")
        return 0
    from pipeline.sources.publish import KafkaPublisher
    from pipeline.wire.admin import require_topic  # the Kafka client only to send

    topic = require_topic(settings.kafka, "inventory")
    publisher = KafkaPublisher(settings.kafka, client_id=f"{settings.kafka.client_id}-inventory")
    try:
        publisher.publish("inventory", records, [])
    finally:
        publisher.close()
    print(f"{args.file}: {shape} sent to {topic} (keyed cluster/name)")
    return 0
