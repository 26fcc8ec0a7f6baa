"""How a target's health state moves with time: persistence, flapping, probation.

The states and their arrows are drawn in pipeline/decide/health.py's docstring.
"""

from __future__ import annotations

from pipeline.config import HealthSettings
from pipeline.decide.health_state import Condition, HealthState, enter, is_actionable
from pipeline.ids import stable_id
from pipeline.model import PRE_CORDON, HealthStateName, target_key

_MS = 1000


def prune(st: HealthState, settings: HealthSettings) -> None:
    st.flaps = [t for t in st.flaps if st.clock - t < settings.flap_window_s * _MS][-64:]
    st.repairs = [t for t in st.repairs if st.clock - t < settings.repair_window_s * _MS][-32:]


def _flapping(st: HealthState, settings: HealthSettings) -> bool:
    return len(st.flaps) > settings.flap_max


def _held(st: HealthState, settings: HealthSettings) -> bool:
    """A flapping target stays suspect until it has been quiet for flap_hold_s."""
    return _flapping(st, settings) and st.clock - st.flaps[-1] < settings.flap_hold_s * _MS


def settle(st: HealthState, settings: HealthSettings) -> None:
    actionable = [c for c in st.conditions.values() if is_actionable(c)]
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
            enter(st, "probation")
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
    enter(st, name)


def _settle_probation(
    st: HealthState, actionable: list[Condition], settings: HealthSettings
) -> None:
    failed = any(_failed_repair(st, c, settings) for c in actionable)
    if st.cordoned_by_us:
        if failed:
            enter(st, "cordoned")  # we still hold it: on to the next rung of the ladder
        return
    # Back in service already (a person released it, or the node was recreated): after
    # probation_s quiet it is simply healthy; a failure starts a new episode from scratch.
    if failed or quiet_for(st, settings.probation_s):
        st.episode, st.round = None, 0
        enter(st, "healthy")
        _settle_pre_cordon(st, actionable, settings)


def quiet_for(st: HealthState, seconds: int) -> bool:
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
