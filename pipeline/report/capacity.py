"""Capacity over the lake, for `fleetpulse capacity` and the report's "Capacity" section.

When the lake holds the capacity stage's own snapshots (the `capacity_snapshots` table, from
fleet.capacity) recent enough at the end (`FRESH_INTERVALS` snapshot intervals: every key is
re-sent each interval), those are shown: the latest per key, the keys heard in those intervals
(`lake_snapshots`). Otherwise the capacity view's fold runs on what the lake holds:

The lake keeps utilization, node states and capacity events, not the inventory; so the members
here are the nodes and slices heard in the last `MEMBERS_LOOKBACK` before the end (their
devices: those that reported), each on-demand (the lake does not say how a member was bought).
Members heard then but not in the last silence setting show as out of service: silent. Then
the same pure fold as the worker's (pipeline/capacity) takes, in event time order, the capacity
events of the quota window, the node states of the lookback and the last hour's utilization,
and gives one capacity_snapshot/1 per region/zone/type/model at the end of the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

import msgspec

from pipeline.capacity import crunch, repair
from pipeline.capacity.prices import PriceBook, catalog_book
from pipeline.capacity.snapshot import snapshots
from pipeline.capacity.state import CapacityState, fold
from pipeline.catalog.accelerators import canonical_type, equivalents
from pipeline.config import CapacitySettings
from pipeline.lake.query import Lake, Result
from pipeline.model import (
    CapacityEvent,
    CapacitySnapshot,
    Event,
    Inventory,
    MaintenanceWindow,
    NodeState,
    QuotaInfo,
    Target,
    Utilization,
)
from pipeline.report.charts import Series, line_chart

MEMBERS_LOOKBACK = timedelta(hours=24)
USAGE_LOOKBACK = timedelta(hours=1)
FRESH_INTERVALS = 2  # snapshots this many intervals old at the end are current; older: fold
FROM_SNAPSHOTS = "snapshots"
FROM_FOLD = "fold"
# the struct fields of capacity_snapshot/1 that the lake flattens into prefixed columns
_NESTED = ("out_of_service", "quota", "reservations", "price")
_SNAPSHOTS = """
SELECT epoch_ms(ts) AS ts, epoch_ms(quota_exhausts_at) AS quota_exhausts_at,
       * EXCLUDE (ts, quota_exhausts_at, out_of_service, date, hour)
FROM capacity_snapshots
WHERE ts >= $since AND ts <= $until
QUALIFY row_number() OVER (
    PARTITION BY region, zone, accelerator_type, provisioning_model ORDER BY ts DESC) = 1
ORDER BY region, zone, accelerator_type, provisioning_model
"""

_MEMBERS = """
SELECT cluster, coalesce(slice, node) AS name, slice IS NOT NULL AS is_slice,
       any_value(pool) AS pool, any_value(zone) AS zone, any_value(accelerator) AS accelerator,
       count(DISTINCT node || ':' || device) AS devices, epoch_ms(min(window_start)) AS first
FROM utilization WHERE window_start >= $since AND window_start < $until
GROUP BY ALL ORDER BY cluster, name
"""
_USAGE = """
SELECT epoch_ms(window_start) AS window_start, window_s, cluster, pool, zone, node, slice, device,
       accelerator, allocated, util_mean
FROM utilization WHERE window_start >= $since AND window_start < $until
ORDER BY window_start
"""
_STATES = """
SELECT epoch_ms(ts) AS ts, target_cluster, target_kind, target_name, target_pool, target_zone,
       state, epoch_ms(since) AS since, last_action
FROM node_state WHERE ts >= $since AND ts < $until ORDER BY ts
"""
_EVENTS = """
SELECT event_id, epoch_ms(ts) AS ts, source, kind, severity, region, zone, cluster, target,
       target_kind, accelerator_type, quota_metric, quota_limit, quota_usage, state,
       epoch_ms(window_start) AS window_start, epoch_ms(window_end) AS window_end
FROM capacity WHERE ts >= $since AND ts < $until ORDER BY ts
"""


def lake_state(lake: Lake, until: datetime, settings: CapacitySettings) -> CapacityState:
    """The capacity state at `until`, folded from the lake."""
    state = CapacityState()
    window = {"until": until}
    for member in _members(lake.sql(_MEMBERS, {**window, "since": until - MEMBERS_LOOKBACK})):
        fold(state, member)
    quota_since = until - timedelta(seconds=settings.quota_window_s)
    inputs: list[Event] = [
        *_events(lake.sql(_EVENTS, {**window, "since": min(quota_since, until - USAGE_LOOKBACK)})),
        *_states(lake.sql(_STATES, {**window, "since": until - MEMBERS_LOOKBACK})),
        *_usage(lake.sql(_USAGE, {**window, "since": until - USAGE_LOOKBACK})),
    ]
    for value in sorted(inputs, key=_time):
        fold(state, value)
    state.clock_ms = max(state.clock_ms, _ms(until))
    return state


@dataclass(frozen=True)
class Shown:
    """The capacity shown at `until`, and where it came from (FROM_SNAPSHOTS or FROM_FOLD)."""

    snapshots: list[CapacitySnapshot]
    source: str
    until: datetime

    def words(self) -> str:
        if self.source == FROM_SNAPSHOTS:
            newest = max(s.ts for s in self.snapshots)
            at = datetime.fromtimestamp(newest / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
            return (f"from the capacity stage's snapshots (fleet.capacity, lake table "
                    f"capacity_snapshots), the latest per key, newest at {at} UTC")
        return (f"folded from the lake's utilization, node states and capacity events at "
                f"{self.until:%Y-%m-%d %H:%M:%S} UTC (no fleet.capacity snapshot there in the "
                f"last {FRESH_INTERVALS} snapshot intervals)")


def lake_snapshots(
    lake: Lake, until: datetime, settings: CapacitySettings, prices: PriceBook | None = None
) -> Shown:
    """The stage's latest snapshots when the lake has them fresh at `until`, else the fold's."""
    fresh = timedelta(seconds=FRESH_INTERVALS * settings.snapshot_interval_s)
    params = {"since": until - fresh, "until": until}
    stored = [_snapshot(row) for row in lake.sql(_SNAPSHOTS, params).records()]
    if stored:
        return Shown(stored, FROM_SNAPSHOTS, until)
    state = lake_state(lake, until, settings)
    book = prices or catalog_book(settings.negotiated_prices, settings.price_basis)
    return Shown(snapshots(state, settings, book), FROM_FOLD, until)


def _snapshot(row: dict[str, Any]) -> CapacitySnapshot:
    """A capacity_snapshots row back into its capacity_snapshot/1 (the nested structs from their
    prefixed columns; an optional one absent when all its columns are NULL)."""
    value: dict[str, Any] = {}
    for name, cell in row.items():
        nest = next((n for n in _NESTED if name.startswith(n + "_")), None)
        if nest is None:
            value[name] = cell
        elif cell is not None:
            value.setdefault(nest, {})[name.removeprefix(nest + "_")] = cell
    value.setdefault("out_of_service", {})
    value.setdefault("reservations", {})
    return msgspec.convert(value, CapacitySnapshot)


def _time(value: Event) -> int:
    if isinstance(value, Utilization):
        return value.window_start + value.window_s * 1000
    return int(getattr(value, "ts", 0))


def _ms(when: datetime) -> int:
    return int((when - datetime(1970, 1, 1)).total_seconds() * 1000)


def _members(result: Result) -> Iterator[Inventory]:
    for row in result.records():
        yield Inventory(
            ts=row["first"], cluster=row["cluster"], kind="slice" if row["is_slice"] else "node",
            name=row["name"], pool=row["pool"], zone=row["zone"], accelerator=row["accelerator"],
            capacity=row["devices"], source="lake",
        )  # fmt: skip


def _usage(result: Result) -> Iterator[Utilization]:
    for row in result.records():
        yield Utilization(
            window_start=row["window_start"], window_s=row["window_s"], cluster=row["cluster"],
            pool=row["pool"], zone=row["zone"], node=row["node"], slice=row["slice"],
            device=row["device"], accelerator=row["accelerator"], allocated=row["allocated"],
            util_mean=row["util_mean"], util_max=row["util_mean"], mem_used_frac=0.0, samples=1,
        )  # fmt: skip


def _states(result: Result) -> Iterator[NodeState]:
    for row in result.records():
        target = Target(
            cluster=row["target_cluster"], kind=row["target_kind"], name=row["target_name"],
            pool=row["target_pool"], zone=row["target_zone"],
        )  # fmt: skip
        yield NodeState(
            ts=row["ts"], target=target, state=row["state"], since=row["since"],
            last_action=row["last_action"],
        )  # fmt: skip


def _events(result: Result) -> Iterator[CapacityEvent]:
    for row in result.records():
        quota = None
        if row["quota_metric"] is not None:
            quota = QuotaInfo(
                metric=row["quota_metric"], limit=row["quota_limit"] or 0.0,
                usage=row["quota_usage"] or 0.0,
            )  # fmt: skip
        window = None
        if row["window_start"] is not None and row["window_end"] is not None:
            window = MaintenanceWindow(start=row["window_start"], end=row["window_end"])
        yield CapacityEvent(
            event_id=row["event_id"], ts=row["ts"], provider="gcp", source=row["source"],
            kind=row["kind"], severity=row["severity"], region=row["region"], zone=row["zone"],
            cluster=row["cluster"], target=row["target"], target_kind=row["target_kind"],
            accelerator_type=row["accelerator_type"], quota=quota, window=window,
            state=row["state"],
        )  # fmt: skip


# --- the report's section ------------------------------------------------------------------


def free_over_time_chart(result: Result, since: datetime, until: datetime) -> str:
    """Healthy free devices per region and accelerator type over time (capacity_timeline)."""
    free: dict[str, dict[datetime, float]] = {}
    for row in result.records():
        kind = canonical_type(row["accelerator"]) or row["accelerator"]
        points = free.setdefault(f"{row['region']} · {kind}", {})
        points[row["bucket"]] = points.get(row["bucket"], 0.0) + row["free"]
    series = [Series(name, sorted(points.items())) for name, points in sorted(free.items())]
    top = max((v for s in series for _, v in s.points), default=0.0)
    return line_chart("capacity_time", "Healthy free devices per region and type", series,
                      since, until, y_max=max(8.0, top * 1.1), unit="")  # fmt: skip

SNAPSHOT_COLUMNS = (
    ("zone", "Zone"), ("type", "Type"), ("model", "Bought"), ("devices", "Devices"),
    ("healthy", "Healthy"), ("suspect", "Suspect"), ("free", "Healthy free"),
    ("allocated", "Allocated"), ("idle", "Allocated idle"), ("out", "Out of service"),
    ("quota", "Quota headroom"),
    ("forecast", "Quota out (forecast)"), ("reserved", "Reserved in use"),
    ("signals", "Stock-outs / preemptions (1 h)"), ("cost", "$ per useful device-hour"),
)  # fmt: skip


def snapshot_row(snapshot: CapacitySnapshot) -> dict[str, str]:
    """One snapshot in words, for the table of `fleetpulse capacity` and of the report."""
    out = snapshot.out_of_service
    reasons = [(n, getattr(out, n)) for n in ("cordoned", "draining", "repairing",
                                                "maintenance", "silent")]  # fmt: skip
    quota = snapshot.quota
    forecast = "-"
    if quota is not None and quota.exhausts_at is not None:
        hours = (quota.exhausts_at - snapshot.ts) / 3_600_000
        forecast = f"in {hours:.1f} h (conf. {quota.confidence:.2f})"
    cost = "-"
    if snapshot.usd_per_useful_hour is not None and snapshot.price is not None:
        price = snapshot.price
        cost = f"{snapshot.usd_per_useful_hour:.2f} ({price.basis}, {price.location})"
    reservations = snapshot.reservations
    return {
        "zone": snapshot.zone,
        "type": snapshot.accelerator_type,
        "model": snapshot.provisioning_model,
        "devices": str(snapshot.devices),
        "healthy": str(snapshot.healthy),
        "suspect": str(snapshot.suspect),
        "free": str(snapshot.healthy_free),
        "allocated": str(snapshot.allocated),
        "idle": str(snapshot.allocated_idle),
        "out": ", ".join(f"{n} {c}" for n, c in reasons if c) or "0",
        "quota": "-" if quota is None else f"{quota.headroom:.0f} of {quota.limit:.0f}",
        "forecast": forecast,
        "reserved": "-" if not reservations.count
        else f"{reservations.in_use} of {reservations.reserved}",
        "signals": f"{snapshot.stockouts_1h} / {snapshot.preemptions_1h}",
        "cost": cost,
    }


def capacity_section(lake: Lake, until: datetime,
                     settings: CapacitySettings | None = None) -> str:  # fmt: skip
    """The head of the report's "Capacity" part: the snapshot per zone and type at the end of
    the window, any crunch with the spare capacity elsewhere, and targets out of service too
    long. (The report adds the canned analyses after it: types compared, reservations, quota
    outlook, time back in service.)"""
    settings = settings or CapacitySettings()
    shown = lake_snapshots(lake, until, settings)
    state = lake_state(lake, until, settings)  # the outages (time back in service) are its
    parts = [
        f'<p data-source="{shown.source}">Capacity {escape(shown.words())}.</p>',
        _snapshot_table(shown.snapshots),
        _crunch_list(crunch.crunches(shown.snapshots, settings, equivalents)),
        _repairs(state, settings),
    ]
    return (f'<section data-table="capacity-section" id="capacity"><h2>Capacity</h2>'
            f"{''.join(parts)}</section>")  # fmt: skip


def _snapshot_table(shown: list[CapacitySnapshot]) -> str:
    head = "".join(f"<th>{escape(title)}</th>" for _, title in SNAPSHOT_COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(snapshot_row(s)[key])}</td>" for key, _ in SNAPSHOT_COLUMNS)
        + "</tr>"
        for s in shown
    )
    return (f'<section data-table="capacity-now"><h3>Capacity now, per zone, type and how it '
            f'is bought</h3><div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'
            "</section>")  # fmt: skip


def _crunch_list(found: list[crunch.Crunch]) -> str:
    head = '<section data-table="capacity-crunch"><h3>Capacity crunch</h3>'
    if not found:
        return f"{head}<p>None.</p></section>"
    items = "".join(
        f"<li><b>{escape(c.accelerator_type)} in {escape(c.region)}</b>: {escape(c.detail)}. "
        f"Spare: {escape('; '.join(s.words() for s in c.spare[:3]) or 'none')}</li>"
        for c in found
    )
    return f"{head}<ul>{items}</ul></section>"


def _repairs(state: CapacityState, settings: CapacitySettings) -> str:
    late = repair.overdue(state.repairs, state.clock_ms, settings.out_of_service_alert_s)
    if not late:
        return ""
    items = "".join(
        f"<li>{escape(o.target)} ({escape(o.pool)}): out of service since "
        f"{(state.clock_ms - o.stamps['cordoned']) / 60_000:.0f} min</li>"
        for o in late
    )
    limit = settings.out_of_service_alert_s / 60
    return (f'<section data-table="out-of-service-too-long"><h3>Out of service longer than '
            f"{limit:.0f} min</h3><ul>{items}</ul></section>")  # fmt: skip
