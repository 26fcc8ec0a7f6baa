"""`fleetpulse policy release`: a person lets removals for a paused check go ahead again.

    fleetpulse policy release --scope pool --name gke-a/a3-pool --check node.down --by alice
    fleetpulse policy release --scope zone:us-central1-a --check gpu.xid.fatal --reason "RMA"
    fleetpulse policy release --scope fleet --check silence --dry-run

When more than a share of a pool, zone or the fleet raises the same check at once, the policy
stage treats it as one common cause (an outage, a driver wave) and pauses removals for that
check beyond a few canaries (pipeline/decide/guard.py, alert FleetPulseCommonCause). A release tells
it the cause is understood: removals for the check in that scope go ahead under the usual
budgets until the cause clears and a new one is seen. The release is a policy_release/1 record
on fleet.events.policy, the topic the policy stage reads; `--scope KIND:NAME`, as the alert
writes it, is accepted too. The silence checks (node.stale, node.down, ...) pause as one:
`silence`.
"""

from __future__ import annotations

import argparse
import getpass
import time

from pipeline.config import Settings
from pipeline.decide.guard import FLEET, SCOPES
from pipeline.errors import ConfigError, DecodeError
from pipeline.model import PolicyRelease
from pipeline.wire.codec import decode, encode
from pipeline.wire.topics import record_key, topic_name

_SUFFIX = "events.policy"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "policy",
        help="act on the policy stage (release a common-cause pause)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    release = actions.add_parser(
        "release",
        help="release a common-cause pause of removals for one check in one scope",
        description="Send a policy_release/1 record to fleet.events.policy: removals for CHECK "
        "in the scope go ahead again under the usual budgets.",
    )
    release.add_argument(
        "--scope",
        required=True,
        metavar="{pool,zone,fleet}[:NAME]",
        help="what the pause covers: pool, zone or fleet (or KIND:NAME as the alert says)",
    )
    release.add_argument(
        "--name",
        help="the pool as CLUSTER/POOL, or the zone (not needed for fleet)",
    )
    release.add_argument("--check", required=True, help="the paused check, e.g. node.down")
    release.add_argument("--by", help="who releases it (default: the login name)")
    release.add_argument("--reason", default="", help="why, for whoever reads it later")
    release.add_argument(
        "--dry-run", action="store_true", help="print the record; send nothing"
    )
    release.set_defaults(handler=_release)


def release_record(
    scope: str, name: str | None, check: str, actor: str, reason: str, ts: int
) -> PolicyRelease:
    """The release the arguments describe; ConfigError when they do not name one scope."""
    kind, _, inline = scope.partition(":")
    if kind not in SCOPES:
        raise ConfigError(f"--scope: expected one of {', '.join(SCOPES)}, got {kind!r}")
    if inline and name and inline != name:
        raise ConfigError(f"--scope names {inline!r} and --name {name!r}: give one")
    name = inline or name or (FLEET if kind == "fleet" else None)
    if name is None:
        raise ConfigError(f"--scope {kind} needs --name (the {_NAME_HINT[kind]})")
    if kind == "pool" and name.count("/") != 1:
        raise ConfigError(f"--name: expected a pool as CLUSTER/POOL, got {name!r}")
    if kind == "fleet" and name != FLEET:
        raise ConfigError(f"--name: the fleet scope is called {FLEET!r}, got {name!r}")
    record = PolicyRelease(
        ts=ts, check=check, scope=kind, name=name, actor=actor, reason=reason  # type: ignore[arg-type]
    )
    # Checked the way the policy stage will decode it: lengths and the timestamp range.
    try:
        return decode(encode(record), PolicyRelease)
    except DecodeError as exc:
        raise ConfigError(f"the release is not valid: {exc}") from None


_NAME_HINT = {"pool": "pool as CLUSTER/POOL", "zone": "zone", "fleet": "fleet"}


def _login() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in a bare container
        return "unknown"


def _release(args: argparse.Namespace, settings: Settings) -> int:
    actor = args.by or _login()
    record = release_record(
        args.scope, args.name, args.check, actor, args.reason, int(time.time() * 1000)
    )
    topic = topic_name(settings.kafka, _SUFFIX)
    line = encode(record).decode()
    if args.dry_run:
        print(f"dry run, not sent to {topic} (key {record_key(record)}):\n{line}")
        return 0
    from pipeline.sources.publish import KafkaPublisher
    from pipeline.wire.admin import require_topic  # the Kafka client only to send

    require_topic(settings.kafka, _SUFFIX)
    publisher = KafkaPublisher(settings.kafka, client_id=f"{settings.kafka.client_id}-policy")
    try:
        publisher.publish("policy", [record], [])
    finally:
        publisher.close()
    print(f"released {record.check} in {record.scope} {record.name} by {actor}: sent to {topic}")
    return 0
