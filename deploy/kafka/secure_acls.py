"""ACLs of kafka.sh's secure profile, created over the broker's PLAINTEXT listener (a super user).

One principal per FleetPulse component, `fleetpulse-<role>`, with exactly the grants of
pipeline/wire/acl.py (the table README.md's ACL section is written from): the worker alone
writes actions and the stage topics, the XID reader only XID events and its dead letters, and
so on. `admin` is a super user (super.users) and needs no ACL: tools such as `simulate` and the
tests' setup run as it. Nothing else is allowed (allow.everyone.if.no.acl.found=false).

Usage: python secure_acls.py <plaintext bootstrap> <comma-separated topic prefixes>
       python secure_acls.py --principals      (the user names, one a line, for kafka.sh)
"""

from __future__ import annotations

import sys

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourceType,
)

from pipeline.config import KafkaSettings
from pipeline.wire.acl import ROLES, Grant, grants


def to_acl(grant: Grant) -> ACL:
    pattern = ACLResourcePatternType.PREFIXED if grant.prefixed else ACLResourcePatternType.LITERAL
    return ACL(grant.principal, "*", ACLOperation[grant.operation], ACLPermissionType.ALLOW,
               ResourcePattern(ResourceType[grant.resource], grant.name, pattern))


def profile_grants(prefixes: list[str]) -> list[Grant]:
    """The grants for every topic prefix the profile serves (each with its default group)."""
    return sorted({g for prefix in prefixes for g in grants(KafkaSettings(topic_prefix=prefix))})


def main(bootstrap: str, prefixes: str) -> None:
    wanted = profile_grants([p for p in prefixes.split(",") if p])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kafka-sh-acls")
    try:
        result = admin.create_acls([to_acl(g) for g in wanted])
    finally:
        admin.close()
    if result["failed"]:
        raise SystemExit(f"ACLs refused: {result['failed']}")
    print(f"kafka.sh: created {len(result['succeeded'])} ACLs for {len(ROLES)} principals")


if __name__ == "__main__":
    if sys.argv[1:] == ["--principals"]:
        print("\n".join(role.principal for role in ROLES))
    else:
        main(sys.argv[1], sys.argv[2])
