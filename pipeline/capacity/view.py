"""The capacity view as a driver runs it: the whole stage is `on_item` and `on_time`.

    state, changed = on_item(state, value)              # every input record
    state, out = publish(state, settings, prices)       # on a timer, and after an input that
                                                        # is not utilization (changed != {})

`on_item` folds inventory (a tombstone through `on_tombstone`), node states, capacity events
and utilization into the fleet-wide state; `publish` says what to send now: the snapshots due
(fleet.capacity, key `topics.capacity_key`), the advice per type and configured count
(fleet.capacity.advice, key `topics.advice_key`; when its ranking changed or once per snapshot
interval), the crunches that started, still hold or
ended (FleetPulseCapacityCrunch, built with decide.alerts `firing`/`update`/`resolve` from
crunch.alert_labels / alert_annotations), the targets newly out of service too long, and the
outages finished since the last publish. Utilization rows are the bulk of the input and
only move allocation, so a driver publishes for them on its timer, not per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.capacity import advice, crunch, repair, snapshot
from pipeline.capacity.prices import PriceBook
from pipeline.capacity.state import CapacityState, fold, forget
from pipeline.catalog.accelerators import equivalents
from pipeline.config import CapacitySettings
from pipeline.model import CapacityAdvice, CapacitySnapshot, Event


@dataclass
class Outputs:
    snapshots: list[CapacitySnapshot] = field(default_factory=list)
    advice: list[CapacityAdvice] = field(default_factory=list)
    crunch_started: list[crunch.Crunch] = field(default_factory=list)
    crunch_holding: list[crunch.Crunch] = field(default_factory=list)
    crunch_ended: list[str] = field(default_factory=list)  # scopes (region/type)
    overdue: list[repair.Outage] = field(default_factory=list)  # newly out too long
    repaired: list[repair.Outage] = field(default_factory=list)  # finished since last time


def on_item(state: CapacityState | None, value: Event) -> tuple[CapacityState, set[str]]:
    state = state or CapacityState()
    return state, fold(state, value)


def on_tombstone(state: CapacityState | None, cluster_name: str) -> tuple[CapacityState, set[str]]:
    state = state or CapacityState()
    return state, forget(state, cluster_name)


def on_time(
    state: CapacityState | None, now_ms: int, settings: CapacitySettings, prices: PriceBook
) -> tuple[CapacityState, Outputs]:
    """The timer: move the state's clock to `now_ms` (event time) if it is behind, publish."""
    state = state or CapacityState()
    state.clock_ms = max(state.clock_ms, now_ms)
    return publish(state, settings, prices)


def publish(
    state: CapacityState, settings: CapacitySettings, prices: PriceBook
) -> tuple[CapacityState, Outputs]:
    if state.clock_ms == 0:  # no input with a time yet (a tombstone first): nothing to date
        return state, Outputs()
    every = snapshot.snapshots(state, settings, prices)
    out = Outputs(snapshots=snapshot.due(state, settings, prices))
    current = crunch.crunches(every, settings, equivalents)
    out.crunch_started, out.crunch_holding, out.crunch_ended = crunch.transitions(
        state.firing, current
    )
    out.advice = _advice_due(state, _advice(every, settings), settings)
    out.overdue = _newly_overdue(state, settings)
    out.repaired = _finished(state)
    return state, out


def _advice(
    every: list[CapacitySnapshot], settings: CapacitySettings
) -> list[CapacityAdvice]:
    found = []
    for accelerator in sorted({s.accelerator_type for s in every}):
        for count in settings.advice_counts:
            advised = advice.advise(every, accelerator, count, settings, equivalents(accelerator))
            if advised is not None:
                found.append(advised)
    return found


def _advice_due(
    state: CapacityState, found: list[CapacityAdvice], settings: CapacitySettings
) -> list[CapacityAdvice]:
    """Advice whose ranking changed (its id), or not sent for the snapshot interval."""
    due = []
    for one in found:
        key = f"{one.accelerator_type}/{one.count}"
        sent = state.advised.get(key)
        if sent is None or sent[1] != one.advice_id or one.ts - sent[0] >= (
            settings.snapshot_interval_s * 1000
        ):
            state.advised[key] = (one.ts, one.advice_id)
            due.append(one)
    return due


def _newly_overdue(state: CapacityState, settings: CapacitySettings) -> list[repair.Outage]:
    late = repair.overdue(state.repairs, state.clock_ms, settings.out_of_service_alert_s)
    late_now = {o.target for o in late}
    for target in [t for t in state.overdue if t not in late_now]:
        del state.overdue[target]  # back in service (or gone): may alert again next time
    fresh = [o for o in late if o.target not in state.overdue]
    for outage in fresh:
        state.overdue[outage.target] = outage.stamps["cordoned"]
    return fresh


def _finished(state: CapacityState) -> list[repair.Outage]:
    done = state.repairs.done
    state.repairs.done = []  # handed out once; percentiles are the lake's (fleet.node-state)
    return done
