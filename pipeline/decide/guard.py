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
- **Silence** is no evidence of a node fault while others are silent with it: a silence cause
  lets no canary through, and silence has one scope more than pool, zone and fleet, its onset
  (causes.py): `common_cause_min_targets` targets whose silence showed within 30 s of each other
  (the nodes behind one Prometheus server or scrape job, whatever their pools and zones) are
  one cause. A silent node is still removed on evidence of its own: another check, or
  Kubernetes saying it is not Ready (the watcher's not_ready, `node.not_ready` in its node
  state) unless that is itself a common cause of its scopes (a partition).

Pure: no I/O, no clock; `observe`, `note_maintenance` and `settle` change the state they are
given and return it (the driver keeps the snapshot to roll back to). The state and its sizes
are in guard_state.py, the common causes in causes.py, the view a pool's policy gates removals
with in guard_view.py.
"""

from __future__ import annotations

import math

import msgspec

from pipeline.config import Settings
from pipeline.decide import alerts
from pipeline.decide.causes import COMMON_CAUSE, sync_causes
from pipeline.decide.guard_state import (
    FLEET,
    SCOPES,
    GuardState,
    Mark,
    Member,
    cause_check,
    count_all,
    enforced,
    member_counts,
    pool_of,
    scope_name,
    set_member,
    sizes,
)
from pipeline.decide.guard_view import GuardView, checks_of
from pipeline.model import (
    MAINTENANCE_CHECK,
    Alert,
    Inventory,
    NodeState,
    PolicyRelease,
    Proposal,
    target_key,
)

# what the stages, the commands and the tests call
__all__ = [
    "COMMON_CAUSE",
    "FLEET",
    "NO_INVENTORY",
    "SCOPES",
    "GuardState",
    "GuardView",
    "Mark",
    "enforced",
    "member_counts",
    "note_maintenance",
    "observe",
    "settle",
    "sizes",
    "sync",
    "view",
]

NO_INVENTORY = "FleetPulseNoInventory"
_MS = 1000
_HOUR_MS = 3_600_000

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
        set_member(st, st.members, key, f"{signal.cluster}/{signal.pool}", signal.zone)
    elif isinstance(signal, NodeState):
        _note_open_checks(st, signal)
    elif isinstance(signal, Proposal):
        _note_proposal(st, signal)
    else:
        _release(st, signal)
    _grow_trusted(st, settings)
    return st, sync_causes(st, settings) + _sync_no_inventory(st, settings)


def sync(state: GuardState, settings: Settings) -> list[Alert]:
    """Judge the common causes again (after a pool noted maintenance announcements)."""
    return sync_causes(state, settings)


def _own(state: GuardState | None) -> GuardState:
    # changed in place and returned: the driver keeps the snapshot (stages/base.py)
    return GuardState() if state is None else state


def _note_open_checks(st: GuardState, ns: NodeState) -> None:
    key = target_key(ns.target)
    set_member(st, st.seen, key, pool_of(ns.target), ns.target.zone)
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
        set_member(st, st.seen, key, pool_of(proposal.target), proposal.target.zone)
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


def _grow_trusted(st: GuardState, settings: Settings) -> None:
    """Follow the names seen into the sizes: freely in the warm-up, then at a bounded rate."""
    count_all(st)
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
            if cause.check in checks_of(proposal)
            and scope_name(cause.scope, Member(pool=pool_of(proposal.target),
                                                zone=proposal.target.zone)) == cause.name
        )
        if spent:
            st.causes[key] = msgspec.structs.replace(cause, removed=cause.removed + spent)
    return st
