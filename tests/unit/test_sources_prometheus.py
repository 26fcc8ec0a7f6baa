"""The prometheus parser: Prometheus matrix JSON (string values) → GpuSamples; bad input named."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.model import GpuSample
from pipeline.sources.prometheus import Identity, parse_series

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
