"""Cloud TPU generations, slice shapes and the ICI neighbour graph of a slice.

Conventions (documented here because callers depend on them):

* Chip ids are row-major over the topology: for ``AxBxC`` the last dimension
  varies fastest, so chip ``(a, b, c)`` has id ``(a * B + b) * C + c``.
* ICI ports are numbered ``2 * dim`` (towards ``coord - 1``) and ``2 * dim + 1``
  (towards ``coord + 1``), so a 3D chip has ports 0-5 and a 2D chip 0-3.
* A port has no link where the slice edge has no wraparound.  In a wrapped
  dimension of size 2 both directions reach the same peer; the chip then lists
  that peer once, on the non-wrapping (mesh) port, so no peer appears twice for
  one dimension.  Dimensions of size 1 have no links.
* Hosts (TPU VM workers) own contiguous blocks of the topology: 2x2x1 for
  v4/v5p and 2x4 for v5e/v6e (clamped for smaller slices).  Host ids are
  row-major over those blocks, like chip ids over chips.  A topology that does
  not split into ``chips // chips_per_host`` such blocks is rejected.
"""

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import Literal, get_args

from ._csv import Row, read_rows

TypeCounts = Literal["tensorcores", "chips"]
WrapRule = Literal["all_dims_multiple_of_4", "all_dims_at_least_4", "dim_at_least_4"]

TYPE_COUNTS: tuple[TypeCounts, ...] = get_args(TypeCounts)
WRAP_RULES: tuple[WrapRule, ...] = get_args(WrapRule)

_GENERATION_COLUMNS = (
    "generation",
    "type_prefix",
    "type_counts",
    "api_type",
    "tensorcores_per_chip",
    "hbm_gib",
    "chips_per_host",
    "host_block",
    "ici_ports_per_chip",
    "torus_dims",
    "wrap_rule",
    "gke_accelerator",
    "source",
)
_SLICE_COLUMNS = ("generation", "accelerator_type", "topology", "chips", "hosts", "source")
_TOPOLOGY = re.compile(r"[1-9][0-9]*(?:x[1-9][0-9]*)+")
_ACCELERATOR_TYPE = re.compile(r"([a-z0-9]+)-([1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class TpuGeneration:
    """One row of tpu.csv; see the header of that file for the column meanings."""

    generation: str
    type_prefix: str
    type_counts: TypeCounts
    api_type: str
    tensorcores_per_chip: int
    hbm_gib: int
    chips_per_host: int
    host_block: tuple[int, ...]
    ici_ports_per_chip: int
    torus_dims: int
    wrap_rule: WrapRule
    gke_accelerator: str
    source: str


@dataclass(frozen=True, slots=True)
class SliceShape:
    """A validated TPU slice: its generation, topology and host layout."""

    accelerator_type: str
    generation: TpuGeneration
    dims: tuple[int, ...]
    chips: int
    hosts: int
    wraparound: tuple[bool, ...]
    host_block: tuple[int, ...]

    @property
    def topology(self) -> str:
        return "x".join(str(size) for size in self.dims)


@dataclass(frozen=True, slots=True)
class KnownSlice:
    """One row of tpu_slices.csv: a real slice shape with its chip and host counts."""

    generation: str
    accelerator_type: str
    topology: str
    chips: int
    hosts: int
    source: str


@functools.cache
def tpu_generations() -> tuple[TpuGeneration, ...]:
    """Every catalogued TPU generation, in file order."""
    return tuple(_generation(row) for row in read_rows("tpu.csv", _GENERATION_COLUMNS))


@functools.cache
def known_slices() -> tuple[KnownSlice, ...]:
    """Real slice shapes (the v5p table from the Cloud TPU docs, v5e/v6e/v4 examples)."""
    return tuple(_known_slice(row) for row in read_rows("tpu_slices.csv", _SLICE_COLUMNS))


def tpu_generation(name: str) -> TpuGeneration:
    """The generation named by `name`.

    Accepts the generation (``v5e``), the accelerator-type prefix
    (``v5litepod``), an accelerator type (``v5litepod-16``), the TPU API enum
    (``V5LITE_POD``) or the GKE label value (``tpu-v5-lite-podslice``).
    """
    key = name.strip().lower()
    match = _ACCELERATOR_TYPE.fullmatch(key)
    candidates = (key, match.group(1)) if match else (key,)
    for generation in tpu_generations():
        aliases = _aliases(generation)
        if any(candidate in aliases for candidate in candidates):
            return generation
    known = [generation.generation for generation in tpu_generations()]
    msg = f"unknown TPU generation {name!r}; known generations: {known}"
    raise ValueError(msg)


def accelerator_chips(accelerator_type: str) -> int:
    """Chips in a slice of `accelerator_type` (``v5p-128`` -> 64, ``v6e-16`` -> 16)."""
    generation, count = _split_accelerator_type(accelerator_type)
    if generation.type_counts == "chips":
        return count
    if count % generation.tensorcores_per_chip:
        msg = (
            f"accelerator type {accelerator_type!r} counts TensorCores, so it must be a "
            f"multiple of {generation.tensorcores_per_chip}"
        )
        raise ValueError(msg)
    return count // generation.tensorcores_per_chip


def accelerator_type_of(api_type: str, topology: str) -> str:
    """The accelerator type an `acceleratorConfig` (TPU API type enum and topology) names:
    ("V5P", "2x2x2") -> "v5p-16" (TensorCores), ("V5LITE_POD", "4x4") -> "v5litepod-16"."""
    generation = tpu_generation(api_type)
    chips = math.prod(parse_topology(topology, generation))
    per_chip = generation.tensorcores_per_chip if generation.type_counts == "tensorcores" else 1
    return f"{generation.type_prefix}-{chips * per_chip}"


def parse_topology(topology: str, generation: TpuGeneration | str | None = None) -> tuple[int, ...]:
    """Parse ``"4x4x8"`` into ``(4, 4, 8)``.

    With a generation, the number of dimensions must match its torus
    (3 for v4/v5p, 2 for v5e/v6e).
    """
    if not _TOPOLOGY.fullmatch(topology):
        msg = f"invalid TPU topology {topology!r}: expected sizes joined by 'x', e.g. '4x4x8'"
        raise ValueError(msg)
    dims = tuple(int(size) for size in topology.split("x"))
    if generation is None:
        return dims
    if isinstance(generation, str):
        generation = tpu_generation(generation)
    if len(dims) != generation.torus_dims:
        msg = (
            f"invalid TPU topology {topology!r} for {generation.generation}: expected "
            f"{generation.torus_dims} dimensions, got {len(dims)}"
        )
        raise ValueError(msg)
    return dims


def slice_shape(accelerator_type: str, topology: str) -> SliceShape:
    """Validate an accelerator type and topology together and describe the slice."""
    generation, _ = _split_accelerator_type(accelerator_type)
    chips = accelerator_chips(accelerator_type)
    dims = parse_topology(topology, generation)
    if math.prod(dims) != chips:
        msg = (
            f"topology {topology!r} holds {math.prod(dims)} chips but accelerator type "
            f"{accelerator_type!r} has {chips}"
        )
        raise ValueError(msg)
    hosts = max(1, chips // generation.chips_per_host)
    block = _host_block(generation, dims, hosts, topology)
    return SliceShape(
        accelerator_type=accelerator_type,
        generation=generation,
        dims=dims,
        chips=chips,
        hosts=hosts,
        wraparound=_wraparound(generation.wrap_rule, dims),
        host_block=block,
    )


def chip_coords(shape: SliceShape) -> list[tuple[int, ...]]:
    """Coordinates of every chip, indexed by chip id (row-major)."""
    return list(itertools.product(*(range(size) for size in shape.dims)))


def chip_id_at(shape: SliceShape, coords: tuple[int, ...]) -> int:
    """The chip id at `coords`; the inverse of ``chip_coords(shape)[chip_id]``."""
    inside = len(coords) == len(shape.dims) and all(
        0 <= coord < size for coord, size in zip(coords, shape.dims, strict=True)
    )
    if not inside:
        msg = f"coordinates {coords} are outside topology {shape.topology}"
        raise ValueError(msg)
    chip_id = 0
    for coord, size in zip(coords, shape.dims, strict=True):
        chip_id = chip_id * size + coord
    return chip_id


def ici_neighbours(shape: SliceShape, chip_id: int) -> list[tuple[int, int]]:
    """ICI links of `chip_id` as ``(port, peer_chip_id)`` pairs, ordered by port."""
    coords = _coords(shape, chip_id)
    links: list[tuple[int, int]] = []
    for dim, size in enumerate(shape.dims):
        links.extend(_links_in_dim(shape, coords, dim, size))
    return links


def host_of_chip(shape: SliceShape, chip_id: int) -> int:
    """The worker id (0-based host index in the slice) that owns `chip_id`."""
    coords = _coords(shape, chip_id)
    host = 0
    for coord, size, block in zip(coords, shape.dims, shape.host_block, strict=True):
        host = host * (size // block) + coord // block
    return host


def _links_in_dim(
    shape: SliceShape, coords: tuple[int, ...], dim: int, size: int
) -> list[tuple[int, int]]:
    wraps = shape.wraparound[dim]
    coord = coords[dim]
    # (port, peer coordinate, whether the link crosses the slice edge)
    candidates = [(2 * dim, coord - 1, coord == 0), (2 * dim + 1, coord + 1, coord == size - 1)]
    usable = [
        (port, peer % size, crosses)
        for port, peer, crosses in candidates
        if size > 1 and (wraps or not crosses)
    ]
    if len(usable) == 2 and usable[0][1] == usable[1][1]:
        # Size-2 wrapped dimension: keep only the mesh link (see module docstring).
        usable = [link for link in usable if not link[2]]
    return [
        (port, chip_id_at(shape, (*coords[:dim], peer, *coords[dim + 1 :])))
        for port, peer, _ in usable
    ]


def _coords(shape: SliceShape, chip_id: int) -> tuple[int, ...]:
    if not 0 <= chip_id < shape.chips:
        msg = f"chip id {chip_id} is outside slice {shape.accelerator_type} ({shape.chips} chips)"
        raise ValueError(msg)
    coords: list[int] = []
    for size in reversed(shape.dims):
        chip_id, coord = divmod(chip_id, size)
        coords.append(coord)
    return tuple(reversed(coords))


def _wraparound(rule: WrapRule, dims: tuple[int, ...]) -> tuple[bool, ...]:
    if rule == "dim_at_least_4":
        return tuple(size >= 4 for size in dims)
    if rule == "all_dims_at_least_4":
        return (all(size >= 4 for size in dims),) * len(dims)
    return (all(size % 4 == 0 for size in dims),) * len(dims)


def _host_block(
    generation: TpuGeneration, dims: tuple[int, ...], hosts: int, topology: str
) -> tuple[int, ...]:
    block = tuple(min(b, size) for b, size in zip(generation.host_block, dims, strict=True))
    tiles = all(size % b == 0 for size, b in zip(dims, block, strict=True))
    if not tiles or math.prod(size // b for size, b in zip(dims, block, strict=True)) != hosts:
        block_text = "x".join(str(b) for b in generation.host_block)
        msg = (
            f"topology {topology!r} cannot be split into {hosts} {generation.generation} "
            f"hosts of {block_text} chips"
        )
        raise ValueError(msg)
    return block


def _split_accelerator_type(accelerator_type: str) -> tuple[TpuGeneration, int]:
    match = _ACCELERATOR_TYPE.fullmatch(accelerator_type.strip().lower())
    if match is None:
        msg = f"invalid TPU accelerator type {accelerator_type!r}: expected e.g. 'v5p-128'"
        raise ValueError(msg)
    return tpu_generation(match.group(1)), int(match.group(2))


def _aliases(generation: TpuGeneration) -> set[str]:
    names = (
        generation.generation,
        generation.type_prefix,
        generation.api_type.lower(),
        generation.gke_accelerator,  # empty for v2 / v3: GKE has no label for them
    )
    return {name for name in names if name}


def _generation(row: Row) -> TpuGeneration:
    torus_dims = row.integer("torus_dims")
    host_block = parse_topology(row.text("host_block"))
    if len(host_block) != torus_dims:
        msg = f"{row.where}: host_block must have {torus_dims} dimensions, got {host_block}"
        raise ValueError(msg)
    return TpuGeneration(
        generation=row.text("generation"),
        type_prefix=row.text("type_prefix"),
        type_counts=row.choice("type_counts", TYPE_COUNTS),
        api_type=row.text("api_type"),
        tensorcores_per_chip=row.integer("tensorcores_per_chip"),
        hbm_gib=row.integer("hbm_gib"),
        chips_per_host=row.integer("chips_per_host"),
        host_block=host_block,
        ici_ports_per_chip=row.integer("ici_ports_per_chip"),
        torus_dims=torus_dims,
        wrap_rule=row.choice("wrap_rule", WRAP_RULES),
        gke_accelerator=row.text("gke_accelerator"),
        source=row.text("source"),
    )


def _known_slice(row: Row) -> KnownSlice:
    return KnownSlice(
        generation=row.text("generation"),
        accelerator_type=row.text("accelerator_type"),
        topology=row.text("topology"),
        chips=row.integer("chips"),
        hosts=row.integer("hosts"),
        source=row.text("source"),
    )
