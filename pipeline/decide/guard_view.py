"""The fleet as one pool's decision sees it: membership, the caps above the pool, the
maintenance allowances and the common causes, as gates that say None (let through) or why not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import Settings
from pipeline.decide.caps import cap, maintenance_allowance
from pipeline.decide.causes import onset_names
from pipeline.decide.guard_state import (
    FLEET,
    ONSET,
    SCOPES,
    SILENCE,
    GuardState,
    Member,
    cause_check,
    enforced,
    pool_of,
    scope_name,
)
from pipeline.decide.health_state import NOT_READY
from pipeline.decide.verdicts import Hold
from pipeline.model import Proposal, Target, target_key


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
        checks = checks_of(proposal)
        if SILENCE in checks and self._not_ready_alone(target_key(target), member):
            return None  # its own evidence: Kubernetes says it is not Ready, and few others
        held = set()
        for check in checks:
            if check == SILENCE and self._silent_together(target_key(target)):
                held.add(check)
                continue
            canaries = 0 if check == SILENCE else self.settings.policy.common_cause_canaries
            for scope in SCOPES:
                cause = self.state.causes.get(f"{check}|{scope}|{scope_name(scope, member)}")
                if cause is None or cause.released:
                    continue
                let_through = cause.removed + sum(1 for _, p in admitted if check in checks_of(p))
                if let_through >= canaries:
                    held.add(check)
                    break
        return "common_cause" if held and held == checks else None


    def _not_ready_alone(self, key: str, member: Member) -> bool:
        """Kubernetes reports the target not Ready (the watcher's not_ready), and that is no
        common cause in its scopes (a partition makes a zone's nodes silent and not Ready)."""
        if key not in self.state.raised.get(NOT_READY, {}):
            return False
        return not any(
            f"{NOT_READY}|{scope}|{scope_name(scope, member)}" in self.state.causes
            for scope in SCOPES
        )

    def _silent_together(self, key: str) -> bool:
        """Did the target fall silent with others: an onset cause open on one of its windows
        (causes.py; no canaries, no release: silence of a group shows nothing of a node's)."""
        mark = self.state.raised.get(SILENCE, {}).get(key)
        if mark is None:
            return False
        return any(
            f"{SILENCE}|{ONSET}|{name}" in self.state.causes for name in onset_names(mark)
        )


def checks_of(proposal: Proposal) -> set[str]:
    return {cause_check(check) for check in proposal.reason.checks}
