"""The worker group's internal topics and the stages' state tables, by name.

The stages (pipeline/stages/) write and read these; the wire (group_topics.py creates them,
batches.py batches two of them) and both drivers name them. They live here, below the stages,
so the wire never imports a stage. The faust app names an internal topic `<group>-<name>` and a
table's changelog `<group>-<table>-changelog`.
"""

from __future__ import annotations

from pipeline.model import Event, NodeState

# The policy's input keyed by pool (proposals, node states, capacity events fanned out by
# zone, inventory for the guard), the zone stage's node states keyed by zone, and node events
# and targeted capacity events (drain, delete, maintenance, preemption) re-keyed by node or
# slice for the telemetry stage, so planned silence is not taken for a failure.
POLICY_INPUT = "policy-input"
ZONE_INPUT = "zone-input"
ANNOUNCE_INPUT = "announce-input"
# The fleet stage's input keyed by cluster: what it takes to see across nodes (fabric samples'
# times and port findings, their nodes' placement; peer samples of nodes running jobs).
FLEET_INPUT = "fleet-input"
# The capacity stage's input, one fleet-wide key on one partition (like the policy's):
# inventory records (a tombstone: the member left, keyed by it), utilization rows, node states
# and capacity events, each once.
CAPACITY_INPUT = "capacity-input"
CAPACITY_KEY = "fleet"
INTERNAL: dict[str, type[Event]] = {
    POLICY_INPUT: Event,
    ZONE_INPUT: NodeState,
    ANNOUNCE_INPUT: Event,
    FLEET_INPUT: Event,
    CAPACITY_INPUT: Event,
}
DEAD_LETTERS = "dlq"
# In the order that equal timestamps are processed in (the simulator's and the embedded
# runtime's: a tick's samples, then the events stamped in it).
TELEMETRY_TOPICS = (
    "telemetry.gpu",
    "telemetry.tpu",
    "telemetry.ici",
    "telemetry.fabric",
    "events.xid",
)
HEALTH_TOPICS = ("findings", "events.node", "actions")
# Membership, co-partitioned with telemetry (key cluster/name): kept with the key's state for
# the door, and passed on to the policy stage's guard. Not event-time aligned: its time is
# when the inventory was loaded, not when anything happened.
INVENTORY = "inventory"
# Why the policy held a proposal back or dropped it (withheld/1): data, nothing acts on it.
WITHHELD = "withheld"

# The stages' state tables (a changelog each; renaming one orphans a running group's state).
TELEMETRY_TABLE = "telemetry"
FLEET_TABLE = "fleet"
HEALTH_TABLE = "health"
ZONE_TABLE = "zones"
# The policy stage decides every removal in the fleet in one order: its input topic and its
# table (and so the table's changelog) have one partition.
POLICY_TABLE = "policy"
# The capacity view is fleet-wide: one key, one partition.
CAPACITY_TABLE = "capacity"
TABLES = (TELEMETRY_TABLE, FLEET_TABLE, HEALTH_TABLE, ZONE_TABLE, POLICY_TABLE, CAPACITY_TABLE)
ONE_PARTITION = frozenset({POLICY_INPUT, POLICY_TABLE, CAPACITY_INPUT, CAPACITY_TABLE})
