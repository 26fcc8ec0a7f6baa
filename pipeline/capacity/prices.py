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
