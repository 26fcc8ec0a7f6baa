"""The capacity stage: the fleet's capacity view (pipeline/capacity/view.py), published live.

Reads `capacity-input`, one partition and one fleet-wide key (CAPACITY_KEY): inventory records
and utilization rows from the telemetry stage (a member leaving is a tombstone keyed by its
`cluster/name`), node states from the health stage and capacity events from the zone stage,
each once. Its table is `capacity`: one `CapacityStageState`. Writes `capacity` snapshots
(key `topics.capacity_key`), `capacity.advice` (key `topics.advice_key`) and alerts:
FleetPulseCapacityCrunch (firing, updated while it holds, resolved) and
FleetPulseOutOfServiceTooLong.

It publishes on its timer, in event time: at every `capacity.snapshot_interval_s` boundary
the view's clock crosses, and after every input that changed the view but a utilization row
(the bulk of the input, which only moves allocation: never per row).
"""

from __future__ import annotations

from functools import cache

import msgspec

from pipeline.capacity import crunch, repair, view
from pipeline.capacity.prices import PriceBook, catalog_book
from pipeline.capacity.state import CapacityState
from pipeline.config import CapacitySettings
from pipeline.decide import alerts
from pipeline.errors import DecodeError
from pipeline.model import Alert, CapacityEvent, Event, Inventory, NodeState, Utilization
from pipeline.stages.base import Out, Part, Stage, expect_key, tag
from pipeline.wire.internal import CAPACITY_INPUT, CAPACITY_KEY, CAPACITY_TABLE, DEAD_LETTERS
from pipeline.wire.topics import advice_key, capacity_key

_INPUTS = (Inventory, Utilization, NodeState, CapacityEvent)
OVERDUE_ALERT = "FleetPulseOutOfServiceTooLong"


class CapacityStageState(msgspec.Struct, kw_only=True):
    view: CapacityState = msgspec.field(default_factory=CapacityState)
    ticked_ms: int = 0  # the last timer boundary published at (event time)


def key(event: Event | None, got: str | None) -> str:
    """CAPACITY_KEY for every value; a tombstone's key is the member that left (the state is
    still the fleet's: on_item reads and writes CAPACITY_KEY only)."""
    if event is None:
        if got is None or got == CAPACITY_KEY:
            raise DecodeError(field="key", expected="the member's cluster/name", got=repr(got))
        return got
    if not isinstance(event, _INPUTS):
        raise DecodeError(
            field="$.schema",
            expected="'inventory/1', 'utilization/…', 'node_state/2' or 'capacity_event/1'",
            got=tag(event),
        )
    return expect_key(got, CAPACITY_KEY, "fleet-wide key")


def on_item(part: Part, event: Event | None, key: str) -> list[Out]:
    held = part.get(CAPACITY_KEY, CapacityStageState) or CapacityStageState()
    if event is None:
        state, changed = view.on_tombstone(held.view, key)
    else:
        state, changed = view.on_item(held.view, event)
    held.view = state
    settings = part.settings.capacity
    outs = _timer(held, settings)
    if changed and not isinstance(event, Utilization):
        since = dict(state.firing)
        state, out = view.publish(state, settings, _prices(settings))
        # crunches still holding are re-sent on the timer only, not after every input
        outs += _outs(out, state, since, updates=False)
    part.put(CAPACITY_KEY, held)
    return outs


def on_eof(part: Part) -> list[Out]:
    """End of input: publish what is due at the view's last moment."""
    held = part.get(CAPACITY_KEY, CapacityStageState)
    if held is None:
        return []
    settings = part.settings.capacity
    since = dict(held.view.firing)
    state, out = view.publish(held.view, settings, _prices(settings))
    part.put(CAPACITY_KEY, held)
    return _outs(out, state, since)


def _timer(held: CapacityStageState, settings: CapacitySettings) -> list[Out]:
    """Publish at the latest interval boundary the view's clock crossed (one publish however
    many boundaries a jump crossed: the snapshots say the state now)."""
    every = settings.snapshot_interval_s * 1000
    boundary = held.view.clock_ms // every * every
    if boundary <= held.ticked_ms:
        return []
    held.ticked_ms = boundary
    since = dict(held.view.firing)
    state, out = view.on_time(held.view, boundary, settings, _prices(settings))
    return _outs(out, state, since)


@cache
def _book(negotiated: tuple[tuple[str, float], ...], basis: str) -> PriceBook:
    return catalog_book(dict(negotiated), basis)


def _prices(settings: CapacitySettings) -> PriceBook:
    return _book(tuple(sorted(settings.negotiated_prices.items())), settings.price_basis)


def _outs(
    out: view.Outputs, state: CapacityState, since: dict[str, int], updates: bool = True
) -> list[Out]:
    """The view's outputs as records; `since`: the crunches firing before this publish (when
    each started: an ended one's alert is resolved with its own start)."""
    now = state.clock_ms
    found: list[Out] = [Out("capacity", capacity_key(s), s) for s in out.snapshots]
    found += [Out("capacity.advice", advice_key(a), a) for a in out.advice]
    found += [_alert(crunch_alert(c, c.ts)) for c in out.crunch_started]
    if updates:
        found += [
            _alert(alerts.update(crunch_alert(c, state.firing[c.scope]), _notes(c), c.ts))
            for c in out.crunch_holding
        ]
    found += [
        _alert(crunch_resolved(scope, since.get(scope, now), now)) for scope in out.crunch_ended
    ]
    return found + [_alert(overdue_alert(o, now)) for o in out.overdue]


def _alert(alert: Alert) -> Out:
    return Out("alerts", alert.fingerprint, alert)


def _notes(found: crunch.Crunch) -> dict[str, str]:
    return crunch.alert_annotations(found)


def crunch_alert(found: crunch.Crunch, since: int) -> Alert:
    """The scope's alert, started at `since` (its startsAt and fingerprint never change)."""
    return alerts.firing(crunch.alert_labels(found.scope), _notes(found), since)


def crunch_resolved(scope: str, since: int, now_ms: int) -> Alert:
    # the resolved copy: the same labels (fingerprint) and start, and its end
    return alerts.resolve(alerts.firing(crunch.alert_labels(scope), {}, since), now_ms)


def overdue_alert(outage: repair.Outage, now_ms: int) -> Alert:
    since = outage.stamps.get("cordoned", now_ms)
    cluster, _, name = outage.target.partition("/")
    labels = {
        "alertname": OVERDUE_ALERT,
        "severity": "warning",
        "service": "fleetpulse",
        "cluster": cluster,
        "pool": outage.pool,
        "zone": outage.zone,
        "target": name,
        "accelerator_type": outage.accelerator_type,
        "check": "out_of_service",
    }
    minutes = (now_ms - since) // 60_000
    notes = {
        "summary": f"{outage.target} out of service for {minutes} min",
        "description": f"{outage.target} ({outage.accelerator_type}, {outage.zone}) has been "
        f"out of service since it was cordoned, {minutes} min ago; stages: "
        + ", ".join(f"{k} at {alerts.rfc3339(v)}" for k, v in sorted(outage.stamps.items())),
    }
    return alerts.firing(labels, notes, now_ms)


STAGE = Stage(
    name="capacity",
    inputs=(CAPACITY_INPUT,),
    aligned=(),  # one producer per kind of input, each in its own event-time order
    table=CAPACITY_TABLE,
    key=key,
    on_item=on_item,
    on_eof=on_eof,
    outputs=("capacity", "capacity.advice", "alerts", DEAD_LETTERS),
)
