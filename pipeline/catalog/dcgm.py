"""DCGM field catalog: id, unit and Prometheus kind of every field FleetPulse reads."""

import functools
from dataclasses import dataclass
from typing import Literal, get_args

from ._csv import Row, read_rows

FieldKind = Literal["gauge", "counter", "label", "bitmask"]

FIELD_KINDS: tuple[FieldKind, ...] = get_args(FieldKind)

_COLUMNS = ("name", "field_id", "unit", "kind", "default_on", "description", "source")


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One row of dcgm_fields.csv; see the header of that file for the column meanings."""

    name: str
    field_id: int
    unit: str
    kind: FieldKind
    default_on: bool
    description: str
    source: str


@functools.cache
def dcgm_fields() -> tuple[DcgmField, ...]:
    """Every catalogued field, in file order (ascending field id)."""
    fields = tuple(_field(row) for row in read_rows("dcgm_fields.csv", _COLUMNS))
    _check_unique(fields)
    return fields


def dcgm_field(name: str) -> DcgmField | None:
    """The field whose metric name is `name`, or None.

    Matching ignores case because dcgm-exporter 1.x (`--use-old-namespace`)
    printed the same names in lower case (`dcgm_fi_dev_gpu_temp`).
    """
    return _by_name().get(name.upper())


def dcgm_field_by_id(field_id: int) -> DcgmField | None:
    """The field with DCGM id `field_id`, or None."""
    return _by_id().get(field_id)


@functools.cache
def _by_name() -> dict[str, DcgmField]:
    return {field.name: field for field in dcgm_fields()}


@functools.cache
def _by_id() -> dict[int, DcgmField]:
    return {field.field_id: field for field in dcgm_fields()}


def _field(row: Row) -> DcgmField:
    return DcgmField(
        name=row.text("name"),
        field_id=row.integer("field_id"),
        unit=row.text("unit"),
        kind=row.choice("kind", FIELD_KINDS),
        default_on=row.boolean("default_on"),
        description=row.text("description"),
        source=row.text("source"),
    )


def _check_unique(fields: tuple[DcgmField, ...]) -> None:
    # A duplicated id or name would make one of the lookups silently pick a row.
    for attribute in ("name", "field_id"):
        values = [getattr(field, attribute) for field in fields]
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            msg = f"dcgm_fields.csv: duplicate {attribute} values {duplicates}"
            raise ValueError(msg)
