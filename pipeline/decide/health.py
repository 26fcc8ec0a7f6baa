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
  people and the record: the target stays where it is (a not_ready is listed among the node
  state's open checks until its ready, as `node.not_ready`: the guard's evidence of the node's
  own beside silence).
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
proposal of ours is in flight, itself as of that proposal and the signals since; an action that
comes back behind signals newer than it is put where it would have come live and what followed
is applied again (pipeline/decide/rewind.py): the proposals, their ids and their ts are those of
the live run, whatever the lag (up to `late_action_s`). The policy dates an action it takes at
once by its proposal's ts.

Pure and deterministic: `transition` changes the state it is given and returns it (the driver
keeps the snapshot to roll back to). The state is in health_state.py; one signal is applied by
health_signals.py, time moves it in health_settle.py, and health_propose.py asks.
"""

from __future__ import annotations

import functools

import msgspec

from pipeline.config import HealthSettings
from pipeline.decide import rewind
from pipeline.decide.health_propose import propose
from pipeline.decide.health_settle import prune, settle
from pipeline.decide.health_signals import on_action, on_finding, on_node_event
from pipeline.decide.health_state import NOT_READY, Logged
from pipeline.decide.health_state import HealthState as HealthState
from pipeline.model import (
    HEARTBEAT,
    Action,
    Finding,
    NodeEvent,
    NodeState,
    Proposal,
    Target,
    target_key,
)

_MS = 1000
_DECODE = msgspec.msgpack.Decoder(HealthState)


def transition(
    state: HealthState | None, signal: Finding | NodeEvent | Action, settings: HealthSettings
) -> tuple[HealthState, list[Proposal]]:
    """Apply one signal to one target's state; return the new state and what to propose."""
    target = target_of(signal)
    if state is None:
        st = HealthState(target=target, since=signal.ts, clock=signal.ts)
    else:
        if target_key(state.target) != target_key(target):
            raise ValueError(
                f"signal for {target_key(target)} sent to the state of {target_key(state.target)}"
            )
        # the state given is changed in place and returned: the driver keeps the snapshot
        # to roll back to (pipeline/stages/base.py)
        st = state
    repeat = isinstance(signal, Action) and signal.action_id in st.applied
    if isinstance(signal, Action) and not repeat:
        replayed = rewind.rewind(_machine(settings), st, signal)
        if replayed is not None:
            return st, replayed
    proposals = _apply(st, signal, settings)
    # nothing in flight and nothing asked: nothing to log (the bulk of signals, heartbeats)
    if not repeat and (proposals or st.past is not None):
        rewind.remember(_machine(settings), st, signal, proposals)
    return st, proposals


@functools.lru_cache(maxsize=16)
def _machine(settings: HealthSettings) -> rewind.Machine[HealthState, Logged, Proposal]:
    """The health machine as the rewind sees it (our actions answer our proposals); one per
    settings (frozen), built once: a transition is a few microseconds."""
    return rewind.Machine(
        apply=lambda st, signal: _apply(st, signal, settings),
        decode=_DECODE.decode,
        output_id=lambda proposal: proposal.proposal_id,
        answers=lambda signal: signal.proposal_id if isinstance(signal, Action) else None,
        ts=_ts,
        logged=_logged,
        late_ms=settings.late_action_s * _MS,
    )


def _logged(signal: Logged) -> Logged:
    """A heartbeat only moves the clock: the past keeps its ts."""
    heartbeat = isinstance(signal, Finding) and signal.check == HEARTBEAT
    return signal.ts if heartbeat and not isinstance(signal, int) else signal


def _ts(signal: Logged) -> int:
    return signal if isinstance(signal, int) else signal.ts


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
    st.target = target_of(event)
    on_node_event(st, event)
    settle(st, settings)
    return propose(st, settings)


def _apply_one(st: HealthState, signal: Logged, settings: HealthSettings) -> list[Proposal]:
    if isinstance(signal, int):
        st.clock = max(st.clock, signal)
    else:
        st.target = target_of(signal)  # identity stays current: a node can move to a pool
        st.clock = max(st.clock, signal.ts)
        if isinstance(signal, Finding):
            on_finding(st, signal)
        elif isinstance(signal, NodeEvent):
            on_node_event(st, signal)
        else:
            on_action(st, signal)
    prune(st, settings)
    settle(st, settings)
    return propose(st, settings)


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
        open_checks=sorted(
            {c.check for c in state.conditions.values()}
            | ({NOT_READY} if state.not_ready else set())
        ),
    )


def target_of(signal: Finding | NodeEvent | Action) -> Target:
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
