"""Prices per device-hour by accelerator type and region (gcp_prices.csv: the SkyPilot catalog's
GCP list prices, dated, per GPU or TPU chip). Columns the catalog lacks are None, never 0."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ._csv import Row, read_rows

_COLUMNS = (
    "type", "region", "on_demand", "spot", "committed_1y", "committed_3y", "unit", "source"
)  # fmt: skip
BASES = ("on-demand", "spot", "committed-1y", "committed-3y")
CATALOG = "SkyPilot catalog v7 gcp/vms.csv @017e250 (read 2026-12-07)"


@dataclass(frozen=True, slots=True)
class RegionPrice:
    type: str  # catalog/accelerators.csv type
    region: str
    on_demand: float
    spot: float | None
    committed_1y: float | None
    committed_3y: float | None
    unit: str  # what the catalog priced (a machine type and its GPUs, a slice)
    source: str

    def column(self, basis: str) -> float | None:
        """The price for `basis` (on-demand, spot, committed-1y, committed-3y)."""
        return {
            "on-demand": self.on_demand,
            "spot": self.spot,
            "committed-1y": self.committed_1y,
            "committed-3y": self.committed_3y,
        }[basis]


@functools.cache
def region_prices() -> tuple[RegionPrice, ...]:
    return tuple(_price(row) for row in read_rows("gcp_prices.csv", _COLUMNS))


def region_price(accelerator_type: str, region: str) -> RegionPrice | None:
    return next(
        (p for p in region_prices() if (p.type, p.region) == (accelerator_type, region)), None
    )


def _optional(row: Row, column: str) -> float | None:
    return None if row.text(column) == "" else _positive(row, column)


def _positive(row: Row, column: str) -> float:
    value = row.number(column)
    if value <= 0:
        msg = f"{row.where}: {column} must be positive, got {value}"
        raise ValueError(msg)
    return value


def _price(row: Row) -> RegionPrice:
    return RegionPrice(
        type=row.text("type"),
        region=row.text("region"),
        on_demand=_positive(row, "on_demand"),
        spot=_optional(row, "spot"),
        committed_1y=_optional(row, "committed_1y"),
        committed_3y=_optional(row, "committed_3y"),
        unit=row.text("unit"),
        source=row.text("source"),
    )
