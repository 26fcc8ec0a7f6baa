"""Quota series as Cloud Monitoring serves them (`serviceruntime.googleapis.com/quota/limit` and
`…/quota/allocation/usage` on `consumer_quota`, metric labels `quota_metric` and, on the
limit, `limit_name`; resource labels `project_id`, `service`, `location`): which are read,
and which are skipped quietly, counted and never dead-lettered."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import monitoring_v3

from pipeline.model import CapacityEvent
from pipeline.sources.quota import (
    QUOTA_LIMIT,
    QUOTA_USAGE,
    is_accelerator_quota,
    parse_quota_series,
    quota_service,
    quota_words,
)

T0 = 1_764_424_800_000
ZONES = ("us-central1-a", "us-central1-b", "europe-west4-a")


def _series(
    metric_type: str, quota_metric: str, location: str, value: int, limit_name: str = ""
) -> Any:
    labels = {"quota_metric": quota_metric}
    if metric_type == QUOTA_LIMIT:
        labels["limit_name"] = limit_name
    resource = {"project_id": "p", "service": quota_service(quota_metric), "location": location}
    return monitoring_v3.TimeSeries(
        {
            "metric": {"type": metric_type, "labels": labels},
            "resource": {"type": "consumer_quota", "labels": resource},
            "metric_kind": 1,
            "value_type": 2,
            "points": [
                {
                    "interval": {"end_time": {"seconds": T0 // 1000}},
                    "value": {"int64_value": value},
                }
            ],
        }
    )


def _usage_and_limit(quota_metric: str, location: str, limit_name: str) -> list[Any]:
    return [
        _series(QUOTA_LIMIT, quota_metric, location, 64, limit_name),
        _series(QUOTA_USAGE, quota_metric, location, 40),
    ]


# quota_metric, location, limit_name → the zones it is said for
READ = [
    ("compute.googleapis.com/gpus_all_regions", "global", "GPUS-ALL-REGIONS-per-project", ZONES),
    (
        "compute.googleapis.com/nvidia_h100_80gb_gpus", "us-central1-a",
        "NVIDIA-H100-80GB-GPUS-per-project-zone", ("us-central1-a",),
    ),
    (
        "compute.googleapis.com/preemptible_nvidia_a100_gpus", "us-central1",
        "PREEMPTIBLE-NVIDIA-A100-GPUS-per-project-region", ("us-central1-a", "us-central1-b"),
    ),
    (
        "compute.googleapis.com/committed_nvidia_h100_gpus", "europe-west4",
        "COMMITTED-NVIDIA-H100-GPUS-per-project-region", ("europe-west4-a",),
    ),
    ("compute.googleapis.com/Tpus", "us-central1", "TPUS-per-project-region", ZONES[:2]),
    (
        "compute.googleapis.com/PreemptibleTpus", "us-central1",
        "PREEMPTIBLE-TPUS-per-project-region", ZONES[:2],
    ),
    (
        "compute.googleapis.com/tpu_v5_lite_podslice", "us-central1-b",
        "TPU-V5-LITE-PODSLICE-per-project-zone", ("us-central1-b",),
    ),
    (
        "tpu.googleapis.com/TPUV4PodPerProjectPerZoneForTPUAPI", "us-central1-a",
        "TPUV4PodPerProjectPerZoneForTPUAPI", ("us-central1-a",),
    ),
    ("tpu.googleapis.com/v5p_chips", "us-central1-a", "V5P-CHIPS-per-project-zone", ZONES[:1]),
    (
        "tpu.googleapis.com/tpu-v5s-litepod-serving-preemptible", "europe-west4-a",
        "TPU-V5S-LITEPOD-SERVING-PREEMPTIBLE-per-project-zone", ("europe-west4-a",),
    ),
    (
        "compute.googleapis.com/reservations", "us-central1",
        "RESERVATIONS-per-project-region", ZONES[:2],
    ),
    (
        "compute.googleapis.com/future_reservations", "global",
        "FUTURE-RESERVATIONS-per-project", ZONES,
    ),
]
SKIPPED = [
    ("compute.googleapis.com/cpus", "us-central1", "CPUS-per-project-region"),
    ("compute.googleapis.com/cpus_all_regions", "global", "CPUS-ALL-REGIONS-per-project"),
    ("compute.googleapis.com/n2_cpus", "us-central1", "N2-CPUS-per-project-region"),
    ("compute.googleapis.com/in_use_addresses", "us-central1", "IN-USE-ADDRESSES-per-region"),
    ("compute.googleapis.com/disks_total_storage", "us-central1", "DISKS-TOTAL-GB-per-region"),
    ("compute.googleapis.com/local_ssd_total_storage", "us-central1", "LOCAL-SSD-per-region"),
    ("compute.googleapis.com/commitments", "us-central1", "COMMITMENTS-per-project-region"),
    ("compute.googleapis.com/instances", "us-central1-a", "INSTANCES-per-project-zone"),
    ("compute.googleapis.com/outputs", "global", "OUTPUTS-per-project"),  # `tpu` in a word
    ("tpu.googleapis.com/default_requests", "global", "DefaultRequestsPerMinutePerProject"),
]


@pytest.mark.parametrize(("quota_metric", "location", "limit_name", "zones"), READ)
def test_an_accelerator_quota_is_read_for_the_zones_it_covers(
    quota_metric: str, location: str, limit_name: str, zones: tuple[str, ...]
) -> None:
    parsed = parse_quota_series(_usage_and_limit(quota_metric, location, limit_name), {}, ZONES)
    assert parsed.bad == []
    assert parsed.skipped == {}
    events = [e for e in parsed.events if isinstance(e, CapacityEvent) and e.quota]
    assert len(events) == len(parsed.events)
    got = sorted((e.zone, e.kind, e.quota.usage, e.quota.limit) for e in events if e.quota)
    assert got == [(zone, "QUOTA_USAGE", 40.0, 64.0) for zone in sorted(zones)]
    assert {e.quota.metric for e in events if e.quota} == {quota_metric}


@pytest.mark.parametrize(("quota_metric", "location", "limit_name"), SKIPPED)
def test_a_quota_that_is_not_an_accelerator_is_skipped_and_counted(
    quota_metric: str, location: str, limit_name: str
) -> None:
    limits: dict[str, float] = {}
    series = _usage_and_limit(quota_metric, location, limit_name)
    parsed = parse_quota_series(series, limits, ZONES)
    assert (parsed.events, parsed.bad) == ([], [])
    assert parsed.skipped == {quota_metric: 2}
    assert limits == {}  # nothing of it kept in the checkpoint either


def test_every_poll_skips_them_again_beside_the_accelerator_quotas_it_reads() -> None:
    series = [
        one
        for metric, location, name, *_ in READ[:2] + SKIPPED  # type: ignore[operator]
        for one in _usage_and_limit(metric, location, name)
    ]
    limits: dict[str, float] = {}
    for _ in range(3):
        parsed = parse_quota_series(series, limits, ZONES)
        assert parsed.bad == []
        assert len(parsed.events) == len(ZONES) + 1
        assert sum(parsed.skipped.values()) == 2 * len(SKIPPED)


def test_a_broken_accelerator_series_is_still_a_bad_record() -> None:
    missing = _series(QUOTA_USAGE, "compute.googleapis.com/nvidia_l4_gpus", "", 3)
    parsed = parse_quota_series([missing], {}, ZONES)
    assert [bad.error.field for bad in parsed.bad] == ["resource.labels.location"]
    no_limit = _series(QUOTA_USAGE, "compute.googleapis.com/nvidia_l4_gpus", "us-central1-a", 3)
    parsed = parse_quota_series([no_limit], {}, ZONES)
    assert "nvidia_l4_gpus" in parsed.bad[0].error.field


@pytest.mark.parametrize(
    ("quota_metric", "words"),
    [
        ("compute.googleapis.com/nvidia_h100_80gb_gpus", ["nvidia", "h", "100", "80", "gb", "gpus"]),
        ("compute.googleapis.com/PreemptibleTpus", ["preemptible", "tpus"]),
        ("tpu.googleapis.com/TPUV4PodPerProject", ["tpuv", "4", "pod", "per", "project"]),
        ("tpu.googleapis.com/tpu-v5s-litepod-serving", ["tpu", "v", "5", "s", "litepod", "serving"]),
    ],
)
def test_quota_names_split_into_words(quota_metric: str, words: list[str]) -> None:
    assert quota_words(quota_metric) == words


def test_a_quota_of_another_service_is_not_ours() -> None:
    assert not is_accelerator_quota("aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus")
    assert not is_accelerator_quota("gpus_all_regions")
