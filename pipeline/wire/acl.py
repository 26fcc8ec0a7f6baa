"""Who may write and read which topic: one Kafka principal per component (issue 33).

The one table of what each FleetPulse component writes, reads and joins on the wire. From it,
`grants()` makes the Kafka ACLs (deploy/kafka/secure_acls.py applies exactly these to the
local secure broker; the Helm chart gives each component its own principal) and `markdown()`
writes the ACL advice of deploy/kafka/README.md (`python -m pipeline.wire.acl --write` puts it
between the README's markers; a test checks both against the table and the live broker).

What it protects: a stolen or misused credential does no more than its component. Only the
worker writes `fleet.actions` and the stage topics; an XID reader (root on every GPU node)
writes XID events and nothing else but its dead letters; only people (`operator`) release a
common-cause pause; only the watcher, the capacity adapter and `inventory load` say who is in
the fleet; only the watcher and the actuator speak for nodes on `fleet.events.node`.

Topics are named by suffix after `kafka.topic_prefix` (pipeline/wire/topics.py); the
worker group's internal topics and changelogs are `<prefix>-worker-*` (the default
`worker.group_id`). Every operation that reads or writes a topic or group also lets the
principal describe it (Kafka's implied DESCRIBE), which is all the clients' metadata needs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import KafkaSettings
from pipeline.wire.group_topics import group_name

TELEMETRY = ("telemetry.gpu", "telemetry.tpu", "telemetry.ici", "telemetry.fabric")
DLQ = "dlq"
# The worker's inputs (streams/worker.py INPUTS) and outputs (pipeline/stages/topology.py).
WORKER_READS = (*TELEMETRY, "events.xid", "findings", "events.node", "actions",
                "events.capacity", "inventory", "events.policy")  # fmt: skip
WORKER_WRITES = ("findings", "proposals", "actions", "node-state", "alerts", "withheld",
                 "utilization", "capacity", "capacity.advice", DLQ)  # fmt: skip
# The lake sink's tables (pipeline/lake/tables.py).
LAKE_READS = ("utilization", "findings", "actions", "node-state", "alerts", "withheld",
              "events.capacity", "events.xid", "capacity")  # fmt: skip
WORKER_GROUP = "<worker group>"  # group_name(): "<prefix>-worker" unless worker.group_id says


@dataclass(frozen=True)
class Role:
    """One component's principal: the topics (suffixes) it writes and reads, its group."""

    name: str  # the principal is User:fleetpulse-<name>
    runs: str  # what runs as it, for people
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    group: str = ""  # consumer group; a trailing "-" is a prefix (one group per cluster)
    worker_topics: bool = False  # creates, reads and writes the worker group's own topics
    creates: bool = False  # creates FleetPulse's topics (and the worker group's)
    checks: tuple[str, ...] = ()  # reads these topics' configs before writing (require_topic)

    @property
    def principal(self) -> str:
        return f"fleetpulse-{self.name}"


ROLES: tuple[Role, ...] = (
    Role("worker", "`fleetpulse worker` (the faust app)", WORKER_WRITES, WORKER_READS,
         group=WORKER_GROUP, worker_topics=True),
    Role("ingest-prometheus", "`ingest prometheus` (DCGM, node_exporter ports)",
         ("telemetry.gpu", "telemetry.fabric", DLQ)),
    # Cloud Monitoring's interruption counts are capacity events (preemptions, maintenance of
    # TPU slices): without them the adapter's batches would be refused whole.
    Role("ingest-cloudmon", "`ingest cloudmon` (TPU chip metrics, interruptions)",
         ("telemetry.tpu", "events.capacity", DLQ)),
    Role("ingest-tpu-runtime", "`ingest tpu-runtime` (libtpu on a TPU host)",
         ("telemetry.tpu", "telemetry.ici", DLQ)),
    Role("ingest-xid", "`ingest xid` (the XID DaemonSet, root on every GPU node)",
         ("events.xid", DLQ)),
    Role("ingest-capacity", "`ingest capacity` (quota, stock-outs, maintenance; cloud inventory)",
         ("events.capacity", "inventory", DLQ)),
    Role("lake", "`sink lake`", (DLQ,), LAKE_READS, group="fleetpulse-lake"),
    Role("alerts", "`alerts` (Alertmanager, webhooks)", (DLQ,), ("alerts",),
         group="fleetpulse-alerts"),
    Role("actuator", "`actuate kubernetes` (and any actuator of fleet.actions)",
         ("events.node", DLQ), ("actions",), group="fleetpulse-actuator-"),
    # node-state: the tombstone of a deleted node, so the compacted topic forgets it
    Role("watcher", "`watch kubernetes`", ("events.node", "inventory", "node-state")),
    # Slurm's pair: the Kubernetes pair's rights under principals of their own, so a Slurm
    # controller's credentials are not a Kubernetes cluster's (and can be revoked alone)
    Role("slurm-actuator", "`actuate slurm`", ("events.node", DLQ), ("actions",),
         group="fleetpulse-actuator-"),
    Role("slurm-watcher", "`watch slurm`", ("events.node", "inventory", "node-state")),
    Role("inventory", "`inventory load` (a person or a CMDB export)", ("inventory",),
         checks=("inventory",)),
    Role("operator", "`policy release` (a person)", ("events.policy",),
         checks=("events.policy",)),
    Role("topics", "`topics create` (the chart's pre-install Job)", creates=True),
)
BY_NAME = {role.name: role for role in ROLES}


@dataclass(frozen=True, order=True)
class Grant:
    """One ALLOW ACL: `principal` may `operation` on the `resource` named `name`."""

    principal: str  # "User:fleetpulse-worker"
    operation: str  # Kafka's operation names: READ, WRITE, CREATE, DESCRIBE_CONFIGS
    resource: str  # TOPIC or GROUP
    name: str
    prefixed: bool = False  # a PREFIXED pattern (name is a prefix), else LITERAL


def _topic(kafka: KafkaSettings, suffix: str) -> str:
    return f"{kafka.topic_prefix}.{suffix}"


def role_grants(role: Role, kafka: KafkaSettings) -> list[Grant]:
    """The ACLs of one role for one topic prefix (kafka.topic_prefix) and the default group."""
    user = f"User:{role.principal}"
    worker = group_name(kafka)
    out = [Grant(user, "WRITE", "TOPIC", _topic(kafka, s)) for s in role.writes]
    out += [Grant(user, "READ", "TOPIC", _topic(kafka, s)) for s in role.reads]
    out += [Grant(user, "DESCRIBE_CONFIGS", "TOPIC", _topic(kafka, s)) for s in role.checks]
    if role.group:
        group = worker if role.group == WORKER_GROUP else role.group
        out.append(Grant(user, "READ", "GROUP", group, prefixed=group.endswith("-")))
    if role.worker_topics:
        out += [Grant(user, op, "TOPIC", f"{worker}-", prefixed=True)
                for op in ("CREATE", "READ", "WRITE")]  # fmt: skip
    if role.creates:
        for prefix in (f"{kafka.topic_prefix}.", f"{worker}-"):
            out += [Grant(user, op, "TOPIC", prefix, prefixed=True)
                    for op in ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS")]  # fmt: skip
    return out


def grants(kafka: KafkaSettings, roles: tuple[Role, ...] = ROLES) -> list[Grant]:
    return sorted(g for role in roles for g in role_grants(role, kafka))


def may_write(role: Role, kafka: KafkaSettings, topic: str) -> bool:
    """Whether the role's grants let it produce to `topic` (a full name)."""
    return any(
        g.resource == "TOPIC" and g.operation == "WRITE"
        and (topic == g.name or (g.prefixed and topic.startswith(g.name)))
        for g in role_grants(role, kafka)
    )


def _names(suffixes: tuple[str, ...]) -> str:
    return ", ".join(f"`{s}`" for s in suffixes) or "—"


def markdown() -> str:
    """The README's table: per principal, what runs as it and what it may do."""
    lines = [
        "| principal | runs | writes (`fleet.`…) | reads (`fleet.`…) | group | also |",
        "|---|---|---|---|---|---|",
    ]
    for role in ROLES:
        group = "—"
        if role.group == WORKER_GROUP:
            group = "`fleet-worker` (the worker's app id)"
        elif role.group:
            group = f"`{role.group}*` (prefixed)" if role.group.endswith("-") else (
                f"`{role.group}`")
        also = []
        if role.worker_topics:
            also.append("create, read, write `fleet-worker-*` (its internal topics, changelogs)")
        if role.creates:
            also.append("create, describe, describe configs `fleet.*` and `fleet-worker-*`")
        if role.checks:
            also.append(f"describe configs {_names(role.checks)}")
        lines.append(f"| `{role.principal}` | {role.runs} | {_names(role.writes)} | "
                     f"{_names(role.reads)} | {group} | {'; '.join(also) or '—'} |")
    return "\n".join(lines)


README = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "README.md"
MARKER = "kafka-acls"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"put the table between the {MARKER} markers of {README.name}")
    parser.add_argument("--principals", action="store_true",
                        help="print the principals' user names, one a line (kafka.sh)")
    args = parser.parse_args(argv)
    if args.principals:
        print("\n".join(role.principal for role in ROLES))
    elif args.write:
        from pipeline.docs_markers import rewrite_section

        changed = rewrite_section(README, MARKER, markdown())
        print(f"{README}: {'rewritten' if changed else 'unchanged'}")
    else:
        print(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
