"""Builders and a closed loop (health ⇄ policy) for the health, policy and alert tests.

`Loop` wires the pure functions the way both runtimes do: findings and node events go to the
health machine, its proposals and changed node states to the policy of the target's pool, the
policy's actions back to the health machine. Everything is recorded in `Loop.log` in order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pipeline.config import HealthSettings, PolicySettings
from pipeline.decide import health, policy
from pipeline.decide.health import HealthState
from pipeline.model import (
    HEARTBEAT,
    Action,
    Alert,
    CapacityEvent,
    Entity,
    Event,
    Finding,
    MaintenanceWindow,
    NodeEvent,
    NodeState,
    Proposal,
    QuotaInfo,
    Reason,
    RecommendedAction,
    Target,
    host_kind,
    target_key,
)

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def ms(seconds: float) -> int:
    return T0 + int(seconds * 1000)


def target(name: str = "n1", pool: str = "p1", kind: str = "node", zone: str = "z1") -> Target:
    return Target(cluster="c1", kind=kind, name=name, pool=pool, zone=zone)  # type: ignore[arg-type]


def finding(
    t: Target,
    at: float,
    check: str = "ecc_dbe",
    *,
    healthy: bool = False,
    fatal: bool = False,
    action: RecommendedAction = "reset_gpu",
    device: str | None = "0",
) -> Finding:
    state = "clear" if healthy else "open"
    return Finding(
        finding_id=f"fnd-{t.name}-{check}-{device}-{state}-{ms(at)}",
        ts=ms(at),
        entity=Entity(kind="gpu" if device is not None else t.kind, target=t, device=device),
        check=check,
        severity="info" if healthy else "critical",
        healthy=healthy,
        fatal=fatal,
        recommended_action="none" if healthy else action,
        message=f"{check} on {t.name}",
    )


def heartbeat(t: Target, at: float) -> Finding:
    return Finding(
        finding_id=f"fnd-{t.name}-hb-{ms(at)}",
        ts=ms(at),
        entity=Entity(kind=t.kind, target=t),
        check=HEARTBEAT,
        severity="info",
        healthy=True,
        recommended_action="none",
    )


def node_event(t: Target, at: float, kind: str, action_id: str | None = None) -> NodeEvent:
    return NodeEvent(
        ts=ms(at),
        cluster=t.cluster,
        target_kind=host_kind(t),
        target=t.name,
        pool=t.pool,
        zone=t.zone,
        kind=kind,  # type: ignore[arg-type]
        actor="fleetpulse-actuator" if action_id else "alice",
        action_id=action_id,
    )


def action_for(proposal: Proposal, at: float | None = None, *, dry_run: bool = False) -> Action:
    """The action a policy would publish for a proposal (real ids)."""
    return Action(
        action_id=f"act-{proposal.proposal_id}{'-dry' if dry_run else ''}",
        ts=proposal.ts if at is None else ms(at),
        kind=proposal.kind,
        target=proposal.target,
        reason=proposal.reason,
        dry_run=dry_run,
        proposal_id=proposal.proposal_id,
    )


def proposal(
    t: Target,
    at: float,
    kind: str = "cordon",
    *,
    fatal: bool = False,
    checks: tuple[str, ...] = ("ecc_dbe",),
    episode: str | None = None,
    pid: str | None = None,
) -> Proposal:
    episode = episode or f"ep-{t.name}-episode"
    return Proposal(
        proposal_id=pid or f"prp-{t.name}-{kind}-{episode}",
        ts=ms(at),
        kind=kind,  # type: ignore[arg-type]
        target=t,
        reason=Reason(checks=list(checks), finding_ids=[], summary=f"{kind} {t.name}"),
        fatal=fatal,
        episode=episode,
        state="degraded" if kind == "cordon" else "cordoned",
    )


def node_state(
    t: Target,
    at: float,
    state: str = "healthy",
    *,
    episode: str | None = None,
    by_us: bool = False,
    human: bool = False,
    last_action: str | None = None,
) -> NodeState:
    return NodeState(
        ts=ms(at),
        target=t,
        state=state,  # type: ignore[arg-type]
        since=ms(at),
        episode=episode,
        cordoned_by_us=by_us,
        human_hold=human,
        last_action=last_action,
    )


def capacity(
    at: float,
    kind: str,
    *,
    zone: str = "z1",
    pool: str | None = None,
    t: Target | None = None,
    window: tuple[float, float] | None = None,
    usage: float | None = None,
    limit: float = 100.0,
    event_id: str = "cap-event-1",
    metric: str = "GPUS",
) -> CapacityEvent:
    return CapacityEvent(
        event_id=event_id,
        ts=ms(at),
        provider="gcp",
        source="test",
        kind=kind,  # type: ignore[arg-type]
        severity="warning",
        region="r1",
        zone=zone,
        cluster=t.cluster if t else None,
        pool=pool or (t.pool if t else None),
        target_kind=host_kind(t) if t else None,
        target=t.name if t else None,
        quota=None if usage is None else QuotaInfo(metric=metric, limit=limit, usage=usage),
        window=None
        if window is None
        else MaintenanceWindow(start=ms(window[0]), end=ms(window[1])),
    )


@dataclass
class Loop:
    """Health and policy wired together, breadth-first like records through topics."""

    health_settings: HealthSettings = field(default_factory=HealthSettings)
    policy_settings: PolicySettings = field(default_factory=PolicySettings)
    health: dict[str, health.HealthState] = field(default_factory=dict)
    policy: dict[str, policy.PolicyState] = field(default_factory=dict)
    log: list[Event] = field(default_factory=list)
    # assert the one rule of state ownership (pipeline/stages/topology.py): a stage changes
    # the state it is given and returns that state, it never works on a copy
    check_inputs: bool = False

    def feed(self, signal: Finding | NodeEvent | CapacityEvent | Proposal) -> list[Event]:
        start = len(self.log)
        queue: deque[Event] = deque([signal])
        while queue:
            item = queue.popleft()
            if isinstance(item, Finding | NodeEvent | Action):
                queue.extend(self._health(item))
            elif isinstance(item, Proposal | NodeState | CapacityEvent):
                queue.extend(self._policy(item))
        return self.log[start:]

    def _health(self, signal: Finding | NodeEvent | Action) -> list[Event]:
        key = target_key(health.target_of(signal))
        before = self.health.get(key)
        was = None if before is None else health.to_node_state(before)
        after, proposals = health.transition(before, signal, self.health_settings)
        assert not self.check_inputs or before is None or before is after, "worked on a copy"
        self.health[key] = after
        out: list[Event] = []
        state = health.to_node_state(after)
        if was is None or _changed(was, state):
            out.append(state)
        out += proposals  # after the state they were made in, as the runtimes send them
        self.log.extend(out)
        return out

    def _policy(self, signal: Proposal | NodeState | CapacityEvent) -> list[Event]:
        pools = (
            [signal.target.pool]
            if not isinstance(signal, CapacityEvent)
            else ([signal.pool] if signal.pool else sorted(self.policy))
        )
        out: list[Event] = []
        for pool in pools:
            before = self.policy.get(pool)
            state, actions, alerts = policy.decide(before, signal, self.policy_settings)
            assert not self.check_inputs or before is None or before is state, "worked on a copy"
            self.policy[pool] = state
            out += [*alerts, *actions]
        self.log.extend(out)
        return [event for event in out if isinstance(event, Action)]

    def actions(self, *, real: bool | None = None) -> list[Action]:
        return [
            e for e in self.log if isinstance(e, Action) and (real is None or e.dry_run is not real)
        ]

    def alerts(self) -> list[Alert]:
        return [e for e in self.log if isinstance(e, Alert)]

    def state(self, t: Target) -> HealthState:
        return self.health[target_key(t)]


def _changed(before: NodeState, after: NodeState) -> bool:
    return _strip(before) != _strip(after)  # ts moves with every heartbeat: not news


def _strip(state: NodeState) -> tuple[object, ...]:
    return tuple(getattr(state, f) for f in state.__struct_fields__ if f != "ts")
