"""A lake table's columns, derived from its event's msgspec Struct (pipeline/model.py).

One column per field, in the struct's order, the event-time field first and the schema tag
last. A nested struct becomes prefixed columns (`reason.checks` → `reason_checks`; an optional
one's columns are NULL when it is absent); camelCase names become snake_case (`startsAt` →
`starts_at`). Types come from the field's type and its bounds:

    str, Literal                      string
    bool / float                      bool / double
    int bounded to epoch ms           timestamp[ms] (UTC, no zone: DuckDB buckets it directly)
    int bounded within 32 bits        int32
    any other int                     int64
    list[str] / dict[str, str]        list<string> / map<string, string>

A table adds what the struct cannot say: a path renamed (`entity.target` → `target`), a column
narrowed to int32 that the model leaves unbounded, and computed columns after a named one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
import msgspec.inspect as mi
import pyarrow as pa

from pipeline.model import Event

TIMESTAMP = pa.timestamp("ms")
STRINGS = pa.list_(pa.string())
LABELS = pa.map_(pa.string(), pa.string())
_EPOCH_MS_MIN = 1_000_000_000_000  # the lower bound of model.TimestampMs
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    get: Callable[[Any], Any]
    field: str | None = None  # the event's own top-level field this column copies, if it is one


def _schema_tag(event: Event) -> str:
    return str(event.__struct_config__.tag)


SCHEMA = Column("schema", pa.string(), _schema_tag)


def columns_of(
    event: type[Event],
    *,
    time: str = "ts",
    rename: Mapping[str, str] | None = None,
    int32: Collection[str] = (),
    after: Mapping[str, Sequence[Column]] | None = None,
) -> tuple[Column, ...]:
    """The columns of `event`'s table: `time` first, then every field flattened, then the
    schema tag. `rename`: dotted path -> column name (or prefix, for a nested struct);
    `int32`: columns narrowed to int32; `after`: computed columns placed after a column."""
    derived = _flatten(event, (), "", rename or {}, set(int32), None)
    first = [c for c in derived if c.field == time]
    if not first:
        msg = f"{event.__name__}: expected a time field {time!r}, got {[c.name for c in derived]}"
        raise ValueError(msg)
    ordered: list[Column] = []
    for column in [*first, *(c for c in derived if c.field != time)]:
        ordered += [column, *(after or {}).get(column.name, ())]
    placed = {c.name for c in ordered}
    missing = sorted(set(after or {}) - placed)
    if missing:
        msg = f"{event.__name__}: extra columns after {missing}, which are not columns"
        raise ValueError(msg)
    return (*ordered, SCHEMA)


def _flatten(
    struct: type[msgspec.Struct],
    path: tuple[str, ...],
    prefix: str,
    rename: Mapping[str, str],
    int32: set[str],
    optional_at: int | None,
) -> list[Column]:
    """`struct`'s fields as columns; `optional_at`: the length of the path to the innermost
    optional struct around them (its absence makes them NULL)."""
    columns: list[Column] = []
    for field in mi.type_info(struct).fields:  # type: ignore[attr-defined]
        at = (*path, field.name)
        name = rename.get(".".join(at)) or (prefix + _snake(field.name))
        kind, optional = _unwrap(field.type)
        if isinstance(kind, mi.StructType):
            inner = len(at) if optional else optional_at
            columns += _flatten(kind.cls, at, name + "_", rename, int32, inner)
            continue
        arrow = pa.int32() if name in int32 else _arrow(kind, f"{struct.__name__}.{field.name}")
        top = field.name if not path else None
        columns.append(Column(name, arrow, _getter(at, optional_at), top))
    return columns


def _unwrap(kind: mi.Type) -> tuple[mi.Type, bool]:
    """The type under its metadata and `| None`, and whether None was allowed."""
    optional = False
    while True:
        if isinstance(kind, mi.Metadata):
            kind = kind.type
        elif isinstance(kind, mi.UnionType):
            others = [t for t in kind.types if not isinstance(t, mi.NoneType)]
            if len(others) != 1:
                msg = f"a lake column: expected one type or one type | None, got {kind}"
                raise TypeError(msg)
            optional, kind = True, others[0]
        else:
            return kind, optional


def _arrow(kind: mi.Type, where: str) -> pa.DataType:
    if isinstance(kind, mi.StrType | mi.LiteralType):
        return pa.string()
    if isinstance(kind, mi.BoolType):
        return pa.bool_()
    if isinstance(kind, mi.FloatType):
        return pa.float64()
    if isinstance(kind, mi.IntType):
        return _int(kind)
    if isinstance(kind, mi.ListType) and isinstance(_unwrap(kind.item_type)[0], mi.StrType):
        return STRINGS
    if isinstance(kind, mi.DictType) and all(
        isinstance(_unwrap(t)[0], mi.StrType) for t in (kind.key_type, kind.value_type)
    ):
        return LABELS
    msg = f"{where}: expected a type the lake can hold (str, bool, number, list[str], "
    msg += f"dict[str, str] or a struct of those), got {kind}"
    raise TypeError(msg)


def _int(kind: mi.IntType) -> pa.DataType:
    if kind.ge is not None and kind.ge >= _EPOCH_MS_MIN and kind.le is not None:
        return TIMESTAMP
    low = kind.ge if kind.ge is not None else kind.gt
    high = kind.le if kind.le is not None else kind.lt
    if low is not None and high is not None and _INT32[0] <= low and high <= _INT32[1]:
        return pa.int32()
    return pa.int64()


def _getter(path: tuple[str, ...], optional_at: int | None) -> Callable[[Any], Any]:
    if optional_at is None:
        return attrgetter(".".join(path))
    # Inside an optional struct: NULL when it is absent.
    outer = attrgetter(".".join(path[:optional_at]))
    inner = attrgetter(".".join(path[optional_at:]))
    return lambda event: None if (found := outer(event)) is None else inner(found)


def _snake(name: str) -> str:
    """camelCase (Alertmanager's startsAt, generatorURL) as snake_case."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
