"""The pool's blast-radius budget: what is out of service, how far removals may go.

Cordons only (drains and repairs act on a target already out): targets out of service in the
pool, counting our open cordons, dry-run cordons and people's cordons, stay within the budget;
fatal faults may go past it up to the ceiling (see pipeline/decide/policy.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.config import PolicySettings
from pipeline.decide.guard_view import GuardView
from pipeline.decide.pool_state import PolicyState
from pipeline.decide.verdicts import Hold


@dataclass(frozen=True)
class Budget:
    size: int
    failure: frozenset[str]  # out for a fault or a person, or as a dry run: what is counted
    total: frozenset[str]  # ... plus scheduled maintenance
    really_out: frozenset[str]  # out of service for real (no dry-run cordons)
    limit: int
    ceiling: int  # how far fatal faults may go


def budget(st: PolicyState, settings: PolicySettings, guard: GuardView | None = None) -> Budget:
    """The pool's blast-radius budget right now (its size: `pool_size`)."""
    maintenance = {k for k, m in st.maintenance.items() if m.cordoned and not m.done}
    really_out = {k for k, v in st.targets.items() if v.unavailable}
    really_out |= {k for k, o in st.open.items() if o.kind == "cordon"}
    total = really_out | set(st.shadow)
    failure = total - maintenance
    size = pool_size(st, guard)
    limit = min(
        settings.max_unavailable,
        max(settings.budget_floor, math.floor(settings.max_unavailable_pct * size / 100)),
    )
    ceiling = max(limit, math.floor(settings.fatal_max_unavailable_pct * size / 100))
    return Budget(size, frozenset(failure), frozenset(total), frozenset(really_out), limit, ceiling)


def pool_size(st: PolicyState, guard: GuardView | None) -> int:
    """The guard's size of the pool (its inventory, or the largest pool seen); alone, the
    targets this pool has seen."""
    return len(st.targets) if guard is None else guard.pool_size()


def budget_gate(now: Budget, key: str, fatal: bool) -> Hold | None:
    """None when cordoning `key` fits the budget (fatal: the ceiling); else why it waits."""
    if key in now.really_out:
        return None  # out of service already: cordoning it takes nothing more away
    # A target counted only as a dry run becomes really out: the count stays, but it must fit.
    after = len(now.failure | {key})
    if after <= now.limit or (fatal and after <= now.ceiling):
        return None
    return "fatal_ceiling" if fatal else "budget"


def out_for_faults(st: PolicyState, settings: PolicySettings) -> dict[str, str]:
    """This pool's targets out of service for faults or by people (what the zone and fleet
    caps count), by target key, with their zone."""
    failure = budget(st, settings).failure
    zones = {key: view.target.zone for key, view in st.targets.items()}
    return {key: zones.get(key, "") for key in sorted(failure)}


def maintenance_out(st: PolicyState) -> dict[str, str]:
    """The pool's targets out for scheduled maintenance (cordoned for it, not yet released):
    target key -> zone, for the guard's zone and fleet allowances."""
    return {
        key: plan.target.zone
        for key, plan in st.maintenance.items()
        if plan.cordoned and not plan.done
    }
