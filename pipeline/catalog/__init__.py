"""Accelerator facts as data: XID catalog, DCGM fields, TPU topology, list prices.

Each loader reads a CSV shipped in this package once (``functools.cache``) and
returns immutable rows; every CSV carries its source notes in ``#`` comments.
"""

from .dcgm import FIELD_KINDS, DcgmField, FieldKind, dcgm_field, dcgm_field_by_id, dcgm_fields
from .prices import AcceleratorPrice, accelerator_prices, price_for
from .tpu import (
    KnownSlice,
    SliceShape,
    TpuGeneration,
    accelerator_chips,
    accelerator_type_of,
    chip_coords,
    chip_id_at,
    host_of_chip,
    ici_neighbours,
    known_slices,
    parse_topology,
    slice_shape,
    tpu_generation,
    tpu_generations,
)
from .xid import ACTIONS, SEVERITIES, Action, Severity, XidEntry, unknown_xid, xid_catalog, xid_info

__all__ = [
    "ACTIONS",
    "FIELD_KINDS",
    "SEVERITIES",
    "AcceleratorPrice",
    "Action",
    "DcgmField",
    "FieldKind",
    "KnownSlice",
    "Severity",
    "SliceShape",
    "TpuGeneration",
    "XidEntry",
    "accelerator_chips",
    "accelerator_prices",
    "accelerator_type_of",
    "chip_coords",
    "chip_id_at",
    "dcgm_field",
    "dcgm_field_by_id",
    "dcgm_fields",
    "host_of_chip",
    "ici_neighbours",
    "known_slices",
    "parse_topology",
    "price_for",
    "slice_shape",
    "tpu_generation",
    "tpu_generations",
    "unknown_xid",
    "xid_catalog",
    "xid_info",
]
