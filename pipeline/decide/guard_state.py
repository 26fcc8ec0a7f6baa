"""The guard's state (one for the whole fleet: pipeline/decide/guard.py says how it moves), the
scopes it counts in, and the members per scope that size the caps.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from pipeline.config import Settings
from pipeline.model import Alert, Target

FLEET = "fleet"
SCOPES = ("pool", "zone", "fleet")
# Every stage of silence is one signal: a monitoring outage first makes nodes stale, then down.
SILENCE = "silence"
# Silence has one scope more, whatever the labels: the targets that fell silent together (the
# nodes behind one Prometheus server or scrape job, a rack's power, a partition). Targets whose
# silence showed within ONSET_MS of each other (event time) share an onset group (causes.py),
# judged as a scope of its own for silence only.
ONSET = "onset"
ONSET_MS = 30_000
_SILENCE_CHECKS = frozenset(
    {"node.stale", "node.down", "tpu.host.stale", "tpu.host.down", "tpu.slice.stale"}
)


class Member(msgspec.Struct, frozen=True, kw_only=True):
    pool: str  # cluster/pool
    zone: str


class Mark(msgspec.Struct, frozen=True, kw_only=True):
    """A target with a check open, since `ts` (event time: the onset of a silence, the same
    whichever order the partitions' records reach the guard in)."""

    pool: str
    zone: str
    ts: int


class Cause(msgspec.Struct, frozen=True, kw_only=True):
    check: str
    scope: str
    name: str
    since: int
    removed: int = 0  # canaries let through
    released: bool = False
    quiet_since: int | None = None  # when fewer targets started to keep it open
    alert: Alert | None = None


class GuardState(msgspec.Struct, kw_only=True):
    clock: int = 0
    members: dict[str, Member] = {}  # from the inventory, by target key
    seen: dict[str, Member] = {}  # named in node states or proposals
    out: dict[str, dict[str, str]] = {}  # pool -> {target key: zone} out for faults
    raised: dict[str, dict[str, Mark]] = {}  # cause check -> target key -> mark
    causes: dict[str, Cause] = {}  # "check|scope|name" -> a cause seen now
    # Members per "scope|name", kept as members and seen change (every policy input asks for
    # the sizes): the inventory's, and all targets' (a target's seen pool over its inventory's)
    sized_inventory: dict[str, int] = {}
    sized_all: dict[str, int] = {}
    sized: bool = False  # the two are kept (a state from before them: counted once)
    # Without an inventory: the largest size seen per "scope|name", grown at a bounded rate
    # after the warm-up (see the module's docstring), and when it last grew.
    trusted: dict[str, int] = {}
    trusted_at: int = 0
    first_ts: int | None = None  # the guard's first time: the warm-up starts there
    maintenance: dict[str, dict[str, str]] = {}  # pool -> {target key: zone} out for it
    no_inventory: Alert | None = None  # FleetPulseNoInventory, while it fires


def cause_check(check: str) -> str:
    return SILENCE if check in _SILENCE_CHECKS else check


def silence_only(checks: Iterable[str]) -> bool:
    """Does a removal cite nothing but silence (no evidence of the node's own)?"""
    named = set(checks)
    return bool(named) and named <= _SILENCE_CHECKS


def pool_of(target: Target) -> str:
    return f"{target.cluster}/{target.pool}"


def scope_name(scope: str, member: Member | Mark) -> str:
    if scope == "pool":
        return member.pool
    return member.zone if scope == "zone" else FLEET


def enforced(st: GuardState, settings: Settings) -> bool:
    """Membership comes from the inventory: enforcement is on and an inventory has arrived."""
    return settings.inventory.enforce and bool(st.members)


def set_member(st: GuardState, where: dict[str, Member], key: str, pool: str, zone: str) -> None:
    known = where.get(key)
    if known is not None and known.pool == pool and known.zone == zone:
        return
    count_all(st)
    before = st.seen.get(key) or st.members.get(key)
    where[key] = member = Member(pool=pool, zone=zone)
    if where is st.members:
        _count(st.sized_inventory, known, -1)
        _count(st.sized_inventory, member, 1)
    _count(st.sized_all, before, -1)
    _count(st.sized_all, st.seen.get(key) or member, 1)


def _count(counts: dict[str, int], member: Member | None, step: int) -> None:
    if member is None:
        return
    for scope in SCOPES:
        name = f"{scope}|{scope_name(scope, member)}"
        counts[name] = counts.get(name, 0) + step
        if not counts[name]:
            del counts[name]


def count_all(st: GuardState) -> None:
    """Count a state's members once (kept as they change from then on)."""
    if st.sized:
        return
    st.sized_inventory, st.sized_all = {}, {}
    for member in st.members.values():
        _count(st.sized_inventory, member, 1)
    for member in {**st.members, **st.seen}.values():
        _count(st.sized_all, member, 1)
    st.sized = True


def member_counts(st: GuardState, inventory: bool) -> dict[tuple[str, str], int]:
    """Members per (scope, name): the inventory's, or every target named (a target's pool as
    seen over its inventory's)."""
    count_all(st)
    counts = st.sized_inventory if inventory else st.sized_all
    return {_scope_and_name(key): n for key, n in counts.items()}


def sizes(st: GuardState, settings: Settings) -> dict[tuple[str, str], int]:
    """Sizes per (scope, name) for the caps: the inventory's members when enforced, else the
    largest fleet seen (grown at a bounded rate, `_grow_trusted`)."""
    if enforced(st, settings):
        return member_counts(st, inventory=True)
    return {_scope_and_name(key): n for key, n in st.trusted.items()}


def _scope_and_name(key: str) -> tuple[str, str]:
    scope, _, name = key.partition("|")
    return scope, name
