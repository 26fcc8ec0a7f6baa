"""The verdicts of the gates a removal passes: the policy's, the maintenance gate's, the guard's.

A gate that lets a proposal through says None; one that holds it back says why (a `Hold`, the
reason a withheld/1 record carries). The policy's own gate has a third answer: drop the proposal
(`DROP`, the why in withheld.py), or act on it now (`ACT`).
"""

from __future__ import annotations

from typing import Final, Literal

from pipeline.decide.alerts import PoolAlert

Hold = Literal[
    # the pool (pipeline/decide/policy.py)
    "budget",
    "fatal_ceiling",
    "capacity",
    "slow_start",
    "rate_limit",
    "busy",
    "awaiting_cordon",
    "correlating",
    # above the pool (pipeline/decide/guard.py)
    "zone_cap",
    "fleet_cap",
    "common_cause",
    "not_in_inventory",
    "inventory_mismatch",
    # scheduled maintenance (pipeline/decide/maintenance.py, then the guard)
    "maintenance_budget",
    "maintenance_zone_cap",
    "maintenance_fleet_cap",
    "maintenance_storm",
]
# why a proposal was given up (withheld/1 reason "dropped: <why>"; in words in withheld.py)
Dropped = Literal[
    "human_hold",
    "replayed",
    "maintenance",
    "not_our_cordon",
    "episode_over",
    "cleared",
    "expired",
    "superseded",
    "reported",
    "window_over",
    "out_of_service",
]
Act = Literal["act"]
Drop = Literal["drop"]
ACT: Final[Act] = "act"
DROP: Final[Drop] = "drop"
Verdict = Hold | Act | Drop

# why a proposal is withheld -> the pool alert that reports it (None: transient, no alert)
WITHHELD_ALERT: dict[Hold, PoolAlert | None] = {
    "budget": "budget",
    "fatal_ceiling": "budget",
    "capacity": "capacity",
    "slow_start": "throttle",
    "rate_limit": "throttle",
    "busy": None,
    "awaiting_cordon": None,
    "correlating": None,  # silence only: waiting silence_grace_s to see its peers
    # above the pool: the caps report as a spent budget; a common cause raises its own alert;
    # membership holds are for the inventory's owner to fix
    "zone_cap": "budget",
    "fleet_cap": "budget",
    "common_cause": None,
    "not_in_inventory": None,
    "inventory_mismatch": None,
    # scheduled maintenance (the plan keeps the reason): its allowance spent reports as a
    # spent budget; a storm of notices raises its common-cause alert
    "maintenance_budget": "budget",
    "maintenance_zone_cap": "budget",
    "maintenance_fleet_cap": "budget",
    "maintenance_storm": None,
}
