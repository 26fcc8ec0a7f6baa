"""ACLs of kafka.sh's secure profile, created over the broker's PLAINTEXT listener (a super user).

- `fleetpulse`: everything on every topic, group and transactional id, and the cluster (it
  creates topics): the account of the worker, sinks, alerts, ingest and simulate.
- `telemetry-only`: write (and describe) topics starting with the given prefixes, nothing else;
  an ingest adapter's account, which must not be able to forge actions or alerts.
- `admin` is a super user (super.users), so it needs no ACL.

Usage: python secure_acls.py <plaintext bootstrap> <comma-separated telemetry topic prefixes>
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


def acls(telemetry_prefixes: list[str]) -> list[ACL]:
    def allow(user: str, op: ACLOperation, kind: ResourceType, name: str,
              pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL) -> ACL:
        return ACL(f"User:{user}", "*", op, ACLPermissionType.ALLOW,
                   ResourcePattern(kind, name, pattern))

    out = [
        allow("fleetpulse", ACLOperation.ALL, kind, "*")
        for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
    ]
    out.append(allow("fleetpulse", ACLOperation.ALL, ResourceType.CLUSTER, "kafka-cluster"))
    for prefix in telemetry_prefixes:
        for op in (ACLOperation.WRITE, ACLOperation.DESCRIBE):
            out.append(allow("telemetry-only", op, ResourceType.TOPIC, prefix,
                             ACLResourcePatternType.PREFIXED))
    return out


def main(bootstrap: str, prefixes: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kafka-sh-acls")
    try:
        result = admin.create_acls(acls([p for p in prefixes.split(",") if p]))
    finally:
        admin.close()
    if result["failed"]:
        raise SystemExit(f"ACLs refused: {result['failed']}")
    print(f"kafka.sh: created {len(result['succeeded'])} ACLs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
