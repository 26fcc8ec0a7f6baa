"""One pool's policy state: what it knows of its targets, its open actions, the proposals it
holds back, its maintenance plans and its alerts (pipeline/decide/policy.py says how it moves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from pipeline.decide.verdicts import Hold
from pipeline.model import Action, Alert, HealthStateName, Proposal, Target, WithheldRecord

OUT_OF_SERVICE: frozenset[str] = frozenset({"cordoned", "draining", "repairing"})


class TargetView(msgspec.Struct, kw_only=True, frozen=True):
    """The latest NodeState of a pool member, as far as the policy needs it."""

    target: Target
    state: HealthStateName
    episode: str | None = None
    cordoned_by_us: bool = False
    human_hold: bool = False
    last_action: str | None = None
    ts: int = 0

    @property
    def unavailable(self) -> bool:
        return self.cordoned_by_us or self.human_hold or self.state in OUT_OF_SERVICE


class OpenAction(msgspec.Struct, kw_only=True, frozen=True):
    """A real action the health machine has not reported back yet (at most one per target)."""

    action_id: str
    proposal_id: str
    kind: str
    ts: int
    expires_at: int
    maintenance: bool = False


class Withheld(msgspec.Struct, kw_only=True, frozen=True):
    proposal: Proposal
    first_ts: int
    last_ts: int
    # why it waits; "" before its first pass through the gates (the stored form: a state
    # written by the previous release reads)
    reason: Hold | Literal[""] = ""
    # held by a common cause at some point: when the cause ends it goes only if the node's own
    # evidence persists (its checks still open in a node state), fatal or not
    common: bool = False


class Acted(msgspec.Struct, kw_only=True, frozen=True):
    ts: int
    dry_run: bool


class Maintenance(msgspec.Struct, kw_only=True, frozen=True):
    event_id: str
    target: Target
    start: int
    end: int
    release_at: int
    cordoned: bool = False
    drained: bool = False
    dry_run: bool = False
    done: bool = False
    announced: int = 0  # the notice's time (the maintenance-storm rule counts notices by it)
    withheld: Hold | Literal[""] = ""  # why its cordon is waiting, "" when it is not


class PolicyState(msgspec.Struct, kw_only=True):
    pool: str
    cluster: str = ""
    clock: int = 0
    targets: dict[str, TargetView] = {}
    open: dict[str, OpenAction] = {}
    acted: dict[str, Acted] = {}  # proposal id -> what we did, for dedupe
    withheld: dict[str, Withheld] = {}  # by target: the latest proposal only
    shadow: dict[str, str] = {}  # dry-run cordons: target -> episode
    cordons: list[int] = []  # when cordons went out (slow start)
    disruptive: list[int] = []  # when cordons and repairs went out (rate limit)
    slow_start_until: int = 0
    quota_until: int = 0  # the latest of quota_holds
    quota_holds: dict[str, int] = {}  # by quota metric: a zone has several quotas at once
    stockout_until: int = 0
    capacity_note: str = ""
    maintenance: dict[str, Maintenance] = {}  # by target
    alerts: dict[str, Alert] = {}  # firing: "budget" / "capacity" / "throttle" / "cordon:<target>"
    # by target: our cordon (its alert firing) that no node state has reported yet; kept past
    # the open action's expiry, as node states published before the health machine saw it
    # may still come (a backlog brings our actions back late)
    unreported: dict[str, str] = {}


@dataclass
class Out:
    actions: list[Action] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    withheld: list[WithheldRecord] = field(default_factory=list)


def stale(proposal: Proposal, view: TargetView) -> bool:
    # A node state the health machine published after the proposal, in another episode: the
    # proposal is a replay from the past (a redelivery, a restarted consumer), not a request.
    return view.ts > proposal.ts and view.episode != proposal.episode
