"""Which price a cost figure uses, said with the figure (PriceUsed).

The book is data the caller builds (from the price catalog and the fleet's settings): a price
per type, location (zone, region or "*") and basis (on-demand, spot, committed-1y,
committed-3y). A fleet's negotiated price for a type wins over any catalog row; otherwise a
spot device takes the spot column and any other device the configured basis, looked up in
its zone, then its region, then anywhere (the cheapest there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.capacity.state import region_of
from pipeline.catalog.gcp_prices import BASES, CATALOG, RegionPrice, region_prices
from pipeline.model import PriceUsed

NEGOTIATED_SOURCE = "capacity.negotiated_prices (this fleet's setting)"


@dataclass(frozen=True)
class CatalogPrice:
    usd_per_hour: float  # per device (GPU or TPU chip)
    source: str  # the catalog, its commit and date


@dataclass(frozen=True)
class PriceBook:
    # (type, location, basis) -> price; location is a zone, a region or "*"
    prices: Mapping[tuple[str, str, str], CatalogPrice] = field(default_factory=dict)
    negotiated: Mapping[str, float] = field(default_factory=dict)
    basis: str = "on-demand"  # the column for devices that are not spot

    def price(self, accelerator_type: str, zone: str, model: str) -> PriceUsed | None:
        """The price of one device-hour of `accelerator_type` in `zone` bought as `model`."""
        if accelerator_type in self.negotiated:
            usd = self.negotiated[accelerator_type]
            return PriceUsed(usd_per_hour=usd, basis="negotiated", source=NEGOTIATED_SOURCE)
        basis = "spot" if model == "spot" else self.basis
        for location in (zone, region_of(zone), "*"):
            found = self.prices.get((accelerator_type, location, basis))
            if found is not None:
                return PriceUsed(
                    usd_per_hour=found.usd_per_hour,
                    basis=basis,  # type: ignore[arg-type]
                    source=found.source,
                    location=location,
                )
        return None


def catalog_book(
    negotiated: Mapping[str, float] | None = None,
    basis: str = "on-demand",
    rows: tuple[RegionPrice, ...] | None = None,
) -> PriceBook:
    """The book of the dated price catalog (catalog/gcp_prices.csv) per region, with the
    cheapest region of each type and basis as the "*" fallback, and the fleet's own prices."""
    prices: dict[tuple[str, str, str], CatalogPrice] = {}
    for row in region_prices() if rows is None else rows:
        for column in BASES:
            usd = row.column(column)
            if usd is None:
                continue
            source = f"{CATALOG}, {row.region}: {row.unit}"
            prices[(row.type, row.region, column)] = CatalogPrice(usd, source)
            anywhere = prices.get((row.type, "*", column))
            if anywhere is None or usd < anywhere.usd_per_hour:
                prices[(row.type, "*", column)] = CatalogPrice(usd, source)
    return PriceBook(prices=prices, negotiated=dict(negotiated or {}), basis=basis)
