"""The prometheus parser: Prometheus matrix JSON (string values) → GpuSamples; bad input named."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.model import GpuSample
from pipeline.sources.prometheus import parse_series
from pipeline.sources.prometheus_series import Identity

ID = Identity(cluster="default-c", pool="default-p", zone="default-z")
LABELS = {
    "gpu": "0",
    "UUID": "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",
    "pci_bus_id": "00000000:53:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "Hostname": "gpu-node-1",
    "DCGM_FI_DRIVER_VERSION": "580.105.08",
    "instance": "10.0.0.7:9400",
    "job": "dcgm",
}


def _series(name: str, values: list[list[Any]], **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, **LABELS, **labels}, "values": values}


def test_groups_series_by_node_and_timestamp() -> None:
    results = [
        _series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "31"], [1764424810.0, "33"]]),
        _series("DCGM_FI_DEV_POWER_USAGE", [[1764424800.0, "302.206000"]]),
        _series(
            "DCGM_FI_DEV_GPU_TEMP",
            [[1764424800.0, "40"]],
            gpu="1",
            UUID="GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24",
            pci_bus_id="00000000:64:00.0",
            pod="trainer-0",
            cluster="c1",
            pool="a3",
            zone="us-a",
        ),
        _series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "50"]], Hostname="gpu-node-2"),
    ]
    parsed = parse_series(results, ID)
    assert parsed.bad == []
    by_key = {(e.node, e.ts): e for e in parsed.events if isinstance(e, GpuSample)}
    assert list(by_key) == [  # oldest first
        ("gpu-node-1", 1764424800000),
        ("gpu-node-2", 1764424800000),
        ("gpu-node-1", 1764424810000),
    ]
    first = by_key[("gpu-node-1", 1764424800000)]
    assert [g.index for g in first.gpus] == [0, 1]
    assert first.gpus[0].metrics == {
        "DCGM_FI_DEV_GPU_TEMP": 31.0,
        "DCGM_FI_DEV_POWER_USAGE": 302.206,
    }
    assert first.gpus[1].job == "trainer-0" and first.gpus[0].job is None
    assert first.driver == "580.105.08"
    # target labels of the first series seen for a node decide its cluster/pool/zone
    assert (first.cluster, first.pool, first.zone) == ("default-c", "default-p", "default-z")
    assert by_key[("gpu-node-1", 1764424810000)].gpus[0].metrics == {"DCGM_FI_DEV_GPU_TEMP": 33.0}


def test_old_namespace_and_node_fallbacks() -> None:
    labels = {k: v for k, v in LABELS.items() if k not in ("UUID", "Hostname")}
    old = {
        "metric": {"__name__": "dcgm_fi_dev_gpu_temp", **labels, "uuid": LABELS["UUID"]},
        "values": [[1764424800.5, "31"]],
    }
    [sample] = parse_series([old], ID).events
    assert isinstance(sample, GpuSample)
    assert sample.node == "10.0.0.7"  # no Hostname: the host of `instance`
    assert sample.ts == 1764424800500
    assert sample.gpus[0].metrics == {"DCGM_FI_DEV_GPU_TEMP": 31.0}


def test_points_at_or_before_the_position_are_skipped_and_blanks_dropped() -> None:
    results = [
        _series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "31"], [1764424810.0, "32"]]),
        _series(
            "DCGM_FI_DEV_MEMORY_TEMP", [[1764424810.0, "9223372036854775794"]]
        ),  # not supported
        _series("DCGM_FI_DEV_POWER_USAGE", [[1764424810.0, "140737488355330"]]),  # FP64 blank
    ]
    [sample] = parse_series(results, ID, after_ms=1764424800000).events
    assert isinstance(sample, GpuSample)
    assert sample.gpus[0].metrics == {"DCGM_FI_DEV_GPU_TEMP": 32.0}


@pytest.mark.parametrize(
    ("result", "field", "expected"),
    [
        ({"metric": LABELS}, "result", "values"),
        (_series("node_cpu_seconds_total", [[1764424800.0, "1"]]), "__name__", "DCGM_FI_"),
        (_series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "hot"]]), "values", "number"),
        (_series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "NaN"]]), "value", "finite"),
        (_series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0]]), "values", "[timestamp, value]"),
        (_series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "1"]], gpu="x"), "gpu", "GPU index"),
        (
            {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, "values": [[1.0, "1"]]},
            "labels",
            "node name",
        ),
    ],
)
def test_bad_series_become_bad_records(result: dict[str, Any], field: str, expected: str) -> None:
    good = _series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "31"]], Hostname="gpu-node-9")
    parsed = parse_series([result, good], ID)
    assert [e.node for e in parsed.events if isinstance(e, GpuSample)] == ["gpu-node-9"]
    [bad] = parsed.bad
    assert field in bad.error.field and expected in bad.error.expected
    assert bad.raw  # the offending series, for the dead letter


def test_values_the_schema_refuses_are_bad_records() -> None:
    # a node name that could climb out of a lake directory; and a GPU without its UUID
    evil = _series("DCGM_FI_DEV_GPU_TEMP", [[1764424800.0, "31"]], Hostname="../etc")
    anonymous = {
        "metric": {k: v for k, v in LABELS.items() if k != "UUID"}
        | {"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "gpu-node-3"},
        "values": [[1764424800.0, "31"]],
    }
    parsed = parse_series([evil, anonymous], ID)
    assert parsed.events == []
    fields = sorted(bad.error.field for bad in parsed.bad)
    assert any("node" in f for f in fields) and any("gpu 0" in f for f in fields)


# --- every dcgm-exporter generation and deployment ------------------------------------------
# Label sets as each generation prints them (reference/data-shapes.md §1.5-1.6), plus what
# Prometheus adds: a static scrape keeps the exporter's labels; the Prometheus Operator's default
# (honorLabels: false) renames the clashing pod/namespace/container to exported_* and adds the
# exporter pod's own. Each row: labels of one series → (node, [(device, pci_bus_id, job, mig)]).
UUID0 = "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
TS = 1764424800.0
V1_OLD_NAMESPACE = {  # 1.x --use-old-namespace: lower-case names, uuid, pod_name; no host label
    "gpu": "0", "uuid": UUID0, "device": "nvidia0", "modelName": "Tesla V100-SXM2-16GB",
    "pod_name": "trainer-0", "pod_namespace": "ml", "container_name": "main",
    "instance": "gpu-node-1:9400", "job": "dcgm",
}
BEFORE_2024 = {  # 2.x/3.x: UUID, Hostname, pod attributes; no pci_bus_id yet
    "gpu": "0", "UUID": UUID0, "device": "nvidia0", "modelName": "NVIDIA A100-SXM4-80GB",
    "Hostname": "gpu-node-1", "DCGM_FI_DRIVER_VERSION": "535.104.05",
    "pod": "trainer-0", "namespace": "ml", "container": "main",
    "instance": "10.0.0.7:9400", "job": "dcgm",
}
SINCE_2024 = BEFORE_2024 | {"pci_bus_id": "00000000:53:00.0"}
HEAD = {k: v for k, v in SINCE_2024.items() if k != "Hostname"} | {"hostname": "gpu-node-1"}
OPERATOR = SINCE_2024 | {  # ServiceMonitor, honorLabels false, node relabelled to `node`
    "exported_pod": "trainer-0", "exported_namespace": "ml", "exported_container": "main",
    "pod": "dcgm-exporter-x7k2p", "namespace": "gpu-operator", "container": "exporter",
    "Hostname": "dcgm-exporter-x7k2p", "node": "gpu-node-1", "service": "dcgm-exporter",
    "endpoint": "metrics",
}
OPERATOR_HONOR_LABELS = {  # ServiceMonitor with honorLabels: true: the exporter's pod labels win
    k: v for k, v in OPERATOR.items() if not k.startswith("exported_")
} | {"pod": "trainer-0", "namespace": "ml", "container": "main"}


def _mig(labels: dict[str, str], instance: str, profile: str) -> dict[str, str]:
    return labels | {"GPU_I_ID": instance, "GPU_I_PROFILE": profile}


Reading = tuple[str, str | None, str | None, str | None]  # device, pci_bus_id, job, mig_profile
GENERATIONS: list[tuple[str, list[dict[str, str]], str, list[Reading]]] = [
    ("1.x old namespace", [V1_OLD_NAMESPACE], "gpu-node-1", [("0", None, "trainer-0", None)]),
    ("before 2024, no pci_bus_id", [BEFORE_2024], "gpu-node-1", [("0", None, "trainer-0", None)]),
    (
        "since 2024, pci_bus_id",
        [SINCE_2024],
        "gpu-node-1",
        [("0", "00000000:53:00.0", "trainer-0", None)],
    ),
    (
        "HEAD, lower-case hostname",
        [HEAD],
        "gpu-node-1",
        [("0", "00000000:53:00.0", "trainer-0", None)],
    ),
    (
        "MIG, two instances of GPU 0 and the GPU-wide series",
        [
            _mig(SINCE_2024, "1", "3g.40gb"),
            _mig(SINCE_2024 | {"pod": "infer-1"}, "2", "3g.40gb"),
            SINCE_2024,
        ],
        "gpu-node-1",
        [
            ("0", "00000000:53:00.0", "trainer-0", None),
            ("0/mig1", "00000000:53:00.0", "trainer-0", "3g.40gb"),
            ("0/mig2", "00000000:53:00.0", "infer-1", "3g.40gb"),
        ],
    ),
    (
        "MIG, 1.x old namespace, no pci_bus_id",
        [_mig(V1_OLD_NAMESPACE | {"pod_name": ""}, "1", "1g.10gb")],
        "gpu-node-1",
        [("0/mig1", None, None, "1g.10gb")],
    ),
    (
        "Operator, honorLabels false: exported_pod, node label",
        [OPERATOR],
        "gpu-node-1",
        [("0", "00000000:53:00.0", "trainer-0", None)],
    ),
    (
        "Operator, honorLabels true: pod",
        [OPERATOR_HONOR_LABELS],
        "gpu-node-1",
        [("0", "00000000:53:00.0", "trainer-0", None)],
    ),
]


@pytest.mark.parametrize(
    ("series_labels", "node", "readings"),
    [row[1:] for row in GENERATIONS],
    ids=[row[0] for row in GENERATIONS],
)
def test_every_exporter_generation_and_deployment(
    series_labels: list[dict[str, str]],
    node: str,
    readings: list[Reading],
) -> None:
    name = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    results = [
        {"metric": {"__name__": name, **labels}, "values": [[TS, f"0.{i + 1}"]]}
        for i, labels in enumerate(series_labels)
    ]
    parsed = parse_series(results, ID)
    assert parsed.bad == []
    [sample] = parsed.events
    assert isinstance(sample, GpuSample)
    assert sample.node == node
    got = [(g.device, g.pci_bus_id, g.job, g.mig_profile) for g in sample.gpus]
    assert got == readings
    assert {g.uuid for g in sample.gpus} == {UUID0} and {g.index for g in sample.gpus} == {0}
    # each reading keeps its own value: MIG instances do not overwrite each other
    values = sorted(g.metrics[name] for g in sample.gpus)
    assert values == [float(f"0.{i + 1}") for i in range(len(series_labels))]


@pytest.mark.parametrize(
    ("node_label", "expected"),
    [
        ("kubernetes_node", "gpu-node-7"),  # the configured label comes first
        ("", "gpu-node-1"),  # then node
        ("absent_label", "gpu-node-1"),
    ],
)
def test_the_node_label_is_a_setting(node_label: str, expected: str) -> None:
    labels = OPERATOR | {"kubernetes_node": "gpu-node-7"}
    identity = Identity(cluster="c", pool="p", zone="z", node_label=node_label)
    result = {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", **labels}, "values": [[TS, "31"]]}
    [sample] = parse_series([result], identity).events
    assert isinstance(sample, GpuSample) and sample.node == expected


def test_node_falls_back_from_node_to_hostname_to_instance() -> None:
    def node_of(labels: dict[str, str]) -> str:
        result = {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", **labels}, "values": [[TS, "1"]]}
        [sample] = parse_series([result], ID).events
        assert isinstance(sample, GpuSample)
        return sample.node

    assert node_of(OPERATOR) == "gpu-node-1"  # node, not the exporter pod's Hostname
    assert node_of(SINCE_2024 | {"Hostname": "host-a"}) == "host-a"
    assert node_of(HEAD | {"hostname": "host-b"}) == "host-b"
    assert node_of(V1_OLD_NAMESPACE) == "gpu-node-1"  # the host of instance


def test_a_bad_mig_instance_id_is_a_bad_record() -> None:
    bad = {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", **_mig(SINCE_2024, "x", "1g")},
           "values": [[TS, "1"]]}
    parsed = parse_series([bad], ID)
    assert parsed.events == [] and "GPU_I_ID" in parsed.bad[0].error.field
