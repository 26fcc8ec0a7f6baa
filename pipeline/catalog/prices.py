"""Default accelerator list prices, for cost estimates that config has not overridden."""

import functools
import re
from dataclasses import dataclass

from ._csv import Row, read_rows

_COLUMNS = ("accelerator", "model_match", "usd_per_hour", "source", "as_of")
_AS_OF = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")


@dataclass(frozen=True, slots=True)
class AcceleratorPrice:
    """One row of prices.csv: an on-demand list price per GPU-hour or TPU chip-hour."""

    accelerator: str
    model_match: str
    usd_per_hour: float
    source: str
    as_of: str

    def matches(self, model: str) -> bool:
        """Whether `model` (a DCGM modelName, GKE label or TPU type) is this accelerator."""
        return _pattern(self.model_match).search(model) is not None


@functools.cache
def accelerator_prices() -> tuple[AcceleratorPrice, ...]:
    """Every list price, in file order (which is also match priority)."""
    return tuple(_price(row) for row in read_rows("prices.csv", _COLUMNS))


def price_for(model: str) -> AcceleratorPrice | None:
    """The first price whose `model_match` is found in `model`, or None."""
    for price in accelerator_prices():
        if price.matches(model):
            return price
    return None


@functools.cache
def _pattern(model_match: str) -> re.Pattern[str]:
    return re.compile(model_match, re.IGNORECASE)


def _price(row: Row) -> AcceleratorPrice:
    price = AcceleratorPrice(
        accelerator=row.text("accelerator"),
        model_match=row.text("model_match"),
        usd_per_hour=row.number("usd_per_hour"),
        source=row.text("source"),
        as_of=row.text("as_of"),
    )
    if price.usd_per_hour <= 0:
        msg = f"{row.where}: usd_per_hour must be positive, got {price.usd_per_hour}"
        raise ValueError(msg)
    if not _AS_OF.fullmatch(price.as_of):
        msg = f"{row.where}: as_of must be YYYY-MM, got {price.as_of!r}"
        raise ValueError(msg)
    try:
        _pattern(price.model_match)
    except re.error as error:
        msg = f"{row.where}: model_match {price.model_match!r} is not a valid regex: {error}"
        raise ValueError(msg) from error
    return price
