"""How many targets of a scope may be out of service at once: one arithmetic for the pool's
budget, the guard's zone and fleet caps and the maintenance allowances.
"""

from __future__ import annotations

import math

from pipeline.config import PolicySettings


def cap(size: int, pct: float, absolute: int, floor: int) -> int:
    """min(absolute, max(floor, floor(pct x size))): a share of the scope, never below the
    floor (a small pool may lose its one broken node), never above the absolute cap."""
    return min(absolute, max(floor, math.floor(pct * size / 100)))


def maintenance_allowance(size: int, policy: PolicySettings) -> int:
    """How many of a pool, zone or fleet of `size` targets may be out for scheduled
    maintenance at once (beside the failure budget and caps)."""
    return max(
        policy.maintenance_floor, math.floor(policy.maintenance_max_unavailable_pct * size / 100)
    )
