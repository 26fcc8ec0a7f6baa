"""TPU type names as the Cloud TPU docs and API give them: the number in v2, v3, v4 and v5p
types counts TensorCores (two per chip), in v5e (v5litepod) and v6e types it counts chips; a
node or queued resource given only an `acceleratorConfig` (type enum + topology) is a member
with its type named and its chips counted."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2alpha1 as tpu

from pipeline.catalog import accelerator_chips, accelerator_type_of
from pipeline.sources import tpu_api

# fmt: off
TYPES = [  # (accelerator type, chips, API type enum, topology)
    ("v2-8", 4, "V2", "2x2"), ("v2-32", 16, "V2", "4x4"), ("v2-512", 256, "V2", "16x16"),
    ("v3-8", 4, "V3", "2x2"), ("v3-32", 16, "V3", "4x4"), ("v3-2048", 1024, "V3", "32x32"),
    ("v4-8", 4, "V4", "2x2x1"), ("v4-32", 16, "V4", "2x2x4"), ("v4-4096", 2048, "V4", "8x16x16"),
    ("v5p-8", 4, "V5P", "2x2x1"), ("v5p-16", 8, "V5P", "2x2x2"), ("v5p-128", 64, "V5P", "4x4x4"),
    ("v5litepod-1", 1, "V5LITE_POD", "1x1"), ("v5litepod-8", 8, "V5LITE_POD", "2x4"),
    ("v5litepod-256", 256, "V5LITE_POD", "16x16"),
    ("v6e-1", 1, "V6E", "1x1"), ("v6e-16", 16, "V6E", "4x4"), ("v6e-256", 256, "V6E", "16x16"),
]
# fmt: on


@pytest.mark.parametrize(("name", "chips", "api", "topology"), TYPES, ids=[t[0] for t in TYPES])
def test_the_number_in_a_type_counts_tensorcores_or_chips(
    name: str, chips: int, api: str, topology: str
) -> None:
    assert accelerator_chips(name) == chips
    assert accelerator_type_of(api, topology) == name
    assert tpu_api.chips(name, "") == chips == tpu_api.chips(name, topology)


@pytest.mark.parametrize("name", ["v3-7", "v2-9", "v5p-3"])
def test_an_odd_tensorcore_count_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="TensorCores"):
        accelerator_chips(name)
    assert tpu_api.chips(name, "") == 0


NAME = "projects/p/locations/us-east5-a/nodes/train-1"
LABELS = {"cluster": "tpu-east", "pool": "v5p"}


@pytest.mark.parametrize(
    ("node", "want"),
    [
        (tpu.Node(name=NAME, labels=LABELS, accelerator_type="v5p-128"), ("v5p-128", 64)),
        (tpu.Node(name=NAME, labels=LABELS, accelerator_config=tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type.V5P, topology="4x4x4")), ("v5p-128", 64)),
        (tpu.Node(name=NAME, labels=LABELS, accelerator_config=tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type.V5LITE_POD, topology="4x8")), ("v5litepod-32", 32)),
        (tpu.Node(name=NAME, labels=LABELS, accelerator_config=tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type.V3, topology="4x4")), ("v3-32", 16)),
        (tpu.Node(name=NAME, labels=LABELS, accelerator_type="v4-32"), ("v4-32", 16)),
        (tpu.Node(name=NAME, labels=LABELS, accelerator_config=tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type.TYPE_UNSPECIFIED, topology="2x2")), ("", 4)),
    ],
    ids=["type", "v5p config", "v5e config", "v3 config", "v4 type only", "unspecified"],
)  # fmt: skip
def test_a_node_given_a_type_or_only_a_config_is_a_full_member(
    node: tpu.Node, want: tuple[str, int]
) -> None:
    member = tpu_api.node_member(node)
    assert member is not None
    assert (member.accelerator, member.capacity) == want
    assert (member.cluster, member.pool, member.zone) == ("tpu-east", "v5p", "us-east5-a")


def test_a_queued_resource_with_only_a_config_names_its_type() -> None:
    spec = tpu.QueuedResource.Tpu.NodeSpec(
        parent="projects/p/locations/us-east5-a",
        node=tpu.Node(accelerator_config=tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type.V6E, topology="8x16")),
    )  # fmt: skip
    queued = tpu.QueuedResource(
        name="projects/p/locations/us-east5-a/queuedResources/qr-1",
        tpu=tpu.QueuedResource.Tpu(node_spec=[spec]),
        state=tpu.QueuedResourceState(state=tpu.QueuedResourceState.State.WAITING_FOR_RESOURCES),
    )
    parsed = tpu_api.queued_resource_events({}, [queued], 1_764_000_000_000)
    assert parsed.bad == []
    assert [e.accelerator_type for e in parsed.events] == ["v6e-128"]  # type: ignore[attr-defined]
