"""An example actuator: reads fleet.actions, carries each action out once, echoes the outcome on
fleet.events.node. See docs/actuators.md for the contract this follows.

    python docs/examples/actuator.py --bootstrap localhost:9092 --mode pretend
    python docs/examples/actuator.py --bootstrap localhost:9092 --mode kubectl

Standalone on purpose: it needs kafka-python and the standard library, not FleetPulse, and reads
the values as the JSON the schemas in schemas/ describe. `--mode pretend` logs the command it
would run and reports success (for trying it out); `--mode kubectl` runs kubectl for cordon,
uncordon and drain and refuses the rest (those need your provider's API: fill in `_commands`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import subprocess
import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer

log = logging.getLogger("actuator")
ACTOR = "example-actuator"
# What FleetPulse's health machine expects to hear once an action is carried out.
ECHO = {
    "cordon": "cordoned",
    "uncordon": "uncordoned",
    "drain": "drained",
    "reset_gpu": "repaired",
    "reboot": "repaired",
    "repair": "repaired",
    "repair_slice": "repaired",
    "replace": "deleted",
}
KNOWN_SCHEMAS = {"action/3"}  # versions this actuator understands; others are skipped, logged


class Done:
    """Action ids already handled, in a local SQLite file: a redelivered action (after a
    rebalance or a restart before the commit) is recognised and not carried out twice."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS done (action_id TEXT PRIMARY KEY, outcome TEXT)"
        )

    def seen(self, action_id: str) -> bool:
        row = self.db.execute("SELECT 1 FROM done WHERE action_id = ?", (action_id,)).fetchone()
        return row is not None

    def record(self, action_id: str, outcome: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO done VALUES (?, ?)", (action_id, outcome))
        self.db.commit()


def _commands(action: dict[str, Any]) -> list[list[str]]:
    """The commands that carry an action out; empty when this actuator cannot do it."""
    target = action["target"]
    if target["kind"] != "node":
        return []  # a slice is repaired through the provider's API, not kubectl
    node = target["name"]
    if action["kind"] == "cordon":
        return [["kubectl", "cordon", node]]
    if action["kind"] == "uncordon":
        return [["kubectl", "uncordon", node]]
    if action["kind"] == "drain":
        return [["kubectl", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data"]]
    if action["kind"] == "reset_gpu" and action.get("device"):
        # on the node itself (a privileged DaemonSet), GPUs idle since the drain
        return [["nvidia-smi", "-r", "-i", action["device"]]]
    return []


def carry_out(action: dict[str, Any], mode: str) -> str | None:
    """Do it; the node event kind to echo, or None if it was not done."""
    commands = _commands(action)
    if mode == "pretend":
        for command in commands:
            log.info("would run: %s", " ".join(command))
        if not commands:
            log.info("would %s %s through the provider's API", action["kind"], action["target"])
        return ECHO[action["kind"]]
    if not commands or action["kind"] not in ("cordon", "uncordon", "drain"):
        log.warning("cannot carry out %s here; left for a person", action["kind"])
        return None
    for command in commands:
        if subprocess.run(command, check=False, timeout=600).returncode != 0:
            log.error("%s failed", " ".join(command))
            return None
    return ECHO[action["kind"]]


def node_event(action: dict[str, Any], kind: str, now_ms: int) -> dict[str, Any]:
    """The echo: fleet.events.node's node_event/2, naming the action it carries out."""
    target = action["target"]
    return {
        "schema": "node_event/2",
        "ts": now_ms,
        "cluster": target["cluster"],
        "target_kind": target["kind"],
        "target": target["name"],
        "pool": target["pool"],
        "zone": target["zone"],
        "kind": kind,
        "actor": ACTOR,
        "action_id": action["action_id"],
        "reason": f"{action['kind']} carried out by {ACTOR}",
    }


def handle(value: bytes, done: Done, mode: str, now_ms: int) -> dict[str, Any] | None:
    """One record of fleet.actions: the node event to echo, or None."""
    action = json.loads(value)
    if action.get("schema") not in KNOWN_SCHEMAS:
        log.warning("skipping a value of schema %r", action.get("schema"))
        return None
    if action["target"]["kind"] not in ("node", "slice"):  # repair_switch / repair_link
        log.info("%s of %s is the network team's actuator's", action["kind"], action["target"])
        return None
    action_id = action["action_id"]
    if done.seen(action_id):
        log.info("%s already handled: skipped", action_id)
        return None
    if action["dry_run"]:
        log.info("dry run, not carried out: %s", action["reason"]["summary"])
        done.record(action_id, "dry_run")
        return None
    expires_at = action.get("expires_at")
    if expires_at is None:  # defend yourself: FleetPulse's policy always sets it (a forgery?)
        log.warning("%s has no expires_at: refused", action_id)
        done.record(action_id, "refused")
        return None
    if now_ms > expires_at:
        log.warning("%s expired %d ms ago: not started", action_id, now_ms - expires_at)
        done.record(action_id, "expired")
        return None
    kind = carry_out(action, mode)
    done.record(action_id, kind or "failed")
    return None if kind is None else node_event(action, kind, now_ms)


def main() -> int:
    parser = argparse.ArgumentParser(description="Example FleetPulse actuator")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", default="fleet", help="topic prefix (fleet.actions, ...)")
    parser.add_argument("--group", default="example-actuator", help="consumer group")
    parser.add_argument("--state", default="actuator-done.sqlite", help="handled action ids")
    parser.add_argument("--mode", choices=("pretend", "kubectl"), required=True)
    parser.add_argument("--max-records", type=int, default=0, help="stop after N (0: never)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    done = Done(args.state)
    # One consumer group: Kafka gives each target's actions (key = cluster/target) to one
    # member, in order, so a drain is never carried out before the cordon it follows.
    consumer = KafkaConsumer(
        f"{args.prefix}.actions",
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = KafkaProducer(bootstrap_servers=args.bootstrap, acks="all")
    handled = 0
    try:
        for record in consumer:
            headers = dict(record.headers or [])
            # routing without decoding: the CloudEvents type says what it is
            log.info("action %s (%s)", headers.get("ce_id", b"?").decode(),
                     headers.get("ce_type", b"?").decode())  # fmt: skip
            echo = handle(record.value, done, args.mode, int(time.time() * 1000))
            if echo is not None:
                key = f"{echo['cluster']}/{echo['target']}".encode()
                producer.send(
                    f"{args.prefix}.events.node", key=key, value=json.dumps(echo).encode()
                ).get(timeout=30)
            # commit only once done and echoed: a crash before re-reads it, and `done` skips it
            consumer.commit()
            handled += 1
            if args.max_records and handled >= args.max_records:
                break
    finally:
        consumer.close()
        producer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
