"""Tests for pipeline.catalog: the data files and the TPU topology functions."""

import dataclasses
import math
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.catalog import (
    ACTIONS,
    SEVERITIES,
    KnownSlice,
    SliceShape,
    accelerator_chips,
    accelerator_prices,
    chip_coords,
    chip_id_at,
    dcgm_field,
    dcgm_field_by_id,
    dcgm_fields,
    host_of_chip,
    ici_neighbours,
    known_slices,
    parse_topology,
    price_for,
    slice_shape,
    tpu_generation,
    tpu_generations,
    unknown_xid,
    xid_catalog,
    xid_info,
)
from pipeline.catalog._csv import Row

# ---------------------------------------------------------------- XID catalog

APPLICATION_XIDS = [13, 31, 32, 43, 45, 68, 69, 94]
# Every code data-shapes.md §2.2 lists (ranges and "a / b" rows expanded) plus 167-172.
REQUIRED_XIDS = [
    8, 13, 31, 32, 43, 45, 46, 48, 54, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 110,
    119, 120, 121, 136, 140, 143, 144, 145, 146, 147, 148, 149, 150, 151, 154, 155, 156, 157,
    158, 159, 160, 161, 167, 168, 171, 172,
]  # fmt: skip


@pytest.mark.parametrize(
    ("code", "action", "fatal", "severity"),
    [
        (79, "reboot", True, "critical"),
        (48, "reset_gpu", True, "critical"),
        (46, "reset_gpu", True, "critical"),
        (54, "replace", True, "critical"),
        (63, "watch", False, "warning"),
        (64, "reset_gpu", True, "critical"),
        (74, "reset_gpu", True, "critical"),
        (92, "watch", False, "warning"),
        (95, "reset_gpu", True, "critical"),
        (119, "reset_gpu", True, "critical"),
        (144, "reset_gpu", True, "critical"),
        (150, "reset_gpu", True, "critical"),
        (151, "reboot", True, "critical"),
        (154, "watch", False, "warning"),
        (160, "reboot", True, "critical"),
    ],
)
def test_xid_action(code: int, action: str, fatal: bool, severity: str) -> None:
    entry = xid_info(code)
    assert (entry.action, entry.fatal, entry.severity) == (action, fatal, severity)


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_application_xids_never_cordon(code: int) -> None:
    entry = xid_info(code)
    assert entry.application
    assert not entry.fatal
    assert entry.action in ("restart_app", "none")


@pytest.mark.parametrize("code", REQUIRED_XIDS)
def test_required_xid_is_catalogued(code: int) -> None:
    entry = xid_catalog()[code]
    assert entry.code == code
    assert entry.mnemonic != "UNKNOWN"
    assert entry.source


def test_mnemonics_of_expanded_rows() -> None:
    assert xid_info(68).mnemonic == "ROBUST_CHANNEL_NVDEC0_ERROR"
    assert xid_info(69).mnemonic == "ROBUST_CHANNEL_GR_CLASS_ERROR"
    assert xid_info(149).mnemonic == "NVLINK_NETIR_ERROR"
    assert {xid_info(code).bucket for code in range(144, 151)} == {"WORKFLOW_NVLINK5_ERR"}


@pytest.mark.parametrize("code", [0, 1, 9999, -1])
def test_unknown_code_gets_conservative_default(code: int) -> None:
    entry = xid_info(code)
    assert entry == unknown_xid(code)
    assert entry.code == code
    assert entry.mnemonic == "UNKNOWN"
    assert (entry.severity, entry.action, entry.fatal) == ("warning", "watch", False)


def test_every_xid_row_uses_the_vocabulary() -> None:
    for entry in xid_catalog().values():
        assert entry.action in ACTIONS, entry
        assert entry.severity in SEVERITIES, entry


def test_fatal_xids_are_critical_and_never_ignored() -> None:
    for entry in xid_catalog().values():
        if entry.fatal:
            assert entry.severity == "critical", entry
            assert entry.action not in ("none", "restart_app"), entry


def test_application_xids_are_exactly_the_listed_ones() -> None:
    flagged = sorted(code for code, entry in xid_catalog().items() if entry.application)
    assert flagged == APPLICATION_XIDS


@pytest.mark.parametrize(
    ("bucket", "action"),
    [
        ("RESET_GPU", "reset_gpu"),
        ("WORKFLOW_XID_48", "reset_gpu"),
        ("WORKFLOW_NVLINK_ERR", "reset_gpu"),
        ("WORKFLOW_NVLINK5_ERR", "reset_gpu"),
        ("RESTART_BM", "reboot"),
        ("RESTART_VM", "reboot"),
        ("CHECK_MECHANICALS", "replace"),
        ("RESTART_APP", "restart_app"),
    ],
)
def test_bucket_maps_to_action(bucket: str, action: str) -> None:
    rows = [entry for entry in xid_catalog().values() if entry.bucket == bucket]
    assert rows
    assert {entry.action for entry in rows} == {action}


def test_xid_catalog_is_read_only() -> None:
    with pytest.raises(TypeError):
        xid_catalog()[1] = unknown_xid(1)  # type: ignore[index]


# ---------------------------------------------------------------- DCGM fields

REQUIRED_FIELDS = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 112,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_PCIE_LINK_GEN": 237,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 238,
    "DCGM_FI_DEV_POWER_VIOLATION": 240,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 241,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 409,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 419,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 429,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 439,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_SM_ACTIVE": 1002,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": 1523,
}

COUNTER_FIELDS = [
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]


def test_dcgm_ids_and_names_unique() -> None:
    fields = dcgm_fields()
    assert len({field.field_id for field in fields}) == len(fields)
    assert len({field.name for field in fields}) == len(fields)
    assert all(field.name.startswith("DCGM_FI_") for field in fields)


@pytest.mark.parametrize(("name", "field_id"), sorted(REQUIRED_FIELDS.items()))
def test_required_dcgm_field(name: str, field_id: int) -> None:
    field = dcgm_field(name)
    assert field is not None
    assert field.field_id == field_id
    assert dcgm_field_by_id(field_id) == field


@pytest.mark.parametrize("name", COUNTER_FIELDS)
def test_error_fields_are_counters(name: str) -> None:
    field = dcgm_field(name)
    assert field is not None
    assert field.kind == "counter"


@pytest.mark.parametrize(
    ("name", "kind", "default_on"),
    [
        ("DCGM_FI_DRIVER_VERSION", "label", True),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "bitmask", False),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", True),
        ("DCGM_FI_DEV_FB_TOTAL", "gauge", False),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", False),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge", False),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", True),
    ],
)
def test_dcgm_kind_and_default(name: str, kind: str, default_on: bool) -> None:
    field = dcgm_field(name)
    assert field is not None
    assert (field.kind, field.default_on) == (kind, default_on)


def test_dcgm_lookup_is_case_insensitive_and_misses_cleanly() -> None:
    assert dcgm_field("dcgm_fi_dev_gpu_temp") == dcgm_field("DCGM_FI_DEV_GPU_TEMP")
    assert dcgm_field("DCGM_FI_NOT_A_FIELD") is None
    assert dcgm_field_by_id(999_999) is None


# ---------------------------------------------------------------- TPU generations


@pytest.mark.parametrize(
    ("name", "tensorcores", "chips_per_host", "ports", "dims", "gke"),
    [
        ("v4", 2, 4, 6, 3, "tpu-v4-podslice"),
        ("v5p", 2, 4, 6, 3, "tpu-v5p-slice"),
        ("v5e", 1, 8, 4, 2, "tpu-v5-lite-podslice"),
        ("v6e", 1, 8, 4, 2, "tpu-v6e-slice"),
    ],
)
def test_tpu_generation_facts(
    name: str, tensorcores: int, chips_per_host: int, ports: int, dims: int, gke: str
) -> None:
    generation = tpu_generation(name)
    assert generation.generation == name
    assert generation.tensorcores_per_chip == tensorcores
    assert generation.chips_per_host == chips_per_host
    assert generation.ici_ports_per_chip == ports == 2 * dims
    assert generation.torus_dims == dims
    assert generation.gke_accelerator == gke
    assert math.prod(generation.host_block) == chips_per_host


@pytest.mark.parametrize(
    ("alias", "generation"),
    [
        ("v5litepod-16", "v5e"),
        ("v5litepod", "v5e"),
        ("tpu-v5-lite-podslice", "v5e"),
        ("V5LITE_POD", "v5e"),
        ("v5p-128", "v5p"),
        ("V5P", "v5p"),
        ("tpu-v6e-slice", "v6e"),
        ("v6e-16", "v6e"),
        ("tpu-v4-podslice", "v4"),
        ("v4-8", "v4"),
    ],
)
def test_tpu_generation_aliases(alias: str, generation: str) -> None:
    assert tpu_generation(alias).generation == generation


@pytest.mark.parametrize("name", ["v9z", "tpu7x", "", "nvidia-h100-80gb"])
def test_unknown_tpu_generation(name: str) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        tpu_generation(name)


@pytest.mark.parametrize(
    ("accelerator_type", "chips"),
    [("v5p-128", 64), ("v5p-8", 4), ("v4-8", 4), ("v5litepod-16", 16), ("v6e-256", 256)],
)
def test_accelerator_chips(accelerator_type: str, chips: int) -> None:
    assert accelerator_chips(accelerator_type) == chips


@pytest.mark.parametrize("accelerator_type", ["v5p-7", "v5p", "v5p-0", "h100-8"])
def test_bad_accelerator_type(accelerator_type: str) -> None:
    with pytest.raises(ValueError, match=r"accelerator type|TPU generation"):
        accelerator_chips(accelerator_type)


# ---------------------------------------------------------------- topology parsing


@pytest.mark.parametrize(
    ("topology", "dims"), [("4x4x8", (4, 4, 8)), ("2x4", (2, 4)), ("16x16x24", (16, 16, 24))]
)
def test_parse_topology(topology: str, dims: tuple[int, ...]) -> None:
    assert parse_topology(topology) == dims


@pytest.mark.parametrize(
    "topology", ["", "4", "4x", "x4", "4x0x8", "4X4", "4x-4", "4x4 x8", "four", "04x4"]
)
def test_bad_topology_names_the_input(topology: str) -> None:
    with pytest.raises(ValueError, match=repr(topology).replace("\\", "\\\\")):
        parse_topology(topology)


@pytest.mark.parametrize(
    ("topology", "generation"), [("4x4", "v5p"), ("4x4x8", "v6e"), ("2x2", "v4"), ("2x2x1", "v5e")]
)
def test_topology_dims_must_match_generation(topology: str, generation: str) -> None:
    with pytest.raises(ValueError, match=f"'{topology}'.*{generation}"):
        parse_topology(topology, generation)


# ---------------------------------------------------------------- slice shapes


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "chips", "hosts", "wraparound"),
    [
        ("v5p-8", "2x2x1", 4, 1, (False, False, False)),
        ("v5p-64", "2x4x4", 32, 8, (False, False, False)),
        ("v5p-128", "4x4x4", 64, 16, (True, True, True)),
        ("v5p-256", "4x4x8", 128, 32, (True, True, True)),
        ("v4-16", "2x2x2", 8, 2, (False, False, False)),
        ("v4-256", "4x4x8", 128, 32, (True, True, True)),
        ("v6e-16", "4x4", 16, 2, (True, True)),
        ("v6e-8", "2x4", 8, 1, (False, True)),
        ("v5litepod-4", "2x2", 4, 1, (False, False)),
        ("v5litepod-256", "16x16", 256, 32, (True, True)),
    ],
)
def test_slice_shape(
    accelerator_type: str, topology: str, chips: int, hosts: int, wraparound: tuple[bool, ...]
) -> None:
    shape = slice_shape(accelerator_type, topology)
    assert (shape.chips, shape.hosts, shape.wraparound) == (chips, hosts, wraparound)
    assert shape.topology == topology
    assert len(shape.dims) == shape.generation.torus_dims


def test_v5p_128_is_not_4x4x8() -> None:
    # v5p-128 counts TensorCores: 64 chips, which is 4x4x4; 4x4x8 (128 chips) is v5p-256.
    expected = "'4x4x8' holds 128 chips but accelerator type 'v5p-128' has 64"
    with pytest.raises(ValueError, match=expected):
        slice_shape("v5p-128", "4x4x8")


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "expected"),
    [
        ("v5p-128", "4x4", "expected 3 dimensions"),
        ("v6e-16", "8x2", "cannot be split into 2 v6e hosts"),
        ("v6e-16", "16x1", "cannot be split"),
        ("v5p-24", "3x2x2", "cannot be split"),
        ("v6e-16", "4x8", "holds 32 chips"),
    ],
)
def test_invalid_slice(accelerator_type: str, topology: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        slice_shape(accelerator_type, topology)


def test_v5p_table_is_in_known_slices() -> None:
    v5p = {(s.topology, s.chips, s.hosts) for s in known_slices() if s.generation == "v5p"}
    assert ("4x4x8", 128, 32) in v5p
    assert ("16x16x24", 6144, 1536) in v5p
    assert len(v5p) == 11


@pytest.mark.parametrize("known", known_slices(), ids=lambda known: known.accelerator_type)
def test_known_slices_are_valid(known: KnownSlice) -> None:
    shape = slice_shape(known.accelerator_type, known.topology)
    assert shape.generation.generation == known.generation
    assert (shape.chips, shape.hosts) == (known.chips, known.hosts)


# ---------------------------------------------------------------- chips, links, hosts


def test_chip_coords_are_row_major() -> None:
    shape = slice_shape("v6e-8", "2x4")
    coords = chip_coords(shape)
    assert coords[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert [chip_id_at(shape, c) for c in coords] == list(range(shape.chips))


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "chip_id", "links"),
    [
        # dim 0 (size 2) is a mesh, dim 1 (size 4) wraps.
        ("v6e-8", "2x4", 0, [(1, 4), (2, 3), (3, 1)]),
        ("v6e-8", "2x4", 5, [(0, 1), (2, 4), (3, 6)]),
        # 2x4x4 is smaller than a cube: no wraparound, a corner chip has 3 links.
        ("v5p-64", "2x4x4", 0, [(1, 16), (3, 4), (5, 1)]),
        # one 4x4x4 cube wraps in every dimension: 6 links even at the corner.
        ("v5p-128", "4x4x4", 0, [(0, 48), (1, 16), (2, 12), (3, 4), (4, 3), (5, 1)]),
        ("v5litepod-1", "1x1", 0, []),
    ],
)
def test_ici_neighbours(
    accelerator_type: str, topology: str, chip_id: int, links: list[tuple[int, int]]
) -> None:
    assert ici_neighbours(slice_shape(accelerator_type, topology), chip_id) == links


def test_size_two_wrapped_dimension_lists_peer_once() -> None:
    shape = dataclasses.replace(slice_shape("v6e-8", "2x4"), wraparound=(True, True))
    assert ici_neighbours(shape, 0) == [(1, 4), (2, 3), (3, 1)]
    assert ici_neighbours(shape, 4) == [(0, 0), (2, 7), (3, 5)]


@pytest.mark.parametrize("chip_id", [-1, 8])
def test_chip_id_out_of_range(chip_id: int) -> None:
    shape = slice_shape("v6e-8", "2x4")
    with pytest.raises(ValueError, match=f"chip id {chip_id}"):
        ici_neighbours(shape, chip_id)
    with pytest.raises(ValueError, match=f"chip id {chip_id}"):
        host_of_chip(shape, chip_id)


def test_hosts_of_v6e_16() -> None:
    shape = slice_shape("v6e-16", "4x4")
    assert [host_of_chip(shape, chip) for chip in range(16)] == [0] * 8 + [1] * 8


def test_hosts_of_v5p_cube_are_2x2x1_blocks() -> None:
    shape = slice_shape("v5p-128", "4x4x4")
    members = [c for c in range(shape.chips) if host_of_chip(shape, c) == 0]
    assert [chip_coords(shape)[c] for c in members] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert host_of_chip(shape, chip_id_at(shape, (0, 0, 1))) == 1
    assert host_of_chip(shape, chip_id_at(shape, (3, 3, 3))) == 15


SMALL_KNOWN_SHAPES = [
    slice_shape(known.accelerator_type, known.topology)
    for known in known_slices()
    if known.chips <= 512
]


@pytest.mark.parametrize("shape", SMALL_KNOWN_SHAPES, ids=lambda shape: shape.accelerator_type)
def test_every_host_holds_the_same_number_of_chips(shape: SliceShape) -> None:
    hosts = [host_of_chip(shape, chip) for chip in range(shape.chips)]
    assert sorted(set(hosts)) == list(range(shape.hosts))
    assert all(hosts.count(host) == shape.chips // shape.hosts for host in range(shape.hosts))


def _assert_links_consistent(shape: SliceShape, chip_id: int) -> None:
    links = ici_neighbours(shape, chip_id)
    ports = [port for port, _ in links]
    assert len(set(ports)) == len(ports)
    assert all(0 <= port < 2 * len(shape.dims) for port in ports)
    for port, peer in links:
        assert peer != chip_id
        # Symmetry: the peer lists this chip back, on the opposite port of the same dimension.
        assert (port ^ 1, chip_id) in ici_neighbours(shape, peer)
    for dim in range(len(shape.dims)):
        peers = [peer for port, peer in links if port // 2 == dim]
        assert len(set(peers)) == len(peers)


@given(shape=st.sampled_from(SMALL_KNOWN_SHAPES), data=st.data())
def test_neighbours_symmetric_on_known_shapes(shape: SliceShape, data: st.DataObject) -> None:
    chip_id = data.draw(st.integers(0, shape.chips - 1))
    _assert_links_consistent(shape, chip_id)
    assert len(ici_neighbours(shape, chip_id)) <= shape.generation.ici_ports_per_chip


@st.composite
def arbitrary_graphs(draw: st.DrawFn) -> SliceShape:
    """Any dims and wrap flags, including size-1 and wrapped size-2 dimensions."""
    generation = draw(st.sampled_from(tpu_generations()))
    count = generation.torus_dims
    dims = tuple(draw(st.lists(st.integers(1, 5), min_size=count, max_size=count)))
    wraps = tuple(draw(st.lists(st.booleans(), min_size=count, max_size=count)))
    return SliceShape(
        accelerator_type="synthetic",
        generation=generation,
        dims=dims,
        chips=math.prod(dims),
        hosts=1,
        wraparound=wraps,
        host_block=dims,
    )


@given(shape=arbitrary_graphs(), data=st.data())
def test_neighbours_symmetric_on_any_graph(shape: SliceShape, data: st.DataObject) -> None:
    chip_id = data.draw(st.integers(0, shape.chips - 1))
    _assert_links_consistent(shape, chip_id)


# ---------------------------------------------------------------- prices


def test_prices_positive_and_dated() -> None:
    prices = accelerator_prices()
    assert len(prices) >= 6
    for price in prices:
        assert price.usd_per_hour > 0
        assert "://" not in price.source
        assert len(price.as_of) == 7


@pytest.mark.parametrize(
    ("model", "accelerator"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB"),
        ("nvidia-h100-80gb", "NVIDIA H100 80GB"),
        ("NVIDIA H200", "NVIDIA H200 141GB"),
        ("nvidia-h200-141gb", "NVIDIA H200 141GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB"),
        ("v5litepod-16", "Google Cloud TPU v5e"),
        ("tpu-v5-lite-podslice", "Google Cloud TPU v5e"),
        ("v5p-128", "Google Cloud TPU v5p"),
        ("tpu-v5p-slice", "Google Cloud TPU v5p"),
        ("v6e", "Google Cloud TPU v6e"),
        ("TPU v6e chip", "Google Cloud TPU v6e"),
        ("tpu-v4-podslice", "Google Cloud TPU v4"),
    ],
)
def test_price_for(model: str, accelerator: str) -> None:
    price = price_for(model)
    assert price is not None
    assert price.accelerator == accelerator
    # No second row may also claim the model: the file order must not matter.
    assert [p.accelerator for p in accelerator_prices() if p.matches(model)] == [accelerator]


@pytest.mark.parametrize("model", ["NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA L4", "v5"])
def test_price_for_unpriced_model(model: str) -> None:
    assert price_for(model) is None


def test_every_tpu_generation_has_a_price() -> None:
    for generation in tpu_generations():
        price = price_for(generation.generation)
        assert price is not None
        if generation.gke_accelerator:  # v2 / v3 have no GKE label
            assert price_for(generation.gke_accelerator) == price


# ---------------------------------------------------------------- packaging and loaders


@pytest.mark.parametrize(
    "filename", ["xid.csv", "dcgm_fields.csv", "tpu.csv", "tpu_slices.csv", "prices.csv"]
)
def test_data_files_are_package_resources_with_source_notes(filename: str) -> None:
    text = resources.files("pipeline.catalog").joinpath(filename).read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0].startswith("#")
    header = next(line for line in lines if line and not line.startswith("#"))
    assert "source" in header.split(",")


def test_loaders_are_cached() -> None:
    assert xid_catalog() is xid_catalog()
    assert dcgm_fields() is dcgm_fields()
    assert tpu_generations() is tpu_generations()


@pytest.mark.parametrize(
    ("method", "value"),
    [("boolean", "ture"), ("boolean", "True"), ("integer", "4.0"), ("number", "n/a")],
)
def test_row_parsing_is_strict(method: str, value: str) -> None:
    row = Row({"cell": value}, "test.csv:3")
    with pytest.raises(ValueError, match=r"test\.csv:3: column 'cell'"):
        getattr(row, method)("cell")


def test_row_choice_rejects_unknown_value() -> None:
    row = Row({"action": "cordon"}, "test.csv:7")
    with pytest.raises(ValueError, match="'cordon'"):
        row.choice("action", ACTIONS)
