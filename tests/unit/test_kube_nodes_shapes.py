"""Node objects as real GPU clusters show them → inventory: GPUs shared by time-slicing or MPS
(the device plugin advertises replicas; GPU feature discovery labels the physical count), and
the labels of nodes older than Kubernetes 1.17. Written from the NVIDIA device plugin / GFD
documentation (sharing, renameByDefault, gpu.count / gpu.replicas / gpu.sharing-strategy,
the -SHARED product suffix) and the Kubernetes well-known labels page."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from pipeline.kube import nodes

TS = 1_764_000_000_000


def node(labels: dict[str, str], capacity: dict[str, str]) -> Any:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="gpu-1", labels=labels),
        spec=client.V1NodeSpec(),
        status=client.V1NodeStatus(capacity=capacity),
    )


GFD = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}
# fmt: off
SHAPES: list[tuple[str, dict[str, str], dict[str, str], tuple[str, int, dict[str, str]]]] = [
    ("whole GPUs, GFD labels",
     GFD, {"nvidia.com/gpu": "8"}, ("NVIDIA-A100-SXM4-80GB", 8, {})),
    ("time-slicing, 4 replicas: 32 advertised, 8 GPUs",
     {**GFD, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
      "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
     {"nvidia.com/gpu": "32"},
     ("NVIDIA-A100-SXM4-80GB", 8, {"gpu_sharing": "time-slicing", "gpu_replicas": "4"})),
    ("MPS, renameByDefault: nvidia.com/gpu.shared advertised",
     {**GFD, "nvidia.com/gpu.replicas": "10", "nvidia.com/gpu.sharing-strategy": "mps"},
     {"nvidia.com/gpu.shared": "80"},
     ("NVIDIA-A100-SXM4-80GB", 8, {"gpu_sharing": "mps", "gpu_replicas": "10"})),
    ("time-slicing without gpu.count: advertised / replicas",
     {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "5",
      "nvidia.com/gpu.sharing-strategy": "time-slicing"},
     {"nvidia.com/gpu": "20"},
     ("Tesla-T4", 4, {"gpu_sharing": "time-slicing", "gpu_replicas": "5"})),
    ("MIG mixed strategy: no nvidia.com/gpu, GFD counts the GPUs",
     {**GFD, "nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-3g.40gb": "16"},
     ("NVIDIA-A100-SXM4-80GB", 8, {})),
    ("a TPU node is not divided by GPU replicas",
     {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
      "nvidia.com/gpu.replicas": "4"}, {"google.com/tpu": "4"},
     ("tpu-v5-lite-podslice", 4, {"gpu_replicas": "4"})),
]
# fmt: on


@pytest.mark.parametrize(("labels", "capacity", "want"), [s[1:] for s in SHAPES],
                         ids=[s[0] for s in SHAPES])  # fmt: skip
def test_physical_gpus_of_shared_nodes(
    labels: dict[str, str], capacity: dict[str, str], want: tuple[str, int, dict[str, str]]
) -> None:
    record = nodes.inventory(node(labels, capacity), "c1", TS)
    sharing = {k: v for k, v in record.labels.items() if k.startswith("gpu_")}
    assert (record.accelerator, record.capacity, sharing) == want


def test_a_node_older_than_1_17_is_placed_by_its_beta_labels() -> None:
    old = node({"beta.kubernetes.io/instance-type": "p4d.24xlarge",
                "failure-domain.beta.kubernetes.io/region": "us-east-1",
                "failure-domain.beta.kubernetes.io/zone": "us-east-1a",
                "eks.amazonaws.com/nodegroup": "p4d"}, {"nvidia.com/gpu": "8"})  # fmt: skip
    record = nodes.inventory(old, "c1", TS)
    assert (record.pool, record.zone, record.capacity) == ("p4d", "us-east-1a", 8)
    assert record.labels == {"instance_type": "p4d.24xlarge", "region": "us-east-1"}


def test_the_ga_labels_win_over_the_beta_ones() -> None:
    both = node({"node.kubernetes.io/instance-type": "a3-highgpu-8g",
                 "beta.kubernetes.io/instance-type": "old",
                 "topology.kubernetes.io/zone": "us-central1-a",
                 "failure-domain.beta.kubernetes.io/zone": "stale",
                 "topology.kubernetes.io/region": "us-central1",
                 "failure-domain.beta.kubernetes.io/region": "stale"}, {})  # fmt: skip
    record = nodes.inventory(both, "c1", TS)
    assert record.zone == "us-central1-a"
    assert record.labels == {"instance_type": "a3-highgpu-8g", "region": "us-central1"}


def test_bad_counts_fall_back_to_what_the_node_advertises() -> None:
    odd = node({"nvidia.com/gpu.count": "eight", "nvidia.com/gpu.replicas": "x"},
               {"nvidia.com/gpu": "8"})  # fmt: skip
    assert nodes.capacity(odd) == 8
