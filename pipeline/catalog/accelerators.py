"""Accelerator types as FleetPulse compares them (accelerators.csv): one canonical name per type,
recognised in whatever name a source uses, with its family and peak dense BF16 TFLOPS.

The sources name one type many ways: GKE's label `nvidia-h100-80gb`, DCGM's modelName `NVIDIA
H100 80GB HBM3`, the quota metric `nvidia_h100_80gb_gpus`, a TPU accelerator type
`v5litepod-16` or quota `v5e_chips`. Capacity is counted per canonical type, so they must meet.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ._csv import Row, read_rows

_COLUMNS = ("type", "kind", "match", "family", "bf16_tflops", "source")


@dataclass(frozen=True, slots=True)
class AcceleratorType:
    """One row of accelerators.csv."""

    type: str
    kind: str  # gpu or tpu
    match: str
    family: str
    bf16_tflops: float
    source: str


@functools.cache
def accelerator_types() -> tuple[AcceleratorType, ...]:
    """Every type, in file order (which is also match priority)."""
    return tuple(_type(row) for row in read_rows("accelerators.csv", _COLUMNS))


@functools.cache
def canonical_type(name: str) -> str | None:
    """The canonical type of a source's name for it, or None when no row matches. Underscores
    read as dashes (quota metrics spell `nvidia_h100_80gb_gpus`)."""
    text = name.replace("_", "-")
    for row in accelerator_types():
        if _pattern(row.match).search(text) is not None:
            return row.type
    return None


def type_facts(type_name: str) -> AcceleratorType | None:
    return next((row for row in accelerator_types() if row.type == type_name), None)


def equivalents(type_name: str) -> tuple[str, ...]:
    """The other types of `type_name`'s family, in file order (none for an unknown type)."""
    facts = type_facts(type_name)
    if facts is None:
        return ()
    return tuple(
        row.type
        for row in accelerator_types()
        if row.family == facts.family and row.type != type_name
    )


@functools.cache
def _pattern(match: str) -> re.Pattern[str]:
    return re.compile(match, re.IGNORECASE)


def _type(row: Row) -> AcceleratorType:
    facts = AcceleratorType(
        type=row.text("type"),
        kind=row.choice("kind", ("gpu", "tpu")),
        match=row.text("match"),
        family=row.text("family"),
        bf16_tflops=row.number("bf16_tflops"),
        source=row.text("source"),
    )
    if facts.bf16_tflops <= 0:
        msg = f"{row.where}: bf16_tflops must be positive, got {facts.bf16_tflops}"
        raise ValueError(msg)
    try:
        _pattern(facts.match)
    except re.error as error:
        msg = f"{row.where}: match {facts.match!r} is not a valid regex: {error}"
        raise ValueError(msg) from error
    return facts
