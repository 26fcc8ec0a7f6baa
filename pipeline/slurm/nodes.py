"""What Slurm says about a node, read once and judged here, pure (no commands, no clock).

`sinfo --json` (openapi v0.0.38 in Debian's 22.05) gives each node a base `state` (idle,
allocated, mixed, down, …) and `state_flags` (DRAIN, NOT_RESPONDING, REBOOT_REQUESTED,
REBOOT_ISSUED, MAINTENANCE, …). Slurm's own words "draining" and "drained" are both DRAIN:
draining while jobs still run (allocated, mixed, or COMPLETING), drained once none does.

FleetPulse's drains carry its reason prefix (NHC's convention: `fleetpulse: <check> <action_id>`);
everything else drained is a person's (or NHC's, or Slurm's own, such as "Kill task failed"),
and FleetPulse never resumes it. What FleetPulse carried out is also recorded in the node's
comment (`fleetpulse: <action_id>=<outcome> …`) while the comment is empty or FleetPulse's, so a
redelivered action changes nothing twice even after a reboot cleared the reason.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.model import NAME_PATTERN, Inventory

UNKNOWN = "unknown"
_NAME = re.compile(NAME_PATTERN)
_BUSY = frozenset({"allocated", "mixed", "completing"})
_KEPT_RECORDS = 8  # the newest outcomes kept in the comment (it is a few hundred bytes at most)
_BOOT_JITTER_S = 30


class SlurmReadError(SinkError):
    """Slurm's answer could not be read (a failed or garbled `sinfo --json`): never "no nodes".
    A SinkError, so the caller retries and commits nothing."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as `sinfo --json` lists it: only the fields FleetPulse reads."""

    name: str
    state: str  # the base state, lower case: idle, allocated, mixed, down, future, unknown
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, NOT_RESPONDING, REBOOT_ISSUED, …
    reason: str = ""
    reason_by: str = ""  # reason_set_by_user ("" when none)
    reason_at: int = 0  # reason_changed_at, Unix seconds (0: no reason)
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    gres: str = ""  # "gpu:h100:8" or "gpu:h100:8(S:0-1),gpu:a100:2"
    boot_time: int = 0  # Unix seconds
    comment: str = ""
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def busy(self) -> bool:
        return self.state in _BUSY or "COMPLETING" in self.flags

    @property
    def down(self) -> bool:
        """DOWN (with NOT_RESPONDING once slurmd is silent for SlurmdTimeout). NOT_RESPONDING
        alone is not down: Slurm sets it on every resumed node until its next ping (`idle*`)."""
        return self.state == "down"

    @property
    def reboot_pending(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})


def parse_sinfo(raw: bytes | str) -> list[SlurmNode]:
    """`sinfo --json` → nodes. Raises SlurmReadError for anything but a clean answer (not JSON,
    an `errors` entry, no `nodes` list): a failed poll must never read as "no drains"."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        shown = str(raw)[:120]
        raise SlurmReadError(f"sinfo --json: expected JSON, got {shown!r}: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmReadError(f"sinfo --json: expected an object, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if errors:
        raise SlurmReadError(f"sinfo --json reported errors: {json.dumps(errors)[:300]}")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmReadError(f"sinfo --json: expected a 'nodes' list, got keys {sorted(doc)[:10]}")
    return [_node(entry) for entry in nodes]


def _node(entry: object) -> SlurmNode:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise SlurmReadError(f"sinfo --json: a node without a name: {str(entry)[:200]}")
    return SlurmNode(
        name=entry["name"],
        state=str(entry.get("state") or "unknown").lower(),
        flags=frozenset(str(f).upper() for f in entry.get("state_flags") or ()),
        reason=str(entry.get("reason") or ""),
        reason_by=str(entry.get("reason_set_by_user") or ""),
        reason_at=int(entry.get("reason_changed_at") or 0),
        partitions=tuple(str(p) for p in entry.get("partitions") or ()),
        features=_split(entry.get("active_features") or entry.get("features") or ""),
        gres=str(entry.get("gres") or ""),
        boot_time=int(entry.get("boot_time") or 0),
        comment=str(entry.get("comment") or ""),
    )


def _split(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value if v)
    return tuple(v for v in str(value).split(",") if v)


# --- FleetPulse's marks -------------------------------------------------------------------


def reason_for(prefix: str, check: str, action_id: str, kind: str = "") -> str:
    """The drain reason FleetPulse sets: `fleetpulse: <check> <action_id>` (a reboot adds its
    kind). Slurm keeps a reason on one line; quotes would end it in scontrol's parser."""
    words = [w for w in (kind, _word(check) or "unhealthy", action_id) if w]
    return f"{prefix} {' '.join(words)}"[:200]


def _word(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", text)[:64]


def ours(node: SlurmNode, prefix: str) -> bool:
    """Drained by FleetPulse: the DRAIN flag with FleetPulse's reason prefix."""
    return node.drain and node.reason.startswith(prefix)


def applied(node: SlurmNode, prefix: str) -> dict[str, str]:
    """action_id → outcome, as recorded in the comment (empty when it is a person's)."""
    if not node.comment.startswith(prefix):
        return {}
    pairs = (word.partition("=") for word in node.comment[len(prefix):].split())
    return {key: value for key, sep, value in pairs if sep and key and value}


def with_applied(node: SlurmNode, prefix: str, action_id: str, outcome: str) -> str | None:
    """The comment with this outcome added (newest last, the oldest dropped), or None when the
    comment is a person's and must stay."""
    if node.comment and not node.comment.startswith(prefix):
        return None
    done = {k: v for k, v in applied(node, prefix).items() if k != action_id}
    done[action_id] = outcome
    kept = list(done.items())[-_KEPT_RECORDS:]
    return f"{prefix} " + " ".join(f"{k}={v}" for k, v in kept)


def held(node: SlurmNode, prefix: str, reservations: Sequence[str] = ()) -> str | None:
    """Why a person holds the node (FleetPulse leaves it alone), or None: their drain (any
    reason without FleetPulse's prefix), a maintenance reservation, a reboot they asked for."""
    if node.drain and not node.reason.startswith(prefix):
        by = f" by {node.reason_by}" if node.reason_by else ""
        return f"is drained{by} ({node.reason or 'no reason given'})"
    if reservations:
        return f"is in maintenance reservation {', '.join(reservations)}"
    if "MAINTENANCE" in node.flags:
        return "is in a maintenance reservation"
    if node.reboot_pending and not node.reason.startswith(prefix):
        return "has a reboot pending that FleetPulse did not ask for"
    return None


# --- where the node is --------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    pool: str
    zone: str


def place(node: SlurmNode, settings: SlurmSettings) -> Place:
    """Pool: the feature after pool_feature_prefix when one is set, else the first partition;
    zone: the feature after zone_feature_prefix, else settings.zone. Names FleetPulse cannot
    take become "unknown" (so the actuator refuses actions that name them otherwise)."""
    pool = (_feature(node, settings.pool_feature_prefix) if settings.pool_feature_prefix
            else next(iter(node.partitions), ""))  # fmt: skip
    zone = _feature(node, settings.zone_feature_prefix) if settings.zone_feature_prefix else ""
    return Place(_name(pool), _name(zone or settings.zone))


def _feature(node: SlurmNode, prefix: str) -> str:
    return next((f[len(prefix):] for f in node.features if f.startswith(prefix)), "")


def _name(value: str) -> str:
    return value if value and _NAME.match(value) else UNKNOWN


def accelerator(node: SlurmNode) -> tuple[str, int]:
    """The GPU model and count from GRES (`gpu:h100:8`, `gpu:8`, `gpu:h100:4(S:0),gpu:h100:4`):
    ("none", 0) for a node without GPUs; the model of the first typed entry."""
    model, count = "", 0
    for entry in node.gres.split(","):
        parts = re.sub(r"\(.*?\)", "", entry).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        try:
            count += int(parts[-1])
        except ValueError:
            continue
        model = model or (parts[1] if len(parts) > 2 else "")
    return (model or ("gpu" if count else "none"))[:256], min(count, 100_000)


def inventory(node: SlurmNode, cluster: str, ts_ms: int, settings: SlurmSettings) -> Inventory:
    """The node as an inventory/1 record (fleet.inventory, key cluster/name)."""
    where = place(node, settings)
    model, count = accelerator(node)
    labels = {"partitions": ",".join(node.partitions)[:256],
              "features": ",".join(node.features)[:256]}  # fmt: skip
    return Inventory(ts=ts_ms, cluster=cluster, kind="node", name=node.name, pool=where.pool,
                     zone=where.zone, accelerator=model, capacity=count,
                     labels={k: v for k, v in labels.items() if v}, source="slurm")  # fmt: skip


# --- reservations -------------------------------------------------------------------------


def maintenance_reservations(text: str, node: str) -> list[str]:
    """Names of the ACTIVE reservations with the MAINT flag that hold `node`, from
    `scontrol show reservation -o` (one reservation a line; "No reservations in the system")."""
    found = []
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "ReservationName" not in fields or fields.get("State") != "ACTIVE":
            continue
        if "MAINT" not in fields.get("Flags", "").split(","):
            continue
        if node in expand_hostlist(fields.get("Nodes", "")):
            found.append(fields["ReservationName"])
    return found


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compact host lists: `gpu-[1-3,7],login1` → gpu-1, gpu-2, gpu-3, gpu-7, login1
    (one bracket per name, as Slurm writes them for names like these; zero padding kept)."""
    names: list[str] = []
    for head, ranges, tail in re.findall(r"([^,\[]*)(?:\[([^\]]*)\])?([^,\[]*)", hostlist):
        if not ranges:
            if head + tail:
                names.append(head + tail)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for i in range(int(low), int(high or low) + 1):
                names.append(f"{head}{i:0{width}d}{tail}")
    return names


def jobs_of(squeue: str) -> list[str]:
    """`squeue -h -o '%i %u %j'` lines → "1234 (alice, train)" for a blocked drain's reason."""
    out = []
    for line in squeue.splitlines():
        parts = line.split(None, 2)
        if parts:
            rest = ", ".join(parts[1:])
            out.append(f"{parts[0]} ({rest})" if rest else parts[0])
    return out


# --- what changed between two polls -------------------------------------------------------

Change = tuple[str, str, str | None, str]  # (node_event kind, actor, action_id, reason)


def changes(old: SlurmNode | None, new: SlurmNode, prefix: str) -> list[Change]:
    """What a person, Slurm itself or a reboot changed between two polls of a node.
    FleetPulse's own drains and resumes are left out: the actuator echoes those."""
    if old is None:
        return [("created", "slurm", None, "node added to Slurm")]
    found: list[Change] = []
    found += _drain_change(old, new, prefix)
    # a reboot takes the node down on purpose: its end is the `repaired` below
    was_down, is_down = _down(old), _down(new)
    if is_down and not was_down:
        found.append(("not_ready", "slurm", None, f"{new.state.upper()}"
                      f"{' NOT_RESPONDING' if 'NOT_RESPONDING' in new.flags else ''}: "
                      f"{new.reason or 'no reason given'}"))  # fmt: skip
    elif was_down and not is_down:
        found.append(("ready", "slurm", None, f"{new.state} again"))
    if "MAINTENANCE" in new.flags and "MAINTENANCE" not in old.flags:
        found.append(("held", "slurm", None, "a maintenance reservation holds the node"))
    elif "MAINTENANCE" in old.flags and "MAINTENANCE" not in new.flags and not new.drain:
        found.append(("uncordoned", "slurm", None, "the maintenance reservation ended"))
    if old.boot_time and _rebooted(old, new):
        action_id = action_id_in(old.reason, prefix)
        found.append(("repaired", "slurm", action_id, f"rebooted (boot time "
                      f"{_when(new.boot_time)})"))  # fmt: skip
    return found


def _rebooted(old: SlurmNode, new: SlurmNode) -> bool:
    """A later boot time: after a reboot Slurm was asked for, any; else more than the jitter
    (slurmd works its boot time out from the uptime at each registration, so it wanders by a
    second or two without a reboot)."""
    later = new.boot_time - old.boot_time
    return later > 0 and (old.reboot_pending or later > _BOOT_JITTER_S)


def _down(node: SlurmNode) -> bool:
    return node.down and not node.reboot_pending


def _drain_change(old: SlurmNode, new: SlurmNode, prefix: str) -> list[Change]:
    if new.drain and not old.drain:
        if new.reason.startswith(prefix):
            return []  # FleetPulse's drain (or reboot): the actuator echoes it
        by = new.reason_by or "slurm"
        return [("cordoned", by, None, f"drained by {by} at {_when(new.reason_at)}: "
                 f"{new.reason or 'no reason given'}")]  # fmt: skip
    if old.drain and not new.drain:
        if old.reason.startswith(prefix) and (_resumed_by_us(old, new, prefix)
                                              or old.reboot_pending):  # fmt: skip
            return []  # FleetPulse's resume (echoed), or its reboot done (`repaired`)
        whose = "FleetPulse's drain" if old.reason.startswith(prefix) else "drain"
        return [("uncordoned", "slurm", None, f"{whose} ({old.reason}) resumed by a person")]
    return []


def _resumed_by_us(old: SlurmNode, new: SlurmNode, prefix: str) -> bool:
    """The comment gained an `uncordoned` record: FleetPulse's own resume."""
    before = applied(old, prefix)
    return any(v == "uncordoned" and before.get(k) != v
               for k, v in applied(new, prefix).items())  # fmt: skip


def action_id_in(reason: str, prefix: str) -> str | None:
    """The action id in FleetPulse's reason (its last word), None in anyone else's. Slurm
    appends to a reason it changes itself (" : reboot issued"): only the first part counts."""
    if not reason.startswith(prefix):
        return None
    words = reason.split(" : ")[0].split()
    return words[-1] if len(words) > 1 else None


def _when(seconds: int) -> str:
    if seconds <= 0:
        return "an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
