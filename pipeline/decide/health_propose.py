"""What a target's health state asks for: the plan of its open conditions, the repair ladder,
and the proposal (one outstanding at a time, its id stable across re-sends).
"""

from __future__ import annotations

from typing import cast

from pipeline.config import HealthSettings
from pipeline.decide.health_settle import quiet_for
from pipeline.decide.health_state import (
    CORDON,
    DRAIN,
    LEVEL,
    RANK,
    REPAIR,
    Condition,
    HealthState,
    Outstanding,
    is_actionable,
)
from pipeline.ids import stable_id
from pipeline.model import ActionKind, Proposal, Reason, target_key

_FINDING_IDS_MAX = 16
_MS = 1000


def _plan(st: HealthState) -> tuple[int, int]:
    """(level, repair rank) wanted by the open, not waived, actionable conditions."""
    level = rank = 0
    for cond in st.conditions.values():
        if is_actionable(cond):
            level = max(level, LEVEL[cond.recommended], CORDON)
            rank = max(rank, RANK.get(cond.recommended, 0))
    return level, rank


def _repair_kind(st: HealthState, rank: int, settings: HealthSettings) -> str | None:
    if len(st.repairs) >= settings.max_repairs:
        return None  # repeated repairs did not stick: leave it cordoned for a person
    ladder = settings.slice_ladder if st.target.kind == "slice" else settings.node_ladder
    start = next((i for i, kind in enumerate(ladder) if RANK[kind] >= rank), len(ladder) - 1)
    return ladder[min(start + len(st.repairs), len(ladder) - 1)]


def _wanted(st: HealthState, settings: HealthSettings) -> str | None:
    if st.human_hold or st.maintenance:
        return None
    if st.state == "degraded":
        return "cordon"
    if not st.cordoned_by_us:
        return None  # drains, repairs and releases only ever follow a cordon of ours
    level, rank = _plan(st)
    if st.state == "cordoned" and level >= DRAIN and not st.drained:
        return "drain"
    failed = st.drain_failed
    drained = (st.drained and not failed) or (failed and settings.repair_after_failed_drain)
    if st.state in ("cordoned", "draining") and level == REPAIR and drained:
        return _repair_kind(st, rank, settings)
    if st.state == "probation" and quiet_for(st, settings.probation_s):
        return "uncordon"
    return None


def propose(st: HealthState, settings: HealthSettings) -> list[Proposal]:
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
        return [make_proposal(st, pending.proposal_id, kind)]
    if st.episode is None:
        st.episode = stable_id("ep", target_key(st.target), st.clock)
    st.round += 1
    proposal_id = stable_id("prp", st.episode, kind, st.round)
    st.outstanding = Outstanding(
        proposal_id=proposal_id, kind=kind, first_ts=st.clock, last_ts=st.clock
    )
    return [make_proposal(st, proposal_id, kind)]


def make_proposal(st: HealthState, proposal_id: str, kind: str) -> Proposal:
    conditions = [st.conditions[k] for k in sorted(st.conditions)]
    conditions = [c for c in conditions if is_actionable(c)]
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
