"""The dated price catalog and the price every cost figure names."""

from __future__ import annotations

from pipeline.capacity.prices import NEGOTIATED_SOURCE, catalog_book
from pipeline.catalog.accelerators import accelerator_types, type_facts
from pipeline.catalog.gcp_prices import region_price, region_prices


def test_every_catalog_row_is_a_known_type_with_a_price_and_its_source() -> None:
    known = {t.type for t in accelerator_types()}
    for row in region_prices():
        assert row.type in known
        assert row.on_demand > 0 and (row.spot is None or 0 < row.spot < row.on_demand)
        assert "017e250" in row.source
    # placeholders (700.0 for a slice of one chip: "not offered") were left out
    assert all(row.on_demand < 100 for row in region_prices())


def test_device_prices_are_the_machine_or_slice_divided_by_its_devices() -> None:
    v5p = region_price("tpu-v5p", "us-central1")
    assert v5p is not None and (v5p.on_demand, v5p.spot) == (4.2, 1.68)  # v5p-8: 16.8 / 4 chips
    h200 = region_price("nvidia-h200-141gb", "europe-west4")
    assert h200 is not None
    assert h200.on_demand == round((12.8793 + 36.60258) / 8, 5)  # a3-ultragpu-8g + 8 x H200


def test_the_book_says_which_price_and_where() -> None:
    book = catalog_book()
    zonal = book.price("tpu-v6e", "us-east5-b", "on-demand")
    assert zonal is not None
    assert (zonal.basis, zonal.location, zonal.usd_per_hour) == ("on-demand", "us-east5", 2.7)
    assert "017e250" in zonal.source
    spot = book.price("tpu-v6e", "us-east5-b", "spot")
    assert spot is not None and (spot.basis, spot.usd_per_hour) == ("spot", 1.08)
    elsewhere = book.price("tpu-v6e", "mars-north1-a", "on-demand")  # no row there
    assert elsewhere is not None and elsewhere.location == "*"
    assert elsewhere.usd_per_hour == min(
        r.on_demand for r in region_prices() if r.type == "tpu-v6e"
    )
    assert book.price("nvidia-l4", "us-central1-a", "on-demand") is None  # not in the catalog


def test_negotiated_prices_win_and_committed_use_is_unknown_not_zero() -> None:
    book = catalog_book({"tpu-v5p": 2.5}, basis="committed-1y")
    negotiated = book.price("tpu-v5p", "us-east5-a", "on-demand")
    assert negotiated is not None
    assert (negotiated.basis, negotiated.usd_per_hour) == ("negotiated", 2.5)
    assert negotiated.source == NEGOTIATED_SOURCE
    assert book.price("tpu-v6e", "us-east5-a", "on-demand") is None  # no committed-use column


def test_accelerator_facts_are_sourced() -> None:
    for facts in accelerator_types():
        assert facts.bf16_tflops > 0 and facts.source
    h100 = type_facts("nvidia-h100-80gb")
    assert h100 is not None and h100.bf16_tflops == 989.4
