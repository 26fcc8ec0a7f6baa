"""`fleetpulse topics create|list`: the Kafka topics FleetPulse needs."""

from __future__ import annotations

import argparse
import sys

from pipeline.config import Settings
from pipeline.wire.topics import TOPICS, topic_configs, topic_name


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "topics", help="create or list the Kafka topics", description=__doc__
    )
    actions = parser.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="create every missing topic (idempotent)",
        description="Create every FleetPulse topic that does not exist yet, with the configured "
        "partition count, compaction for node-state and retention, and the worker group's "
        "own: its internal topics and its state tables' compacted changelogs "
        "(<group>-<table>-changelog, the group being worker.group_id). Existing topics are "
        "left as they are.",
    )
    create.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="give up when no broker answers within SECONDS")
    create.set_defaults(handler=_create)
    listing = actions.add_parser(
        "list", help="print the topics FleetPulse uses", description="Print topics, keys, configs."
    )
    listing.set_defaults(handler=_list)


def _create(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.wire.admin import create_topics  # kafka client only when needed

    # Said before the wait, so a person sees at once what it is waiting for.
    print(f"connecting to Kafka at {settings.kafka.bootstrap} (up to {args.timeout:g} s)…",
          file=sys.stderr, flush=True)
    results = create_topics(settings.kafka, bootstrap_timeout_s=args.timeout,
                            group_id=settings.worker.group_id)
    for result in results:
        status = "created" if result.created else "exists"
        note = f"  ({result.note})" if result.note else ""
        print(f"{status:8} {result.name:40} partitions={result.partitions}{note}")
    created = sum(result.created for result in results)
    print(
        f"{created} created, {len(results) - created} already present on {settings.kafka.bootstrap}"
    )
    return 0


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.wire.group_topics import group_name, group_topics  # the topology: heavy

    for spec in TOPICS:
        configs = ",".join(f"{k}={v}" for k, v in topic_configs(settings.kafka, spec).items())
        print(f"{topic_name(settings.kafka, spec.suffix):40} key={spec.key:12} {configs}")
    group = group_name(settings.kafka, settings.worker.group_id)
    for topic in group_topics(settings.kafka, group):  # the worker group's own
        configs = ",".join(f"{k}={v}" for k, v in topic.configs.items()) or "broker defaults"
        print(f"{topic.name:40} partitions={topic.partitions:<3} {configs}")
    return 0
