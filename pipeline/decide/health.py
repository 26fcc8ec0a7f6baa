"""Node / slice health state machine: transition(state, signal) -> (state, proposals).

One HealthState per target (a node, or a TPU slice repaired as one unit). Signals:

- Finding: an unhealthy finding opens (or refreshes) a condition keyed by check and device; a
  healthy one with the same check (and device) closes it; `heartbeat` findings only move the
  clock. Time is the newest signal ts seen (event time), never the wall clock.
- NodeEvent: what someone else did. A cordon without action_id is a human hold: we stop
  proposing and never release it. An uncordon without action_id of something held (by a human
  or by us) cancels our episode: open conditions are waived (no re-cordon for them until they
  close and come back, or another check opens). `drained`, `repaired`, `created`, `deleted`
  report progress. Cordon/uncordon events that carry our action_id are echoes: the Action feed
  is authoritative for those. `held` (an actuator found a person's hold and did not act) is a
  human hold; `blocked` (a drain a PodDisruptionBudget refused), `skipped` (expired before it
  could start) and `refused` (the actuator found it not credible) answering our current action
  say it was not carried out: a cordon that never landed leaves the target in service (a new
  cordon is proposed while its conditions persist); a drain or repair that did not happen
  stops the ladder: no repair of a node whose pods may still run (a person's turn), unless
  `repair_after_failed_drain` opts in. `repair_requested`, `ready` and `not_ready` are for
  people and the record: the target stays where it is.
- Action: our own action as published by the policy; this is how we learn a proposal was
  carried out. A dry-run action is not carried out: the state does not move, and the proposal
  is re-sent only every `dry_run_reproposal_s` (not every `reproposal_s`), so dry run cannot
  loop; the policy drops those re-sends while dry run is still on, and acts for real once it is
  switched off.

States (what we last saw happen, not what we wish):

    healthy ──unhealthy finding──▶ suspect ──actionable, persisted persist_s──▶ degraded
       ▲  ◀──all closed (unless flapping: held suspect until quiet flap_hold_s)──┘  │ fatal: at once
       │                                                   propose cordon ◀─────────┘
       │   cordon action ──▶ cordoned ──(plan ≥ drain) drain action──▶ draining
       │                        │                                        │ drained (a drain
       │                        │                                        │ blocked, skipped or
       │                        │                                        │ past drain_timeout_s:
       │                        │                                        │ stays, a person's turn)
       │                        │            (plan = repair) repair action▼
       │                        │                                      repairing
       │                        │ conditions closed                      │ repaired / created
       │                        ▼                                        ▼
       └── uncordon action ◀── probation (healthy for probation_s) ◀─────┘
                                 │ condition back and persisting: repair failed → cordoned,
                                 ▼ next rung of the ladder (reset_gpu → reboot → replace)

The plan comes from the recommended actions of the open, actionable conditions ("none" and
"watch" never act): "cordon" only cordons (and waits for the conditions to close), "drain" also
drains, a repair kind also repairs. Persistence counts from the start of the stretch in which
some actionable condition was open, whichever check (alternating checks do not reset it).
Repairs escalate along a ladder by the number of repairs in `repair_window_s`; after
`max_repairs` the target stays cordoned with nothing more proposed: a human's turn. After a
repair, conditions stay open until their detectors clear them (detectors report on change
only); one still open after probation_s, or new evidence persisting persist_s, fails it.

Proposals: one outstanding at a time, id = stable_id("prp", episode, kind, round) where round
counts the decisions of the episode, so a re-send carries the same id and the policy dedupes;
episode = stable_id("ep", target_key, start of the unhealthy stretch). A target released by us
or recreated starts any new episode afresh. Maintenance cordons (reason.checks ==
["maintenance"]) freeze proposals until the policy releases them. NodeState.last_action is
"<kind>:<action_id>" of the last real action applied: the policy's sign that it was seen.

Our actions come back late while a backlog is worked off: the findings of the next hour may
be in before the cordon they answer. So that a backlog decides as live, the state keeps, while a
proposal of ours is in flight, itself as of that proposal and the signals since (`Past`); an
action that comes back behind signals newer than it is put where it would have come live (after
the proposal it answers and the signals no newer than its ts) and what followed is applied
again: the proposals, their ids and their ts are those of the live run, whatever the lag (up to
`late_action_s`). The policy dates an action it takes at once by its proposal's ts.

Pure and deterministic: `transition` changes the state it is given and returns it.
"""

from __future__ import annotations

from typing import cast

import msgspec

from pipeline.config import HealthSettings
from pipeline.ids import stable_id
from pipeline.model import (
    Action,
    ActionKind,
    Finding,
    HealthStateName,
    NodeEvent,
    NodeState,
    Proposal,
    Reason,
    Target,
)

HEARTBEAT = "heartbeat"
MAINTENANCE_CHECK = "maintenance"  # reason.checks of the policy's maintenance actions
PRE_CORDON: frozenset[str] = frozenset({"healthy", "suspect", "degraded"})
REPAIR_KINDS: frozenset[str] = frozenset(
    {"reset_gpu", "reboot", "repair", "replace", "repair_slice"}
)
_RECREATE = frozenset({"replace", "repair", "repair_slice"})  # the target is deleted, then created
# Rough strength of a repair, to place a recommendation on a ladder that may lack it.
_RANK = {"reset_gpu": 1, "reboot": 2, "repair": 2, "repair_slice": 2, "replace": 3}
_CORDON, _DRAIN, _REPAIR = 1, 2, 3  # plan levels; 0 = watch only
# Network-element repairs are for the network team's actuator (fabric localisation): on a
# node they are only something to watch.
_LEVEL = {
    "none": 0,
    "watch": 0,
    "repair_link": 0,
    "repair_switch": 0,
    "cordon": _CORDON,
    "drain": _DRAIN,
} | dict.fromkeys(REPAIR_KINDS, _REPAIR)
_SEVERITY = {"info": 0, "warning": 1, "critical": 2}
MAX_CONDITIONS = 256  # beyond this, new devices of a check share one condition
_APPLIED_MAX = 16
_FINDING_IDS_MAX = 16
_MESSAGE_MAX = 240  # kept per condition; the finding itself is in the lake
_MS = 1000


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


class Past(msgspec.Struct, kw_only=True):
    """The state right after the oldest proposal of ours still in flight (msgpack, without its
    own past) and the signals since, so that a late action can be put where it came live."""

    state: bytes
    signals: list[Logged] = []
    # proposal id -> (len(signals), clock) when first made; gone once its action came back
    flight: dict[str, tuple[int, int]] = {}


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
    past: Past | None = None  # while a proposal is in flight (see the module's docstring)
    ahead: list[NodeEvent] = []  # node events more than event_ahead_s ahead of the clock


_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(HealthState)


def target_key(target: Target) -> str:
    return f"{target.cluster}/{target.kind}/{target.name}"


def transition(
    state: HealthState | None, signal: Finding | NodeEvent | Action, settings: HealthSettings
) -> tuple[HealthState, list[Proposal]]:
    """Apply one signal to one target's state; return the new state and what to propose."""
    target = _target_of(signal)
    if state is None:
        st = HealthState(target=target, since=signal.ts, clock=signal.ts)
    else:
        if target_key(state.target) != target_key(target):
            raise ValueError(
                f"signal for {target_key(target)} sent to the state of {target_key(state.target)}"
            )
        # the state given is changed in place and returned: the driver keeps the snapshot
        # to roll back to (pipeline/stages/topology.py)
        st = state
    repeat = isinstance(signal, Action) and signal.action_id in st.applied
    if isinstance(signal, Action) and not repeat:
        replayed = _replay(st, signal, settings)
        if replayed is not None:
            return st, replayed
    proposals = _apply(st, signal, settings)
    if not repeat:
        _remember(st, signal, proposals, settings)
    return st, proposals


def _apply(st: HealthState, signal: Logged, settings: HealthSettings) -> list[Proposal]:
    ts = _ts(signal)
    if isinstance(signal, NodeEvent) and ts > st.clock + settings.event_ahead_s * _MS:
        if _a_persons_say(signal):
            return _persons_say_now(st, signal, settings)
        # Far ahead of this target's findings (a backlog's sparse topic, let through by the
        # aligner's grace): applied in event-time order, once the findings before it are in.
        st.ahead = sorted([*st.ahead, signal], key=lambda e: e.ts)
        return []
    proposals: list[Proposal] = []
    while st.ahead and st.ahead[0].ts <= ts:
        event, st.ahead = st.ahead[0], st.ahead[1:]
        proposals += _apply_one(st, event, settings)
    return proposals + _apply_one(st, signal, settings)


def _a_persons_say(event: NodeEvent) -> bool:
    return event.kind == "held" or (
        event.action_id is None and event.kind in ("cordoned", "uncordoned")
    )


def _persons_say_now(st: HealthState, event: NodeEvent, settings: HealthSettings) -> list[Proposal]:
    # A person's cordon, hold or uncordon does not wait for the findings before it: ahead of
    # them may as well mean the node's metrics stopped (an outage) as a backlog. Waiting would
    # let us cordon and drain a node a person has taken, or release one a person already put
    # back (and took from us). A hold applied early can only stop us; an uncordon ends our
    # claim and waives what was open, as it would on time. The clock stays, so the findings
    # still to come are not made late.
    st.target = _target_of(event)
    _on_node_event(st, event)
    _settle(st, settings)
    return _propose(st, settings)


def _apply_one(st: HealthState, signal: Logged, settings: HealthSettings) -> list[Proposal]:
    if isinstance(signal, int):
        st.clock = max(st.clock, signal)
    else:
        st.target = _target_of(signal)  # identity stays current: a node can move to a pool
        st.clock = max(st.clock, signal.ts)
        if isinstance(signal, Finding):
            _on_finding(st, signal)
        elif isinstance(signal, NodeEvent):
            _on_node_event(st, signal)
        else:
            _on_action(st, signal)
    _prune(st, settings)
    _settle(st, settings)
    return _propose(st, settings)


def to_node_state(state: HealthState) -> NodeState:
    """The record for the compacted fleet.node-state topic (ts = newest event time seen)."""
    return NodeState(
        ts=state.clock,
        target=state.target,
        state=state.state,
        since=state.since,
        episode=state.episode,
        cordoned_by_us=state.cordoned_by_us,
        human_hold=state.human_hold,
        repairs=len(state.repairs),
        last_action=state.last_action,
        open_checks=sorted({c.check for c in state.conditions.values()}),
    )


def _target_of(signal: Finding | NodeEvent | Action) -> Target:
    if isinstance(signal, Finding):
        return signal.entity.target
    if isinstance(signal, Action):
        return signal.target
    return Target(
        cluster=signal.cluster,
        kind=signal.target_kind,
        name=signal.target,
        pool=signal.pool,
        zone=signal.zone,
    )


# --- signals ------------------------------------------------------------------------------


def _on_finding(st: HealthState, finding: Finding) -> None:
    if finding.check == HEARTBEAT:
        return
    key = f"{finding.check}|{finding.entity.device or ''}"
    if finding.healthy:
        _close(st, finding, key)
        return
    cond = st.conditions.get(key)
    if cond is None and len(st.conditions) >= MAX_CONDITIONS:
        key = f"{finding.check}|*"
        cond = st.conditions.get(key)
    if cond is None:
        st.conditions[key] = Condition(
            check=finding.check,
            device=finding.entity.device,
            first_ts=finding.ts,
            last_ts=finding.ts,
            severity=finding.severity,
            fatal=finding.fatal,
            recommended=finding.recommended_action,
            finding_ids=[finding.finding_id],
            message=finding.message[:_MESSAGE_MAX],
        )
        return
    cond.first_ts = min(cond.first_ts, finding.ts)
    cond.last_ts = max(cond.last_ts, finding.ts)
    cond.fatal = cond.fatal or finding.fatal
    if _strength(finding.recommended_action) > _strength(cond.recommended):
        cond.recommended = finding.recommended_action
    if _SEVERITY[finding.severity] > _SEVERITY.get(cond.severity, 0):
        cond.severity = finding.severity
    if finding.finding_id != cond.finding_ids[0]:
        cond.finding_ids = [cond.finding_ids[0], finding.finding_id]
    cond.message = finding.message[:_MESSAGE_MAX] or cond.message


def _strength(recommended: str) -> tuple[int, int]:
    return _LEVEL[recommended], _RANK.get(recommended, 0)


def _close(st: HealthState, finding: Finding, key: str) -> None:
    # A device-less clear closes the check on every device; a clear older than the latest
    # unhealthy evidence is stale (out-of-order delivery) and closes nothing.
    if finding.entity.device is None:
        keys = [k for k, c in st.conditions.items() if c.check == finding.check]
    else:
        keys = [key] if key in st.conditions else []
    for k in keys:
        cond = st.conditions[k]
        if finding.ts < cond.last_ts:
            continue
        del st.conditions[k]
        if _actionable(cond):
            st.flaps.append(finding.ts)


def _on_node_event(st: HealthState, event: NodeEvent) -> None:
    if event.action_id is not None and event.kind in ("cordoned", "uncordoned"):
        return
    if event.kind == "cordoned":
        # Cordoning is idempotent in Kubernetes: a "cordoned" while we hold the cordon is a
        # watcher echoing ours, not a person, so it does not become a human hold.
        if not st.cordoned_by_us:
            _human_hold(st)
    elif event.kind == "uncordoned":
        if st.human_hold or st.cordoned_by_us:
            _human_release(st)
    elif event.kind == "held":
        # an actuator refused to act because a person holds the target (or a watcher saw the
        # hold appear): the same as a person's cordon, whoever reports it
        _human_hold(st)
    elif event.kind == "drained":
        if st.state == "draining":
            st.drained, st.drain_failed = True, False
    elif event.kind in _NOT_CARRIED_OUT and event.action_id is not None:
        _not_carried_out(st, event.action_id)
    elif event.kind == "repaired":
        _repaired(st, fresh_node=False)
    elif event.kind == "created":
        if st.state == "repairing":
            _repaired(st, fresh_node=True)
        else:
            _reset(st)
    elif event.kind == "deleted" and not _our_recreate(st, event):
        _reset(st)


def _our_recreate(st: HealthState, event: NodeEvent) -> bool:
    # The first half of a replacement we ordered: the node is gone until "created", and out of
    # service meanwhile, even where a person's cordon came in between (forgetting it here let
    # the budget count the missing node as available).
    if st.state == "repairing" and st.repair_kind in _RECREATE:
        return True
    kind, _, action_id = (st.last_action or "").partition(":")
    return event.action_id is not None and action_id == event.action_id and kind in _RECREATE


_NOT_CARRIED_OUT = frozenset({"blocked", "skipped", "refused"})


def _not_carried_out(st: HealthState, action_id: str) -> None:
    """An actuator reports our current action was not carried out (an echo of an older one
    changes nothing: the state has moved on since)."""
    kind, _, current = (st.last_action or "").partition(":")
    if current != action_id or not st.cordoned_by_us:
        return
    if kind == "cordon":
        # the node was never cordoned: it is in service, and our claim on it ends here
        st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
        st.outstanding = None
        open_now = any(_actionable(c) for c in st.conditions.values())
        _enter(st, "degraded" if open_now else "healthy")
    elif kind == "drain" or kind in REPAIR_KINDS:
        st.drain_failed = True  # pods may still run: no repair on top (a person's turn)


def _human_hold(st: HealthState) -> None:
    st.human_hold = True
    st.outstanding = None
    if st.state in PRE_CORDON or (st.state == "probation" and not st.cordoned_by_us):
        _enter(st, "cordoned")  # out of service: a person's cordon, shown as such


def _human_release(st: HealthState) -> None:
    # A person put the target back in service: our episode is over and what was open then is
    # waived (draino drained a node an admin had uncordoned; we must not).
    was_out = st.state not in PRE_CORDON
    st.human_hold = st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
    st.outstanding = None
    for cond in st.conditions.values():
        cond.waived = True
    st.unhealthy_since = None
    st.episode, st.round = None, 0
    _enter(st, "probation" if was_out and st.conditions else "healthy")
    st.quiet_since = st.clock


def _repaired(st: HealthState, *, fresh_node: bool) -> None:
    if st.human_hold or (st.state in PRE_CORDON and not st.cordoned_by_us):
        return  # someone else's business, or nothing of ours to finish
    if fresh_node:  # a recreated node object comes up schedulable: our cordon went with it
        st.cordoned_by_us = st.drained = False
    st.outstanding = None
    st.repaired_at = st.clock
    _enter(st, "probation")
    st.quiet_since = None


def _reset(st: HealthState) -> None:
    fresh = HealthState(target=st.target, since=st.clock, clock=st.clock, past=st.past)
    _assign(st, fresh)


def _assign(st: HealthState, other: HealthState) -> None:
    for field in HealthState.__struct_fields__:
        setattr(st, field, getattr(other, field))


def _on_action(st: HealthState, action: Action) -> None:
    # Our own action comes back through Kafka, later than the findings of the same moment when
    # a backlog is worked off (minutes to an hour of event time); what it starts is dated by
    # the action's own ts (when the policy acted), not by when it arrived, so drain timeouts,
    # repairs and probation run from the same `since` as in the live and embedded runs.
    at = min(action.ts, st.clock)
    if action.action_id in st.applied:
        return
    if action.dry_run:
        if st.outstanding is not None and st.outstanding.proposal_id == action.proposal_id:
            st.outstanding.dry_run = True
        return
    st.applied = [*st.applied, action.action_id][-_APPLIED_MAX:]
    st.last_action = f"{action.kind}:{action.action_id}"
    if st.outstanding is not None and st.outstanding.proposal_id == action.proposal_id:
        st.outstanding = None
    if action.kind == "cordon":
        st.cordoned_by_us = True
        st.maintenance = MAINTENANCE_CHECK in action.reason.checks
        if st.state in PRE_CORDON:
            st.drained = st.drain_failed = False
            _enter(st, "cordoned", at)
    elif action.kind == "drain":
        st.drained = st.drain_failed = False
        _enter(st, "draining", at)
    elif action.kind == "uncordon":
        st.cordoned_by_us = st.maintenance = st.drained = st.drain_failed = False
        if not st.human_hold:
            # Back in service: anything still open is judged afresh from then (a new episode,
            # persistence counted again), never folded into the episode just closed.
            open_now = any(_actionable(c) for c in st.conditions.values())
            st.episode, st.round = None, 0
            st.unhealthy_since = at if open_now else None
            _enter(st, "healthy", at)
    else:
        st.repairs = [*st.repairs, action.ts]
        st.repair_kind = action.kind
        if st.state == "probation" and st.repaired_at is not None and st.repaired_at >= at:
            return  # reported done before the action came back: it is over already
        _enter(st, "repairing", at)


# --- late actions ------------------------------------------------------------------------


def _remember(
    st: HealthState, signal: Logged, proposals: list[Proposal], settings: HealthSettings
) -> None:
    """Log `signal` while a proposal is in flight; start a past with the first one."""
    past = st.past
    if past is None:
        if proposals:
            flight = {p.proposal_id: (0, st.clock) for p in proposals}
            st.past = Past(state=_snapshot(st), flight=flight)
        return
    heartbeat = isinstance(signal, Finding) and signal.check == HEARTBEAT
    past.signals.append(signal.ts if heartbeat and not isinstance(signal, int) else signal)
    if isinstance(signal, Action):
        past.flight.pop(signal.proposal_id, None)
    for proposal in proposals:
        past.flight.setdefault(proposal.proposal_id, (len(past.signals), st.clock))
    _rebase(st, past, settings)


def _rebase(st: HealthState, past: Past, settings: HealthSettings) -> None:
    """Start the past at the oldest proposal still in flight (none: no past). One whose action
    has not come back within late_action_s is not waited for any more."""
    horizon = st.clock - settings.late_action_s * _MS
    past.flight = {k: made for k, made in past.flight.items() if made[1] >= horizon}
    if not past.flight:
        st.past = None
        return
    start = min(at for at, _ in past.flight.values())
    if start == 0:
        return
    if start == len(past.signals):
        past.state = _snapshot(st)
    else:
        then = _DECODE.decode(past.state)
        for signal in past.signals[:start]:
            _apply(then, signal, settings)
        past.state = _ENCODE.encode(then)
    past.signals = past.signals[start:]
    past.flight = {k: (at - start, clock) for k, (at, clock) in past.flight.items()}


def _snapshot(st: HealthState) -> bytes:
    past, st.past = st.past, None
    try:
        return _ENCODE.encode(st)
    finally:
        st.past = past


def _replay(st: HealthState, action: Action, settings: HealthSettings) -> list[Proposal] | None:
    """An action that comes back behind newer signals: from the past, apply it where it came
    live and the signals after it again. Returns the proposals made from it on (each id once,
    as first made), or None when it is not late (or too late to place: applied as it comes)."""
    past = st.past
    if past is None:
        return None
    at = _place(past, action)
    if at == len(past.signals):
        return None
    then = _DECODE.decode(past.state)
    then.past = Past(state=past.state, flight={k: m for k, m in past.flight.items() if m[0] == 0})
    for signal in past.signals[:at]:
        _remember(then, signal, _apply(then, signal, settings), settings)
    proposals: dict[str, Proposal] = {}
    for signal in [action, *past.signals[at:]]:
        made = _apply(then, signal, settings)
        _remember(then, signal, made, settings)
        for proposal in made:
            proposals.setdefault(proposal.proposal_id, proposal)
    _assign(st, then)
    return list(proposals.values())


def _place(past: Past, action: Action) -> int:
    """Where `action` came live among the logged signals: after the proposal it answers and
    the signals no newer than it (a policy that acted later than proposed acted at its ts)."""
    made = past.flight.get(action.proposal_id)
    at = made[0] if made is not None else 0
    while at < len(past.signals) and _ts(past.signals[at]) <= action.ts:
        at += 1
    return at


def _ts(signal: Logged) -> int:
    return signal if isinstance(signal, int) else signal.ts


# --- time and state -----------------------------------------------------------------------


def _prune(st: HealthState, settings: HealthSettings) -> None:
    st.flaps = [t for t in st.flaps if st.clock - t < settings.flap_window_s * _MS][-64:]
    st.repairs = [t for t in st.repairs if st.clock - t < settings.repair_window_s * _MS][-32:]


def _actionable(cond: Condition) -> bool:
    return not cond.waived and (cond.fatal or _LEVEL[cond.recommended] >= _CORDON)


def _flapping(st: HealthState, settings: HealthSettings) -> bool:
    return len(st.flaps) > settings.flap_max


def _held(st: HealthState, settings: HealthSettings) -> bool:
    """A flapping target stays suspect until it has been quiet for flap_hold_s."""
    return _flapping(st, settings) and st.clock - st.flaps[-1] < settings.flap_hold_s * _MS


def _enter(st: HealthState, name: HealthStateName, at: int | None = None) -> None:
    """Move to `name` as of `at` (default: the target's clock)."""
    if st.state != name:
        st.state, st.since = name, st.clock if at is None else at


def _settle(st: HealthState, settings: HealthSettings) -> None:
    actionable = [c for c in st.conditions.values() if _actionable(c)]
    if actionable:
        st.quiet_since = None
        if st.unhealthy_since is None:
            st.unhealthy_since = min(c.first_ts for c in actionable)
    else:
        st.quiet_since = st.clock if st.quiet_since is None else st.quiet_since
        if not (st.state in PRE_CORDON and _held(st, settings)):
            st.unhealthy_since = None
    if st.human_hold or st.maintenance:
        return
    if st.state in PRE_CORDON:
        _settle_pre_cordon(st, actionable, settings)
    elif st.state == "probation":
        _settle_probation(st, actionable, settings)
    elif st.state in ("cordoned", "draining"):
        if not actionable:
            _enter(st, "probation")
        elif st.state == "draining" and st.clock - st.since >= settings.drain_timeout_s * _MS:
            # no "drained" in time: the pods may still run, so no repair on top of them unless
            # opted in (NVSentinel's DeleteAfterTimeout repairs anyway)
            st.drain_failed = not st.drained


def _settle_pre_cordon(
    st: HealthState, actionable: list[Condition], settings: HealthSettings
) -> None:
    name: HealthStateName
    if actionable:
        required = settings.persist_s * _MS
        if _flapping(st, settings):
            required *= settings.flap_persist_factor
        since = st.unhealthy_since if st.unhealthy_since is not None else st.clock
        persisted = st.clock - since >= required
        fatal = any(c.fatal for c in actionable)
        name = "degraded" if fatal or persisted or st.state == "degraded" else "suspect"
    elif st.conditions or _held(st, settings):
        name = "suspect"
    else:
        name = "healthy"
    if st.state == "healthy" and name != "healthy":
        first = st.unhealthy_since if st.unhealthy_since is not None else st.clock
        st.episode, st.round = stable_id("ep", target_key(st.target), first), 0
    elif name == "healthy":
        st.episode, st.round, st.outstanding = None, 0, None
    _enter(st, name)


def _settle_probation(
    st: HealthState, actionable: list[Condition], settings: HealthSettings
) -> None:
    failed = any(_failed_repair(st, c, settings) for c in actionable)
    if st.cordoned_by_us:
        if failed:
            _enter(st, "cordoned")  # we still hold it: on to the next rung of the ladder
        return
    # Back in service already (a person released it, or the node was recreated): after
    # probation_s quiet it is simply healthy; a failure starts a new episode from scratch.
    if failed or _quiet_for(st, settings.probation_s):
        st.episode, st.round = None, 0
        _enter(st, "healthy")
        _settle_pre_cordon(st, actionable, settings)


def _quiet_for(st: HealthState, seconds: int) -> bool:
    if st.quiet_since is None:
        return False
    return st.clock - max(st.quiet_since, st.since) >= seconds * _MS


def _failed_repair(st: HealthState, cond: Condition, settings: HealthSettings) -> bool:
    # New evidence after probation began fails it once it persists (fatal: at once); a condition
    # carried over from before the repair gets probation_s for its detector to clear it.
    if cond.first_ts >= st.since or cond.last_ts > st.since:
        if cond.fatal:
            return True
        return st.clock - max(cond.first_ts, st.since) >= settings.persist_s * _MS
    return st.clock - st.since >= settings.probation_s * _MS


# --- proposals ----------------------------------------------------------------------------


def _plan(st: HealthState) -> tuple[int, int]:
    """(level, repair rank) wanted by the open, not waived, actionable conditions."""
    level = rank = 0
    for cond in st.conditions.values():
        if _actionable(cond):
            level = max(level, _LEVEL[cond.recommended], _CORDON)
            rank = max(rank, _RANK.get(cond.recommended, 0))
    return level, rank


def _repair_kind(st: HealthState, rank: int, settings: HealthSettings) -> str | None:
    if len(st.repairs) >= settings.max_repairs:
        return None  # repeated repairs did not stick: leave it cordoned for a person
    ladder = settings.slice_ladder if st.target.kind == "slice" else settings.node_ladder
    start = next((i for i, kind in enumerate(ladder) if _RANK[kind] >= rank), len(ladder) - 1)
    return ladder[min(start + len(st.repairs), len(ladder) - 1)]


def _wanted(st: HealthState, settings: HealthSettings) -> str | None:
    if st.human_hold or st.maintenance:
        return None
    if st.state == "degraded":
        return "cordon"
    if not st.cordoned_by_us:
        return None  # drains, repairs and releases only ever follow a cordon of ours
    level, rank = _plan(st)
    if st.state == "cordoned" and level >= _DRAIN and not st.drained:
        return "drain"
    failed = st.drain_failed
    drained = (st.drained and not failed) or (failed and settings.repair_after_failed_drain)
    if st.state in ("cordoned", "draining") and level == _REPAIR and drained:
        return _repair_kind(st, rank, settings)
    if st.state == "probation" and _quiet_for(st, settings.probation_s):
        return "uncordon"
    return None


def _propose(st: HealthState, settings: HealthSettings) -> list[Proposal]:
    kind = _wanted(st, settings)
    if kind is None:
        st.outstanding = None
        return []
    pending = st.outstanding
    if pending is not None and pending.kind == kind:
        wait = settings.dry_run_reproposal_s if pending.dry_run else settings.reproposal_s
        if st.clock - pending.last_ts < wait * _MS:
            return []
        pending.last_ts = st.clock  # the same id again: the policy dedupes or acts now
        return [_proposal(st, pending.proposal_id, kind)]
    if st.episode is None:
        st.episode = stable_id("ep", target_key(st.target), st.clock)
    st.round += 1
    proposal_id = stable_id("prp", st.episode, kind, st.round)
    st.outstanding = Outstanding(
        proposal_id=proposal_id, kind=kind, first_ts=st.clock, last_ts=st.clock
    )
    return [_proposal(st, proposal_id, kind)]


def _proposal(st: HealthState, proposal_id: str, kind: str) -> Proposal:
    conditions = [st.conditions[k] for k in sorted(st.conditions) if _actionable(st.conditions[k])]
    assert st.episode is not None
    return Proposal(
        proposal_id=proposal_id,
        ts=st.clock,
        kind=cast(ActionKind, kind),
        target=st.target,
        reason=_reason(st, kind, conditions),
        fatal=any(c.fatal for c in conditions),
        episode=st.episode,
        state=st.state,
        device=_reset_devices(conditions) if kind == "reset_gpu" else None,
    )


def _reset_devices(conditions: list[Condition]) -> str | None:
    """The GPUs a reset_gpu is for, as `nvidia-smi -r -i` takes them ("0" or "0,3"): the
    devices of the conditions behind it. None when no condition names a device. A MIG
    instance ("0/mig1") is reset with its GPU ("0"): nvidia-smi resets whole GPUs."""
    gpus = {c.device.split("/", 1)[0] for c in conditions if c.device}
    devices = sorted(gpus, key=lambda d: (len(d), d))
    return ",".join(devices)[:256] if devices else None


def _reason(st: HealthState, kind: str, conditions: list[Condition]) -> Reason:
    finding_ids: list[str] = []
    for cond in conditions:
        finding_ids += [i for i in cond.finding_ids if i not in finding_ids]
    where = f"{st.target.kind} {st.target.name}"
    if kind == "uncordon":
        done = st.repair_kind or "cordon"
        summary = f"uncordon {where}: healthy through probation after {done}"
    else:
        parts = [
            f"{c.check}{'@' + c.device if c.device else ''} ({c.severity}"
            f"{', fatal' if c.fatal else ''}): {c.message[:160]}"
            for c in conditions
        ]
        summary = f"{kind} {where}: " + "; ".join(parts)
    return Reason(
        checks=sorted({c.check for c in conditions}),
        finding_ids=finding_ids[:_FINDING_IDS_MAX],
        summary=summary[:4000],
    )
