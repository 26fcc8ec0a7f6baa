"""The health machine's state per target, and the vocabulary of its plans.

pipeline/decide/health.py says how the state moves; health_signals.py applies one signal,
health_settle.py moves the state over time, health_propose.py says what to ask for.
"""

from __future__ import annotations

import msgspec

from pipeline.decide.rewind import Past
from pipeline.model import (
    REPAIR_KINDS,
    Action,
    Finding,
    HealthStateName,
    NodeEvent,
    Target,
)

# Rough strength of a repair, to place a recommendation on a ladder that may lack it.
# A watcher's not_ready (the node's Ready condition went False or Unknown) until its ready: shown
# among the node state's open checks, never a condition (it proposes nothing). The guard takes
# it as the node's own evidence beside silence (guard_view.py).
NOT_READY = "node.not_ready"
RANK = {"reset_gpu": 1, "reboot": 2, "repair": 2, "repair_slice": 2, "replace": 3}
CORDON, DRAIN, REPAIR = 1, 2, 3  # plan levels; 0 = watch only
# Network-element repairs are for the network team's actuator (fabric localisation): on a
# node they are only something to watch.
LEVEL = {
    "none": 0,
    "watch": 0,
    "repair_link": 0,
    "repair_switch": 0,
    "cordon": CORDON,
    "drain": DRAIN,
} | dict.fromkeys(REPAIR_KINDS, REPAIR)


class Condition(msgspec.Struct, kw_only=True):
    """One open check on one device (or on the target itself)."""

    check: str
    device: str | None = None
    first_ts: int
    last_ts: int
    severity: str
    fatal: bool
    recommended: str
    finding_ids: list[str]  # the first and the latest
    message: str = ""
    waived: bool = False  # open when a human released the target: not evidence any more


class Outstanding(msgspec.Struct, kw_only=True):
    """The proposal we are waiting on (one at a time per target)."""

    proposal_id: str
    kind: str
    first_ts: int
    last_ts: int
    dry_run: bool = False  # answered by a dry-run action: re-sent only rarely
Logged = Finding | NodeEvent | Action | int  # int: a heartbeat at that ts (moves the clock only)


class HealthState(msgspec.Struct, kw_only=True):
    target: Target
    state: HealthStateName = "healthy"
    since: int
    clock: int  # newest event time seen for this target
    episode: str | None = None
    round: int = 0  # proposals decided in this episode (part of the proposal id)
    conditions: dict[str, Condition] = {}
    unhealthy_since: int | None = None  # start of the stretch with an actionable condition
    quiet_since: int | None = None  # start of the stretch without one
    flaps: list[int] = []  # when actionable conditions closed, within flap_window_s
    cordoned_by_us: bool = False
    human_hold: bool = False
    maintenance: bool = False  # cordoned by the policy for scheduled maintenance
    drained: bool = False
    # our drain (or repair) was not carried out: blocked, skipped, refused, or no "drained" by
    # drain_timeout_s; no repair follows unless settings.repair_after_failed_drain
    drain_failed: bool = False
    repairs: list[int] = []  # when repair actions were carried out, within repair_window_s
    repair_kind: str | None = None
    repaired_at: int | None = None  # when a repair was last reported done (repaired / created)
    last_action: str | None = None  # "<kind>:<action_id>" of the last action carried out
    applied: list[str] = []  # recent action ids, so a replayed action is a no-op
    outstanding: Outstanding | None = None
    past: Past[Logged] | None = None  # while a proposal is in flight (pipeline/decide/rewind.py)
    ahead: list[NodeEvent] = []  # node events more than event_ahead_s ahead of the clock
    not_ready: bool = False  # a watcher said the node is not Ready (NOT_READY), until ready


def is_actionable(cond: Condition) -> bool:
    return not cond.waived and (cond.fatal or LEVEL[cond.recommended] >= CORDON)


def enter(st: HealthState, name: HealthStateName, at: int | None = None) -> None:
    """Move to `name` as of `at` (default: the target's clock)."""
    if st.state != name:
        st.state, st.since = name, st.clock if at is None else at
