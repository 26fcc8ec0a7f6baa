"""The lake's tables: which topic feeds each, its Parquet columns, and how an event flattens.

One row per event. The columns are the event's struct (pipeline/lake/columns.py derives them:
nested structs become prefixed columns, `target.cluster` → `target_cluster`; lists of strings
stay Parquet lists, label maps Parquet maps; event-time milliseconds become TIMESTAMP); a table
says only its time field and what the struct cannot (a renamed path, a narrower int, a computed
column). tests/unit/test_lake_tables.py holds every table's schema as written so far.

A table's `version` goes up when its columns change (a new field in its event's struct is a new
column). Readers (pipeline/lake/query.py) fill columns that old files lack with NULL, so adding
a column never breaks reading what is already on disk; removing or retyping one needs a new
table name.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa

from pipeline.lake.columns import SCHEMA, TIMESTAMP, Column, columns_of
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    CapacitySnapshot,
    Event,
    Finding,
    NodeState,
    Utilization,
    WithheldRecord,
    XidEvent,
)

CHUNK_ROWS = 4096  # rows converted to Arrow at a time (see TableSpec.to_arrow)


@dataclass(frozen=True)
class TableSpec:
    """A lake table: `lake/<name>/date=…/hour=…/<topic>-<partition>-<first offset>.parquet`."""

    name: str
    topic_suffix: str  # the Kafka topic (after settings.kafka.topic_prefix) that feeds it
    event: type[Event]
    version: int
    time: Callable[[Any], int]  # event time in ms that picks the date/hour partition
    columns: tuple[Column, ...]
    # The columns that identify a row (empty: the whole row, for a table without an id).
    key: tuple[str, ...] = ()
    # The views keep one row per key (pipeline/lake/query.py): for the tables an ingest adapter
    # restarted without its checkpoint can fill twice (the same records at new offsets), and
    # small ones. The big derived tables are kept unique at write only (the sink skips offsets
    # the lake already holds): deduplicating millions of rows at every query is too slow.
    once_in_views: bool = False
    schema: pa.Schema = field(init=False)
    _rows_type: pa.StructType | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        metadata = {"fleetpulse.table": self.name, "fleetpulse.version": str(self.version)}
        schema = pa.schema([pa.field(c.name, c.type) for c in self.columns], metadata=metadata)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "_rows_type", _rows_type(self.event, self.columns))

    def to_arrow(self, events: Sequence[Event]) -> pa.Table:
        """The events as one Arrow table of this table's schema, rows in the given order."""
        # In chunks: the temporary per-row tuples of a whole flush (200,000 rows) would take
        # tens of MB, and a chunk's values are still in the CPU cache when they are released.
        with _gc_paused():
            chunks = [self._arrays(events[start : start + CHUNK_ROWS])
                      for start in range(0, len(events), CHUNK_ROWS)]
        arrays = [
            _tag_column(events) if c is SCHEMA else _joined([chunk[i] for chunk in chunks], c.type)
            for i, c in enumerate(self.columns)
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _arrays(self, events: Sequence[Event]) -> list[pa.Array | None]:
        """One chunk's columns (None for the schema tag, added once for the whole batch)."""
        if self._rows_type is None:
            return [None if c is SCHEMA else _column(c, events) for c in self.columns]
        # Every field is a column: msgspec's astuple reads each event's fields in C and Arrow
        # converts the tuples in one pass into a struct array whose children are the columns,
        # with no Python code per row or per value (about 1.4x the column-by-column path).
        rows = pa.array(list(map(msgspec.structs.astuple, events)), type=self._rows_type)
        children = dict(zip(self.event.__struct_fields__, rows.flatten(), strict=True))
        return [
            None if c.field is None
            # timestamps arrive as int64 (a cheaper conversion than TIMESTAMP's): same bits
            else children[c.field].view(c.type) if c.type == TIMESTAMP
            else children[c.field]
            for c in self.columns
        ]


def _column(column: Column, events: Sequence[Event]) -> pa.Array:
    return pa.array(list(map(column.get, events)), type=column.type)


def _tag_column(events: Sequence[Event]) -> pa.Array:
    # The schema tag is the same for every event of a table: repeated, not read per row.
    if not events:
        return pa.array([], type=SCHEMA.type)
    return pa.repeat(pa.scalar(SCHEMA.get(events[0])), len(events))


def _joined(parts: list[pa.Array | None], kind: pa.DataType) -> pa.Array:
    arrays = [part for part in parts if part is not None]
    if len(arrays) == 1:
        return arrays[0]
    return pa.concat_arrays(arrays) if arrays else pa.array([], type=kind)


def _rows_type(event: type[Event], columns: tuple[Column, ...]) -> pa.StructType | None:
    """The Arrow struct of an event's fields when each field is a column of the table (then a
    whole batch converts at once from tuples); None when a column reads inside a nested struct
    or computes its value (those tables convert column by column)."""
    by_field = {c.field: c for c in columns if c.field is not None}
    fields = event.__struct_fields__
    if set(fields) != set(by_field) or any(c.field is None and c is not SCHEMA for c in columns):
        return None
    return pa.struct([
        pa.field(name, pa.int64() if by_field[name].type == TIMESTAMP else by_field[name].type)
        for name in fields
    ])


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Converting a batch allocates a few objects per row that all die at its end; the cyclic
    collector would otherwise run many times over every live event meanwhile (about a quarter of
    the conversion time) and find nothing to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


UTILIZATION = TableSpec(
    name="utilization",
    topic_suffix="utilization",
    event=Utilization,
    version=2,  # v2: step_compute_s (utilization/2); NULL in v1 files
    time=attrgetter("window_start"),
    columns=columns_of(Utilization, time="window_start", int32=("samples",)),
    key=("window_start", "window_s", "cluster", "node", "slice", "device"),
)

FINDINGS = TableSpec(
    name="findings",
    topic_suffix="findings",
    event=Finding,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(Finding, rename={"entity.target": "target", "entity.device": "device"}),
    key=("finding_id",),
)

ACTIONS = TableSpec(
    name="actions",
    topic_suffix="actions",
    event=Action,
    version=2,  # v2: device (action/2)
    time=attrgetter("ts"),
    columns=columns_of(Action),
    key=("action_id",),
    once_in_views=True,
)

NODE_STATE = TableSpec(
    name="node_state",
    topic_suffix="node-state",
    event=NodeState,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(NodeState, int32=("repairs",)),
    # a target changes state at most once per instant
    key=("target_cluster", "target_kind", "target_name", "ts", "state"),
)

ALERTS = TableSpec(
    name="alerts",
    topic_suffix="alerts",
    event=Alert,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(
        Alert,
        after={"status": (  # the labels people filter on, as columns of their own
            Column("alertname", pa.string(), lambda alert: alert.labels.get("alertname")),
            Column("severity", pa.string(), lambda alert: alert.labels.get("severity")),
        )},
    ),
    key=("fingerprint", "status", "starts_at", "ends_at"),  # as the alert sinks dedupe
    once_in_views=True,
)

WITHHELD = TableSpec(
    name="withheld",
    topic_suffix="withheld",
    event=WithheldRecord,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(WithheldRecord),
    # a replay re-emits the same id at the same time; a rule that comes back later is a row
    key=("withheld_id", "ts"),
    once_in_views=True,
)

CAPACITY = TableSpec(
    name="capacity",
    topic_suffix="events.capacity",
    event=CapacityEvent,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(CapacityEvent),
    key=("event_id",),
    once_in_views=True,
)

# fleet.capacity (capacity_snapshot/1): the capacity stage's snapshots, each key again every
# capacity.snapshot_interval_s and on change. Not `capacity`: that name is the capacity events'.
CAPACITY_SNAPSHOTS = TableSpec(
    name="capacity_snapshots",
    topic_suffix="capacity",
    event=CapacitySnapshot,
    version=1,
    time=attrgetter("ts"),
    columns=columns_of(CapacitySnapshot),
    key=("ts", "region", "zone", "accelerator_type", "provisioning_model"),
    once_in_views=True,  # small: a few rows per key per interval
)

XID = TableSpec(
    name="xid",
    topic_suffix="events.xid",
    event=XidEvent,
    version=2,  # v2: count and last_ts (a storm's repeats coalesced); NULL in v1 files
    time=attrgetter("ts"),
    columns=columns_of(XidEvent),
    once_in_views=True,  # no id: the whole line (node, time, GPU, xid, pid, text) is one
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (UTILIZATION, FINDINGS, ACTIONS, NODE_STATE, ALERTS, WITHHELD, CAPACITY,
                 CAPACITY_SNAPSHOTS, XID)
}
TABLE_BY_TOPIC_SUFFIX: dict[str, TableSpec] = {spec.topic_suffix: spec for spec in TABLES.values()}
_TABLE_BY_EVENT: dict[type[Event], TableSpec] = {spec.event: spec for spec in TABLES.values()}


def table_for_event(event: Event) -> str | None:
    """The lake table an event belongs in, or None for events the lake does not keep."""
    spec = _TABLE_BY_EVENT.get(type(event))
    return None if spec is None else spec.name
