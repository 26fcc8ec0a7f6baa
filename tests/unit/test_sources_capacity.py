"""The pure parts of `ingest capacity`: quota locations, maintenance state → changes, the
metadata values, queued-resource transitions."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.errors import ConfigError
from pipeline.sources.maintenance import Member, Upcoming, maintenance_events
from pipeline.sources.metadata import Identity, notice_events
from pipeline.sources.quota import is_accelerator_quota, zones_of

NODE = Member(
    cluster="c1", pool="p1", zone="us-east5-a", kind="node", name="n1",
    accelerator="nvidia-h100-80gb", capacity=8, labels={},
)
ZONES = ("us-east5-a", "us-east5-b", "europe-west4-a")
T0 = 1_764_424_800_000


def test_quota_locations_cover_their_zones() -> None:
    assert zones_of("us-east5-a", ZONES) == ["us-east5-a"]
    assert zones_of("us-east5", ZONES) == ["us-east5-a", "us-east5-b"]
    assert zones_of("global", ZONES) == list(ZONES)
    assert zones_of("asia-east1", ZONES) == []


def test_only_accelerator_quotas_are_read() -> None:
    assert is_accelerator_quota("compute.googleapis.com/nvidia_h100_80gb_gpus")
    assert is_accelerator_quota("tpu.googleapis.com/v5p_chips")
    assert not is_accelerator_quota("compute.googleapis.com/cpus")
    assert not is_accelerator_quota("storage.googleapis.com/bytes_gpus")


_UPCOMING = st.one_of(
    st.none(),
    st.builds(
        Upcoming,
        status=st.sampled_from(["PENDING", "ONGOING"]),
        kind=st.just("SCHEDULED"),
        start=st.sampled_from(["2026-12-02T05:00:00Z", "2026-12-02T06:00:00Z"]),
        end=st.just("2026-12-02T07:00:00Z"),
    ),
)


@settings(deadline=None)  # 2 shared cores: wall-clock deadlines only add flakes
@given(st.lists(_UPCOMING, max_size=12))
def test_maintenance_says_each_change_once(states: list[Upcoming | None]) -> None:
    seen: dict[str, str] = {}
    kinds: list[str] = []
    previous: Upcoming | None = None
    for now, upcoming in enumerate(states):
        events = maintenance_events(seen, [(NODE, upcoming)], T0 + now * 1000, "test").events
        again = maintenance_events(seen, [(NODE, upcoming)], T0 + now * 1000 + 1, "test").events
        assert again == [], "the same state read twice is one event, not two"
        kinds += [e.kind for e in events]  # type: ignore[attr-defined]
        if upcoming is None:
            assert len(events) == (previous is not None)
        previous = upcoming
    # DONE only ever follows something announced, and never twice in a row
    for before, after in pairwise(kinds):
        assert not (before == after == "MAINTENANCE_DONE")
    if kinds:
        assert kinds[0] != "MAINTENANCE_DONE"


def test_a_window_that_moves_is_scheduled_again() -> None:
    seen: dict[str, str] = {}
    first = Upcoming("PENDING", "SCHEDULED", "2026-12-02T05:00:00Z", "2026-12-02T06:00:00Z")
    moved = Upcoming("PENDING", "SCHEDULED", "2026-12-03T05:00:00Z", "2026-12-03T06:00:00Z")
    one = maintenance_events(seen, [(NODE, first)], T0, "t").events
    two = maintenance_events(seen, [(NODE, moved)], T0 + 1, "t").events
    assert [e.kind for e in one + two] == ["MAINTENANCE_SCHEDULED"] * 2  # type: ignore[attr-defined]
    assert two[0].window.start > one[0].window.start  # type: ignore[attr-defined]


def test_a_bad_window_time_is_a_bad_record_and_is_not_remembered() -> None:
    seen: dict[str, str] = {}
    bad = Upcoming("PENDING", "SCHEDULED", "next tuesday", "")
    parsed = maintenance_events(seen, [(NODE, bad)], T0, "t")
    assert parsed.events == [] and seen == {}
    [record] = parsed.bad
    assert "RFC 3339" in str(record.error) and "next tuesday" in str(record.error)


def test_a_name_that_is_not_one_is_a_bad_record_not_a_failed_poll() -> None:
    # the struct refuses it as it is built (model.KnownNames), before it is validated
    seen: dict[str, str] = {}
    odd = Member(cluster="c1", pool="GPU pool", zone="us-east5-a", kind="node", name="n2",
                 accelerator="nvidia-h100-80gb", capacity=8, labels={})  # fmt: skip
    upcoming = Upcoming("PENDING", "SCHEDULED", "2026-12-02T05:00:00Z", "2026-12-02T07:00:00Z")
    parsed = maintenance_events(seen, [(odd, upcoming), (NODE, upcoming)], T0, "t")
    assert [e.target for e in parsed.events] == ["n1"]  # type: ignore[attr-defined]
    [record] = parsed.bad
    assert record.error.field == "$.pool" and record.error.got == '"GPU pool"'
    assert "c1/n2" not in seen  # asked again at the next poll
    me = Identity(cluster="c1", pool="p1", zone="zone a", node="n1")
    metadata = notice_events({}, me, "TERMINATE_ON_HOST_MAINTENANCE", "FALSE", T0)
    assert metadata.events == [] and metadata.bad[0].error.got == "\"zone a\""


ME = Identity(cluster="c1", pool="p1", zone="us-east5-a", node="n1")


def test_metadata_values_become_events_on_change() -> None:
    seen: dict[str, str] = {}
    assert notice_events(seen, ME, "NONE", "FALSE", T0).events == []
    started = notice_events(seen, ME, "TERMINATE_ON_HOST_MAINTENANCE", "FALSE", T0 + 1000).events
    same = notice_events(seen, ME, "TERMINATE_ON_HOST_MAINTENANCE", "FALSE", T0 + 2000).events
    done = notice_events(seen, ME, "NONE", "TRUE", T0 + 3000).events
    assert [e.kind for e in started] == ["MAINTENANCE_STARTED"]  # type: ignore[attr-defined]
    assert same == []
    assert [e.kind for e in done] == ["MAINTENANCE_DONE", "PREEMPTION"]  # type: ignore[attr-defined]
    assert {e.target for e in started + done} == {"n1"}  # type: ignore[attr-defined]


def test_unknown_metadata_values_are_bad_records() -> None:
    parsed = notice_events({}, ME, "MAYBE", "YES", T0)
    assert parsed.events == []
    assert [r.error.field for r in parsed.bad] == [
        "instance/maintenance-event", "instance/preempted"
    ]


def test_the_capacity_section_takes_environment_overrides() -> None:
    settings = load_settings(
        environ={
            "FLEETPULSE_CAPACITY__FEEDS": '["quota", "metadata"]',
            "FLEETPULSE_CAPACITY__ZONES": '["us-east5-a"]',
            "FLEETPULSE_CAPACITY__METADATA_URL": "http://127.0.0.1:8080",
        }
    )
    assert settings.capacity.feeds == ("quota", "metadata")
    assert settings.capacity.zones == ("us-east5-a",)
    assert settings.capacity.metadata_url == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match=r"capacity\.feeds"):
        load_settings(environ={"FLEETPULSE_CAPACITY__FEEDS": '["quotas"]'})


def test_skipped_quota_series_are_counted_on_metrics_by_quota_metric() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from pipeline.selfmetrics import StatsCollector
    from pipeline.sources.capacity import CapacityStats

    stats = CapacityStats(quota_skipped={"compute.googleapis.com/cpus": 3})
    registry = CollectorRegistry()
    registry.register(StatsCollector("ingest_capacity", stats))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert ('fleetpulse_ingest_capacity_quota_skipped_total{quota_metric='
            '"compute.googleapis.com/cpus"} 3.0') in text
