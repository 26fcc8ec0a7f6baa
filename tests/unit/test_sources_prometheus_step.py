"""A job's per-rank step compute time from Prometheus, joined into the GPU readings of the
DCGM scrapes it belongs to (pipeline/sources/prometheus_step.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import SourcesSettings
from pipeline.model import GpuSample
from pipeline.sources.base import Parsed
from pipeline.sources.prometheus import parse_series
from pipeline.sources.prometheus_series import Identity
from pipeline.sources.prometheus_step import STEP_MAX_AGE_MS, joined, step_selector

IDENTITY = Identity("c1", "p1", "z1")
TS = 1_764_424_800.0


def dcgm(gpu: str, ts: float = TS, **labels: str) -> dict[str, Any]:
    return {
        "metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "Hostname": "gpu-7", "gpu": gpu,
                   "UUID": f"GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd", "pod": "train-1",
                   **labels},
        "values": [[ts, "1980"]],
    }  # fmt: skip


def step(gpu: str, points: list[tuple[float, str]], node: str = "gpu-7") -> dict[str, Any]:
    return {
        "metric": {"__name__": "job_step_compute_seconds", "node": node, "gpu": gpu,
                   "pod": "train-1"},
        "values": [[ts, value] for ts, value in points],
    }  # fmt: skip


def scrapes(*results: dict[str, Any]) -> Parsed:
    return parse_series(list(results), IDENTITY)


def steps_of(parsed: Parsed) -> list[list[float | None]]:
    return [
        [g.step_compute_s for g in e.gpus] for e in parsed.events if isinstance(e, GpuSample)
    ]


def test_each_reading_takes_the_newest_step_time_of_its_node_and_gpu_at_or_before_it() -> None:
    parsed = scrapes(dcgm("0"), dcgm("1"), dcgm("0", TS + 15), dcgm("1", TS + 15))
    series = [
        step("0", [(TS - 20, "0.81"), (TS - 2, "0.82"), (TS + 5, "0.83"), (TS + 16, "0.99")]),
        step("1", [(TS - 3, "0.80")]),  # published once: still fresh 15 s later
        step("0", [(TS, "5.0")], node="gpu-8"),  # another node's GPU 0
    ]
    out = joined(parsed, series, IDENTITY)
    assert out.bad == []
    assert steps_of(out) == [[0.82, 0.80], [0.83, 0.80]]


def test_a_stale_step_time_and_a_job_that_publishes_none_leave_the_reading_without() -> None:
    parsed = scrapes(dcgm("0"), dcgm("1"))
    old = TS - STEP_MAX_AGE_MS / 1000 - 1
    out = joined(parsed, [step("0", [(old, "0.8")])], IDENTITY)
    assert steps_of(out) == [[None, None]]
    assert steps_of(joined(parsed, [], IDENTITY)) == [[None, None]]


def test_a_step_time_of_another_job_on_the_gpu_is_not_this_jobs() -> None:
    parsed = scrapes(dcgm("0", pod="train-2"), dcgm("1", pod="train-2"))
    series = [
        step("0", [(TS - 5, "0.8")]),  # train-1, which ran here before
        {"metric": {"__name__": "job_step_compute_seconds", "node": "gpu-7", "gpu": "1",
                    "exported_pod": "train-2", "pod": "prometheus-0"},
         "values": [[TS - 30, "0.6"]]},
        step("1", [(TS - 1, "0.9")]),  # train-1 again: newer, but not the reading's job
    ]  # fmt: skip
    assert steps_of(joined(parsed, series, IDENTITY)) == [[None, 0.6]]


def test_mig_instances_get_no_step_time() -> None:
    parsed = scrapes(dcgm("0", GPU_I_ID="1", GPU_I_PROFILE="3g.40gb"), dcgm("1"))
    out = joined(parsed, [step("0", [(TS, "0.8")]), step("1", [(TS, "0.7")])], IDENTITY)
    assert steps_of(out) == [[None, 0.7]]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (step("x", [(TS, "0.8")]), "labels.gpu"),
        (step("0", [(TS, "-1")]), "seconds between 0 and 86400"),
        ({"metric": {"__name__": "job_step_compute_seconds"}, "values": "no"}, "values"),
        ({"metric": {"__name__": "job_step_compute_seconds", "gpu": "0"},
          "values": [[TS, "1"]]}, "a node name"),
    ],
)  # fmt: skip
def test_a_malformed_step_series_is_rejected_with_what_was_expected_and_the_rest_joined(
    bad: dict[str, Any], expected: str
) -> None:
    out = joined(scrapes(dcgm("0")), [bad, step("0", [(TS, "0.8")])], IDENTITY)
    assert steps_of(out) == [[0.8]]
    (rejected,) = out.bad
    assert expected in str(rejected.error)


def test_the_step_metric_is_a_setting_checked_as_a_metric_name() -> None:
    assert step_selector("job_step_compute_seconds", 'shard="a"') == (
        'job_step_compute_seconds{shard="a"}'
    )
    assert SourcesSettings(prometheus_step_metric="").prometheus_step_metric == ""
    with pytest.raises(ValueError, match="expected a metric name"):
        SourcesSettings(prometheus_step_metric='job_step{gpu="0"}')


POINT = st.tuples(
    st.integers(min_value=-120, max_value=10),  # seconds from the scrape
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False).map(lambda v: round(v, 3)),
    st.sampled_from(["", "train-1", "train-2"]),  # the series' pod ("" none)
)


@given(points=st.lists(POINT, max_size=12), job=st.sampled_from(["train-1", "train-2"]))
def test_the_joined_step_time_is_the_newest_fresh_point_of_the_readings_job(
    points: list[tuple[int, float, str]], job: str
) -> None:
    series = [
        {"metric": {"__name__": "job_step_compute_seconds", "node": "gpu-7", "gpu": "0",
                    **({"pod": pod} if pod else {})},
         "values": [[TS + offset, str(value)]]}
        for offset, value, pod in points
    ]  # fmt: skip
    out = joined(scrapes(dcgm("0", pod=job)), series, IDENTITY)
    eligible = [
        (offset, value, pod) for offset, value, pod in points
        if -STEP_MAX_AGE_MS / 1000 <= offset <= 0 and pod in ("", job)
    ]  # fmt: skip
    want = max(eligible, key=lambda p: (p[0], p[1], p[2]))[1] if eligible else None
    assert steps_of(out) == [[want]]
