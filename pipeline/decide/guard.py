"""What the per-pool policy cannot see: membership, caps above the pool and common causes.

One guard state for the whole fleet sits beside the pools' policy states (the policy stage is
one partition, so every removal in the fleet passes through it in one order):

- **Membership** comes from fleet.inventory. With `inventory.enforce` (the default) and once
  an inventory record has arrived, a pool's budget counts its inventory members, and a target
  the inventory does not know, or knows in another pool, is never removed (withheld:
  not_in_inventory / inventory_mismatch). Without one, members are the targets seen in node
  states, FleetPulseNoInventory fires (while enforcement waits for an inventory), and every
  size is the largest fleet seen, growing after `inventory.warmup_s` by at most
  `inventory.growth_pct` an hour: a burst of new names (ghosts, a forged feed) never widens
  the caps at once.
- **Time** is the health machine's (proposals and node states, themselves from telemetry):
  inventory records and releases are control records dated by whoever wrote them, and never
  move the guard's clock (one dated 2286 would have closed every common-cause window).
- **Scheduled maintenance** passes the guard too (`admit_maintenance`): the target must be a
  member, maintenance has an allowance of its own per zone and fleet-wide
  (`maintenance_max_unavailable_pct`), and notices for a large share of a scope at once are a
  common cause of their own (check "maintenance"): canaries only, until a person releases it
  or each target's announced window starts.
- **Caps above the pool**: targets out of service for faults (ours, people's, dry-run cordons;
  not scheduled maintenance) per zone and fleet-wide stay within
  min(absolute, max(cap_floor, floor(pct x size))). Fatal faults are not exempt: past these caps the
  cause is more likely systemic than many independent failures.
- **Common causes**: when the same check (silence counts as one check, whichever stage of it)
  opens on more than `common_cause_share` of a pool, a zone or the fleet within
  `common_cause_window_s`, and on at least `common_cause_min_targets` targets, it is one cause
  (a monitoring outage, a driver or firmware wave, a partition, an ingest bug), not many node
  faults: one FleetPulseCommonCause alert names the check and the scope, and removals citing
  that check stop after `common_cause_canaries`, until fewer targets keep it open (less than
  half the share, or under the minimum) for a whole window, or a person releases it
  (PolicyRelease). Anchors:
  medik8s NHC minHealthy, NVSentinel's circuit breaker, Karpenter's disruption budgets.

Pure: no I/O, no clock; `observe`, `note_maintenance` and `settle` change the state they are
given and return it (the driver keeps the snapshot to roll back to).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from pipeline.config import Settings
from pipeline.decide import alerts
from pipeline.decide.caps import cap, maintenance_allowance
from pipeline.decide.verdicts import Hold
from pipeline.model import (
    MAINTENANCE_CHECK,
    Alert,
    Inventory,
    NodeState,
    PolicyRelease,
    Proposal,
    Target,
    target_key,
)

FLEET = "fleet"
SCOPES = ("pool", "zone", "fleet")
# Every stage of silence is one signal: a monitoring outage first makes nodes stale, then down.
SILENCE = "silence"
_SILENCE_CHECKS = frozenset(
    {"node.stale", "node.down", "tpu.host.stale", "tpu.host.down", "tpu.slice.stale"}
)
COMMON_CAUSE = "FleetPulseCommonCause"
NO_INVENTORY = "FleetPulseNoInventory"
_MS = 1000
_HOUR_MS = 3_600_000


class Member(msgspec.Struct, frozen=True, kw_only=True):
    pool: str  # cluster/pool
    zone: str


class Mark(msgspec.Struct, frozen=True, kw_only=True):
    """A target with a check open, since `ts`."""

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


# --- learning ---------------------------------------------------------------------------


Signal = Proposal | NodeState | Inventory | PolicyRelease


def observe(
    state: GuardState | None, signal: Signal, settings: Settings
) -> tuple[GuardState, list[Alert]]:
    """Learn from one policy-stage input; return the new state and common-cause alerts."""
    st = _own(state)
    if isinstance(signal, Proposal | NodeState):  # telemetry's time, not a control record's
        st.clock = max(st.clock, signal.ts)
        st.first_ts = signal.ts if st.first_ts is None else st.first_ts
    if isinstance(signal, Inventory):
        key = f"{signal.cluster}/{signal.kind}/{signal.name}"
        _set_member(st, st.members, key, f"{signal.cluster}/{signal.pool}", signal.zone)
    elif isinstance(signal, NodeState):
        _note_open_checks(st, signal)
    elif isinstance(signal, Proposal):
        _note_proposal(st, signal)
    else:
        _release(st, signal)
    _grow_trusted(st, settings)
    return st, _sync_causes(st, settings) + _sync_no_inventory(st, settings)


def sync(state: GuardState, settings: Settings) -> list[Alert]:
    """Judge the common causes again (after a pool noted maintenance announcements)."""
    return _sync_causes(state, settings)


def _own(state: GuardState | None) -> GuardState:
    # changed in place and returned: the driver keeps the snapshot (stages/topology.py)
    return GuardState() if state is None else state


def _set_member(st: GuardState, where: dict[str, Member], key: str, pool: str, zone: str) -> None:
    known = where.get(key)
    if known is not None and known.pool == pool and known.zone == zone:
        return
    _count_all(st)
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
        name = f"{scope}|{_scope_name(scope, member)}"
        counts[name] = counts.get(name, 0) + step
        if not counts[name]:
            del counts[name]


def _count_all(st: GuardState) -> None:
    """Count a state's members once (kept as they change from then on)."""
    if st.sized:
        return
    st.sized_inventory, st.sized_all = {}, {}
    for member in st.members.values():
        _count(st.sized_inventory, member, 1)
    for member in {**st.members, **st.seen}.values():
        _count(st.sized_all, member, 1)
    st.sized = True


def _note_open_checks(st: GuardState, ns: NodeState) -> None:
    key = target_key(ns.target)
    _set_member(st, st.seen, key, pool_of(ns.target), ns.target.zone)
    open_now = {cause_check(check) for check in ns.open_checks}
    for check in open_now:
        marks = st.raised.setdefault(check, {})
        if key not in marks:
            marks[key] = Mark(pool=pool_of(ns.target), zone=ns.target.zone, ts=ns.ts)
    for check in list(st.raised):
        if check == MAINTENANCE_CHECK:
            continue  # a notice, not a check of the node's: the pool's plans keep it (below)
        if check not in open_now and key in st.raised[check]:
            del st.raised[check][key]
            if not st.raised[check]:
                del st.raised[check]


def _note_proposal(st: GuardState, proposal: Proposal) -> None:
    # A fatal fault proposes at once, before its node state says the check is open.
    key = target_key(proposal.target)
    if key not in st.seen:
        _set_member(st, st.seen, key, pool_of(proposal.target), proposal.target.zone)
    if proposal.kind != "cordon":
        return
    for check in {cause_check(check) for check in proposal.reason.checks}:
        marks = st.raised.setdefault(check, {})
        if key not in marks:
            target = proposal.target
            marks[key] = Mark(pool=pool_of(target), zone=target.zone, ts=proposal.ts)


def note_maintenance(st: GuardState, pool: str, announced: dict[str, Mark]) -> bool:
    """A pool's pending maintenance notices (target key -> mark at the notice's time), as
    marks of the "maintenance" check, so a storm of notices is judged as a common cause.
    True when they changed (the causes are then judged again: `sync`)."""
    marks = st.raised.get(MAINTENANCE_CHECK, {})
    mine = {k: m for k, m in marks.items() if m.pool == pool}
    if mine == announced:
        return False
    kept = {k: m for k, m in marks.items() if m.pool != pool}
    kept.update(announced)
    if kept:
        st.raised[MAINTENANCE_CHECK] = kept
    else:
        st.raised.pop(MAINTENANCE_CHECK, None)
    return True


def _release(st: GuardState, release: PolicyRelease) -> None:
    name = f"{cause_check(release.check)}|{release.scope}|{release.name}"
    cause = st.causes.get(name)
    if cause is not None:
        st.causes[name] = msgspec.structs.replace(cause, released=True)


# --- sizes and counts ---------------------------------------------------------------------


def _scope_name(scope: str, member: Member | Mark) -> str:
    if scope == "pool":
        return member.pool
    return member.zone if scope == "zone" else FLEET


def enforced(st: GuardState, settings: Settings) -> bool:
    """Membership comes from the inventory: enforcement is on and an inventory has arrived."""
    return settings.inventory.enforce and bool(st.members)


def member_counts(st: GuardState, inventory: bool) -> dict[tuple[str, str], int]:
    """Members per (scope, name): the inventory's, or every target named (a target's pool as
    seen over its inventory's)."""
    _count_all(st)
    counts = st.sized_inventory if inventory else st.sized_all
    return {_scope_and_name(key): n for key, n in counts.items()}


def sizes(st: GuardState, settings: Settings) -> dict[tuple[str, str], int]:
    """Sizes per (scope, name) for the caps: the inventory's members when enforced, else the
    largest fleet seen (grown at a bounded rate, `_grow_trusted`)."""
    if enforced(st, settings):
        return member_counts(st, inventory=True)
    return {_scope_and_name(key): n for key, n in st.trusted.items()}


def _grow_trusted(st: GuardState, settings: Settings) -> None:
    """Follow the names seen into the sizes: freely in the warm-up, then at a bounded rate."""
    _count_all(st)
    inventory = settings.inventory
    warm = st.first_ts is None or st.clock - st.first_ts <= inventory.warmup_s * _MS
    if warm:
        for key, n in st.sized_all.items():
            if n > st.trusted.get(key, 0):
                st.trusted[key] = n
        st.trusted_at = st.clock
        return
    if st.clock - st.trusted_at < _HOUR_MS:
        return
    for key, n in st.sized_all.items():
        known = st.trusted.get(key, 0)
        if n > known:
            step = max(1, math.floor(known * inventory.growth_pct / 100))
            st.trusted[key] = min(n, known + step)
    st.trusted_at = st.clock


def _sync_no_inventory(st: GuardState, settings: Settings) -> list[Alert]:
    """FleetPulseNoInventory fires while enforcement waits for an inventory that never came."""
    missing = settings.inventory.enforce and not st.members and st.first_ts is not None
    if missing and st.no_inventory is None:
        labels = {
            "alertname": NO_INVENTORY,
            "severity": "warning",
            "source": alerts.SOURCE,
        }
        summary = (
            "no inventory on fleet.inventory: pool, zone and cluster come from telemetry, and "
            "the budgets and caps are sized by the largest fleet seen"
        )
        annotations = {
            "summary": summary,
            "description": (
                f"{summary}. Run the Kubernetes watcher or the capacity adapter, or "
                "`fleetpulse inventory load FILE`, so membership comes from the fleet's owner."
            ),
        }
        st.no_inventory = alerts.firing(
            labels, annotations, st.clock, runbook_base=settings.policy.runbook_base,
            generator_base=settings.policy.generator_base,
        )
        return [st.no_inventory]
    if not missing and st.no_inventory is not None:
        gone, st.no_inventory = st.no_inventory, None
        return [alerts.resolve(gone, st.clock)]
    return []


def _scope_and_name(key: str) -> tuple[str, str]:
    scope, _, name = key.partition("|")
    return scope, name


# --- common causes ------------------------------------------------------------------------


def _sync_causes(st: GuardState, settings: Settings) -> list[Alert]:
    policy = settings.policy
    counted = sizes(st, settings)
    window_ms = policy.common_cause_window_s * _MS
    seen_now: set[str] = set()
    out: list[Alert] = []
    for check in sorted(st.raised):
        groups = _group(st.raised[check].values())
        for (scope, name), marks in sorted(groups.items()):
            size = max(counted.get((scope, name), 0), len(marks))
            recent = sum(1 for mark in marks if st.clock - mark.ts <= window_ms)
            key = f"{check}|{scope}|{name}"
            cause = st.causes.get(key)
            share = policy.common_cause_share * size
            if cause is None and recent >= policy.common_cause_min_targets and recent > share:
                cause = Cause(check=check, scope=scope, name=name, since=st.clock)
            elif cause is not None:
                cause = _quieten(cause, len(marks), share, st.clock, settings)
            if cause is None:
                continue
            seen_now.add(key)
            cause, alert = _cause_alert(cause, len(marks), size, st.clock, settings)
            st.causes[key] = cause
            out += alert
    for key in sorted(set(st.causes) - seen_now):
        gone = st.causes.pop(key)
        if gone.alert is not None:
            out.append(alerts.resolve(gone.alert, st.clock))
    return out


def _quieten(
    cause: Cause, open_on: int, share: float, now: int, settings: Settings
) -> Cause | None:
    """The cause, or None once it has stayed under half its share (or the minimum) for a
    window: the hold lets every node's state catch up, so removals withheld through the
    outage are judged on how the nodes read after it, not released in one burst."""
    policy = settings.policy
    if open_on >= policy.common_cause_min_targets and open_on > share / 2:
        return msgspec.structs.replace(cause, quiet_since=None)
    if cause.quiet_since is None:
        return msgspec.structs.replace(cause, quiet_since=now)
    if now - cause.quiet_since >= policy.common_cause_window_s * _MS:
        return None
    return cause


def _group(marks: Iterable[Mark]) -> dict[tuple[str, str], list[Mark]]:
    groups: dict[tuple[str, str], list[Mark]] = {}
    for mark in marks:
        for scope in SCOPES:
            groups.setdefault((scope, _scope_name(scope, mark)), []).append(mark)
    return groups


def _cause_alert(
    cause: Cause, count: int, size: int, now: int, settings: Settings
) -> tuple[Cause, list[Alert]]:
    labels = {
        "alertname": COMMON_CAUSE,
        "check": cause.check,
        "scope": cause.scope,
        "scope_name": cause.name,
        "severity": "critical",
        "source": alerts.SOURCE,
        # the labels routes match on, where the scope has them
        **({"pool": cause.name} if cause.scope == "pool" else {}),
        **({"zone": cause.name} if cause.scope == "zone" else {}),
    }
    summary = (
        f"{cause.check} on {count} of {size} targets in {cause.scope} {cause.name}: one "
        "common cause, not node faults"
    )
    held = "released by a person" if cause.released else "removals paused beyond canaries"
    annotations = {
        "summary": summary,
        "description": (
            f"{summary}. FleetPulse {held} for this check in this scope until fewer targets "
            f"keep it open, or `fleetpulse policy release --check {cause.check} --scope "
            f"{cause.scope}:{cause.name}`. Look for a monitoring outage, a driver or firmware "
            "wave, a network partition or an ingest bug."
        ),
        "targets": str(count),
    }
    if cause.alert is None:
        alert = alerts.firing(
            labels,
            annotations,
            now,
            runbook_base=settings.policy.runbook_base,
            generator_base=settings.policy.generator_base,
        )
    elif (cause.alert.annotations.get("targets") != str(count) and (
        count >= 2 * int(cause.alert.annotations.get("targets", "1"))
    )) or (cause.alert.annotations.get("description") != annotations["description"] and (
        cause.released
    )):
        alert = alerts.update(cause.alert, annotations, now)
    else:
        return cause, []
    return msgspec.structs.replace(cause, alert=alert), [alert]


# --- the view a pool's policy gates removals with ----------------------------------------


@dataclass
class GuardView:
    """The fleet as one pool's decision sees it; remembers what it let through this pass."""

    state: GuardState
    settings: Settings
    pool: str
    counted: dict[tuple[str, str], int]
    admitted: list[tuple[str, Proposal]] = field(default_factory=list)
    maintenance: list[tuple[str, Proposal]] = field(default_factory=list)  # let out for it

    def pool_size(self) -> int:
        """The pool's size for its budget: the inventory's members, or the largest pool seen."""
        return self.counted.get(("pool", self.pool), 0)

    def admit(self, proposal: Proposal, already_out: bool) -> Hold | None:
        """None when removing the proposal's target is fine fleet-wide; else why it waits."""
        key = target_key(proposal.target)
        verdict = self._membership(key, proposal.target)
        if verdict is not None or already_out:
            return verdict
        verdict = self._caps(proposal.target.zone) or self._cause(proposal)
        if verdict is None:
            self.admitted.append((key, proposal))
        return verdict

    def admit_maintenance(self, proposal: Proposal, window_started: bool) -> Hold | None:
        """None when moving the target out for scheduled maintenance is fine fleet-wide; else the
        reason: not a member, the zone's or fleet's maintenance allowance spent, or a storm of
        notices (canaries only until a person releases it or the target's window starts)."""
        key, target = target_key(proposal.target), proposal.target
        verdict = self._membership(key, target)
        unseen = not enforced(self.state, self.settings) and key not in self.state.seen
        if verdict is None and unseen:
            verdict = "not_in_inventory"  # no telemetry ever named it: nothing to move
        verdict = verdict or self._maintenance_caps(target.zone)
        if verdict is None and not window_started and self._cause(proposal, self.maintenance):
            verdict = "maintenance_storm"
        if verdict is None:
            self.maintenance.append((key, proposal))
        return verdict

    def _maintenance_caps(self, zone: str) -> Hold | None:
        out = {k: z for keys in self.state.maintenance.values() for k, z in keys.items()}
        out |= {k: p.target.zone for k, p in self.maintenance}
        for scope, name, count in (
            ("zone", zone, sum(1 for z in out.values() if z == zone)),
            ("fleet", FLEET, len(out)),
        ):
            size = self.counted.get((scope, name), 0)
            if count + 1 > maintenance_allowance(size, self.settings.policy):
                return "maintenance_zone_cap" if scope == "zone" else "maintenance_fleet_cap"
        return None

    def _membership(self, key: str, target: Target) -> Hold | None:
        if not enforced(self.state, self.settings):
            return None
        member = self.state.members.get(key)
        if member is None:
            return "not_in_inventory"
        if member.pool != pool_of(target) or member.zone != target.zone:
            return "inventory_mismatch"
        return None

    def _caps(self, zone: str) -> Hold | None:
        policy = self.settings.policy
        others = {k: z for pool, out in self.state.out.items() if pool != self.pool
                  for k, z in out.items()}
        mine = self.state.out.get(self.pool, {})
        everyone = {**others, **mine, **{k: p.target.zone for k, p in self.admitted}}
        in_zone = sum(1 for z in everyone.values() if z == zone)
        zone_size = self.counted.get(("zone", zone), 0)
        zone_cap = cap(
            zone_size, policy.zone_max_unavailable_pct, policy.zone_max_unavailable,
            policy.cap_floor,
        )
        if in_zone + 1 > zone_cap:
            return "zone_cap"
        fleet_size = self.counted.get(("fleet", FLEET), 0)
        fleet_cap = cap(
            fleet_size, policy.fleet_max_unavailable_pct, policy.fleet_max_unavailable,
            policy.cap_floor,
        )
        if len(everyone) + 1 > fleet_cap:
            return "fleet_cap"
        return None

    def _cause(
        self, proposal: Proposal, admitted: list[tuple[str, Proposal]] | None = None
    ) -> Hold | None:
        """'common_cause' when every check the removal cites is a common cause in one of the
        target's scopes with its canaries spent; None when some check is the node's own
        evidence. Silence lets no canary through: a node that stopped reporting with its
        peers has shown nothing of its own."""
        target = proposal.target
        member = Member(pool=pool_of(target), zone=target.zone)
        admitted = self.admitted if admitted is None else admitted
        checks = _checks(proposal)
        held = set()
        for check in checks:
            canaries = 0 if check == SILENCE else self.settings.policy.common_cause_canaries
            for scope in SCOPES:
                cause = self.state.causes.get(f"{check}|{scope}|{_scope_name(scope, member)}")
                if cause is None or cause.released:
                    continue
                let_through = cause.removed + sum(1 for _, p in admitted if check in _checks(p))
                if let_through >= canaries:
                    held.add(check)
                    break
        return "common_cause" if held and held == checks else None


def _checks(proposal: Proposal) -> set[str]:
    return {cause_check(check) for check in proposal.reason.checks}


def view(state: GuardState, settings: Settings, pool: str) -> GuardView:
    return GuardView(state=state, settings=settings, pool=pool, counted=sizes(state, settings))


def settle(
    state: GuardState,
    done: GuardView,
    pool: str,
    out: dict[str, str],
    maintenance: dict[str, str] | None = None,
) -> GuardState:
    """After a pool's decision: its targets out for faults and for maintenance now, and the
    canaries spent."""
    st = _own(state)
    st.out[pool] = out
    if maintenance is not None:
        st.maintenance[pool] = maintenance
    for key, cause in list(st.causes.items()):
        spent = sum(
            1
            for _, proposal in [*done.admitted, *done.maintenance]
            if cause.check in _checks(proposal)
            and _scope_name(cause.scope, Member(pool=pool_of(proposal.target),
                                                zone=proposal.target.zone)) == cause.name
        )
        if spent:
            st.causes[key] = msgspec.structs.replace(cause, removed=cause.removed + spent)
    return st
