"""docs/sizing.md: its generated tables are what the result files say, by the stated rules, and
the measurement behind them counts what the simulator sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sizing, sizing_doc
from pipeline.docs_markers import read_section


def test_the_generated_sections_are_current() -> None:
    want = sizing_doc.sections(sizing_doc.load())
    for name, body in want.items():
        written = read_section(sizing_doc.DOC, name).strip()
        assert written == body.strip(), f"{name}: run `python -m bench.sizing --docs`"


def test_every_section_has_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "sizing.md"
    doc.write_text(sizing_doc.DOC.read_text())
    sizing_doc.write(doc)  # raises if a marker is missing
    assert doc.read_text() == sizing_doc.DOC.read_text()


@pytest.mark.parametrize(
    ("samples_per_s", "per_core_s", "workers", "partitions"),
    [
        (1.0, 100_000.0, 1, 12),  # never fewer than one worker, twelve partitions
        (50_000.0, 100_000.0, 1, 12),  # exactly half a core
        (50_001.0, 100_000.0, 2, 12),
        (360_000.0, 100_000.0, 8, 24),  # 2 x 8 = 16: the next multiple of 12
        (3_000_000.0, 100_000.0, 60, 120),
    ],
)
def test_workers_at_half_a_core_and_partitions_twice_them(
    samples_per_s: float, per_core_s: float, workers: int, partitions: int
) -> None:
    assert sizing_doc.workers_for(samples_per_s, per_core_s) == workers
    assert sizing_doc.partitions_for(workers) == partitions


def test_prometheus_adapters_per_third_of_a_core() -> None:
    prometheus = {"per_10k_gpus": {"sharded_sum": {"cpu_s": 3.75, "prometheus_cpu_s": 6.0}}}
    # 100k GPUs: 37.5 s of adapter CPU per 15 s poll = 2.5 cores -> 8 adapters of a third
    assert sizing_doc.prometheus_adapters(100_000, prometheus) == (8, 2.5, 4.0)
    assert sizing_doc.prometheus_adapters(1_000, prometheus)[0] == 1  # type: ignore[index]
    assert sizing_doc.prometheus_adapters(1_000, None) is None


def _fleet() -> dict[str, object]:
    return {
        "units": 512, "seconds": 3600,
        "topics": {
            "telemetry.gpu": {"values": 100, "values_per_s_per_unit": 0.0125,
                              "value_bytes": 12_000.0, "wire_bytes_per_value": 1_000.0,
                              "metric_samples_per_s_per_unit": 3.6},
            "utilization": {"values": 10, "values_per_s_per_unit": 0.01,
                            "value_bytes": 400.0, "wire_bytes_per_value": 20.0,
                            "metric_samples_per_s_per_unit": 0.0},
        },
        "lake": {"utilization": {"topic": "utilization", "rows": 10, "bytes_per_row": 10.0}},
    }


def test_fleet_figures_scale_with_the_accelerators() -> None:
    small = sizing_doc.fleet_figures("gpu", 1_000, _fleet(), 100_000.0, None)
    large = sizing_doc.fleet_figures("gpu", 100_000, _fleet(), 100_000.0, None)
    assert small["values_per_s"] == pytest.approx(22.5)
    assert small["mb_s"] == pytest.approx((12.5 * 1_000 + 10 * 20) / 1e6)
    assert small["gb_day"] == pytest.approx(small["mb_s"] * 86.4)
    assert small["lake_rows_day"] == pytest.approx(10 * 86_400)
    assert small["lake_gb_day"] == pytest.approx(10 * 86_400 * 10 / 1e9)
    for key in ("values_per_s", "samples_per_s", "mb_s", "lake_rows_day"):
        assert large[key] == pytest.approx(100 * small[key])
    assert (small["workers"], large["workers"]) == (1, 8)  # 360k samples/s at 50k a worker
    assert "125 nodes" in small["adapters"]


def test_a_topic_table_leaves_out_silent_topics_and_says_so() -> None:
    table = sizing_doc.topics_table("gpu", _fleet())
    assert "| `telemetry.gpu` | 12,000 / 1,000 |" in table
    assert "`actions`" in table.split("No values in that run:")[1]
    assert "| `actions` |" not in table


def test_the_measurement_counts_the_simulators_values() -> None:
    """Six simulated minutes of the GPU fleet: 512 GPUs, one sample per node (8 GPUs) per
    10 s, 36 metrics per GPU, and zstd makes the telemetry smaller than its values."""
    fleet = sizing.measure_fleet("gpu", hours=0.1, bytes_minutes=1)
    assert fleet["units"] == 512
    gpu = fleet["topics"]["telemetry.gpu"]
    assert gpu["values"] == 64 * 36
    assert gpu["values_per_s_per_unit"] == pytest.approx(1 / 80)
    assert gpu["metric_samples_per_s_per_unit"] > 0
    assert 0 < gpu["wire_bytes_per_value"] < gpu["value_bytes"] / 4
    assert "telemetry.tpu" not in fleet["topics"]
    assert fleet["lake"]["utilization"]["rows"] == fleet["topics"]["utilization"]["values"]
