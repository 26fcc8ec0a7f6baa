"""Event-time utilization windows: values, closing by watermark, late records, state."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import AggregateSettings
from pipeline.model import GpuReading, GpuSample, TpuChipReading, TpuSample, Utilization
from pipeline.stages.windows import WindowState, advance, aggregate, flush
from pipeline.wire.codec import decode, encode

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window boundary
SETTINGS = AggregateSettings(window_s=60, grace_s=30)


def gpu_sample(ts: int, utils: list[float], node: str = "n1", job: str | None = "job-a",
               used: float = 30.0, free: float = 70.0, power: float = 300.0) -> GpuSample:
    gpus = [
        GpuReading(
            index=index,
            uuid=f"GPU-{index:08d}-0000",
            pci_bus_id=f"0000:{index + 10:02x}:00.0",
            model="NVIDIA H100 80GB HBM3",
            job=job,
            metrics={"DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_FB_USED": used,
                     "DCGM_FI_DEV_FB_FREE": free, "DCGM_FI_DEV_POWER_USAGE": power},
        )
        for index, util in enumerate(utils)
    ]
    return GpuSample(ts=ts, cluster="c1", node=node, pool="p1", zone="z-a", driver="550", gpus=gpus)


def tpu_sample(ts: int, duty: list[float], node: str = "h0") -> TpuSample:
    chips = [
        TpuChipReading(chip_id=chip, coords=[chip, 0], job=None,
                       metrics={"duty_cycle_pct": value, "hbm_used_bytes": 4e9, "hbm_total_bytes": 16e9})
        for chip, value in enumerate(duty)
    ]
    return TpuSample(ts=ts, cluster="c1", node=node, pool="tpu", zone="z-b", slice="s1",
                     accelerator_type="v5litepod-8", topology="2x4", worker_id=0, chips=chips)


def run(samples: list[GpuSample | TpuSample], config: AggregateSettings = SETTINGS
        ) -> tuple[WindowState, list[Utilization]]:
    state: WindowState | None = None
    rows: list[Utilization] = []
    for sample in samples:
        state, out = aggregate(state, sample, config)
        rows += out
    assert state is not None
    return state, rows


def test_gpu_window_mean_max_memory_power_and_allocation() -> None:
    state, rows = run([gpu_sample(T0 + 1_000, [10.0, 0.0]), gpu_sample(T0 + 31_000, [30.0, 0.0]),
                       gpu_sample(T0 + 60_000 + 30_000, [50.0, 0.0])])
    assert [(r.window_start, r.device) for r in rows] == [(T0, "0"), (T0, "1")]
    first = rows[0]
    assert (first.util_mean, first.util_max, first.samples) == (20.0, 30.0, 2)
    assert first.mem_used_frac == pytest.approx(0.3)
    assert first.power_w_mean == 300.0
    assert first.allocated and first.job == "job-a"
    assert first.accelerator == "NVIDIA H100 80GB HBM3" and first.slice is None
    assert first.window_s == 60
    assert list(state.open) == [f"{T0 + 60_000}/n1/0", f"{T0 + 60_000}/n1/1"]


def test_step_compute_time_is_the_window_mean_of_the_readings_that_carry_one() -> None:
    def with_steps(ts: int, steps: list[float | None]) -> GpuSample:
        sample = gpu_sample(ts, [50.0] * len(steps))
        gpus = [msgspec.structs.replace(g, step_compute_s=s) for g, s in zip(sample.gpus, steps,
                                                                            strict=True)]
        return msgspec.structs.replace(sample, gpus=gpus)

    _, rows = run([with_steps(T0 + 1_000, [0.4, None]), with_steps(T0 + 16_000, [0.6, None]),
                   with_steps(T0 + 31_000, [None, None]),  # a scrape the job published none in
                   with_steps(T0 + 60_000 + 30_000, [1.0, None])])
    assert [(r.device, r.step_compute_s) for r in rows] == [("0", pytest.approx(0.5)), ("1", None)]
    assert decode(encode(rows[0]), Utilization) == rows[0]


def test_window_stays_open_until_the_grace_period_has_passed() -> None:
    _, rows = run([gpu_sample(T0, [10.0]), gpu_sample(T0 + 60_000 + 29_999, [10.0])])
    assert rows == []
    _, rows = run([gpu_sample(T0, [10.0]), gpu_sample(T0 + 60_000 + 30_000, [10.0])])
    assert len(rows) == 1


def test_out_of_order_within_grace_is_aggregated_and_late_records_are_counted() -> None:
    state, rows = run([
        gpu_sample(T0 + 70_000, [90.0]),
        gpu_sample(T0 + 50_000, [10.0]),  # earlier window, but the watermark has not passed it
        gpu_sample(T0 + 150_000, [90.0]),  # closes both windows
        gpu_sample(T0 + 55_000, [99.0]),  # too late: its window's row is out
    ])
    assert [(r.window_start, r.util_mean) for r in rows] == [(T0, 10.0), (T0 + 60_000, 90.0)]
    assert state.late == 1
    assert all(acc.window_start >= T0 + 120_000 for acc in state.open.values())


def test_idle_device_without_job_is_not_allocated_and_util_is_clamped() -> None:
    _, rows = run([gpu_sample(T0, [101.0], job=None), gpu_sample(T0 + 200_000, [0.0], job=None)])
    assert rows[0].util_mean == 100.0 and not rows[0].allocated and rows[0].job is None


def test_tpu_rows_per_chip_with_slice_and_hbm_fraction() -> None:
    _, rows = run([tpu_sample(T0, [80.0, 60.0]), tpu_sample(T0 + 5_000, [80.0, 60.0], node="h1"),
                       tpu_sample(T0 + 100_000, [0.0, 0.0])])
    assert [(r.node, r.device, r.util_mean) for r in rows] == [
        ("h0", "0", 80.0), ("h0", "1", 60.0), ("h1", "0", 80.0), ("h1", "1", 60.0)]
    assert all(r.slice == "s1" and r.accelerator == "v5litepod-8" for r in rows)
    assert rows[0].mem_used_frac == pytest.approx(0.25) and rows[0].power_w_mean is None


def test_reading_without_utilization_is_counted_not_averaged() -> None:
    sample = gpu_sample(T0, [50.0, 50.0])
    sample.gpus[1].metrics.pop("DCGM_FI_DEV_GPU_UTIL")
    state, _ = run([sample])
    assert state.no_util == 1
    assert [row.device for row in flush(state)] == ["0"]


def test_flush_leaves_the_state_and_advance_closes_what_is_open_in_place() -> None:
    # stages update their state in place (pipeline/stages/topology.py); flush only reads it
    state, _ = run([gpu_sample(T0, [40.0]), gpu_sample(T0 + 60_000, [60.0])])
    before = msgspec.msgpack.encode(state)
    assert [r.window_start for r in flush(state)] == [T0, T0 + 60_000]
    assert msgspec.msgpack.encode(state) == before
    later, rows = advance(state, T0 + 120_000 + 30_000, SETTINGS)
    assert [r.window_start for r in rows] == [T0, T0 + 60_000] and later.open == {}
    assert later is state and state.closed_before == T0 + 120_000


def test_rows_are_valid_contract_values_and_state_round_trips() -> None:
    state, rows = run([gpu_sample(T0, [12.5, 7.0]), gpu_sample(T0 + 95_000, [1.0, 1.0])])
    for row in rows:
        assert decode(encode(row), Utilization) == row
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=WindowState) == state
    assert msgspec.json.decode(msgspec.json.encode(state), type=WindowState) == state


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20 * 60_000), st.sampled_from(["n1", "n2"]), st.floats(0, 100)),
        min_size=1, max_size=40,
    ),
    st.integers(0, 120),
    st.sampled_from([10, 60, 300]),
)
def test_every_sample_lands_in_exactly_one_row_or_is_counted_late(
    records: list[tuple[int, str, float]], grace_s: int, window_s: int
) -> None:
    config = AggregateSettings(window_s=window_s, grace_s=grace_s)
    state: WindowState | None = None
    rows: list[Utilization] = []
    for offset, node, util in records:
        state, out = aggregate(state, gpu_sample(T0 + offset, [util], node=node), config)
        rows += out
    assert state is not None
    rows += flush(state)
    keys = [(r.window_start, r.node, r.device) for r in rows]
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    assert sum(r.samples for r in rows) + state.late == len(records)
    # a record is late when, before it arrived, the newest time minus grace had passed the end
    # of its window; every other record is in its (window, node) row
    window_ms, newest, kept = window_s * 1000, None, []
    for offset, node, util in records:
        start = offset - offset % window_ms
        late = newest is not None and start + window_ms <= newest - grace_s * 1000
        if not late:
            kept.append((start + T0, node, util))
        newest = offset if newest is None else max(newest, offset)
    assert state.late == len(records) - len(kept)
    for row in rows:
        mine = [util for start, node, util in kept if (start, node) == (row.window_start, row.node)]
        assert (row.samples, row.util_max) == (len(mine), max(mine))
