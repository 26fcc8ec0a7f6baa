"""Every canned analysis against the fixture lake (tests/lake_fixture.py), whose answers follow
from how it was built; parameters are bound; views exist for every table. Each test runs on
both backends: the local Parquet lake and the same tables as Iceberg on s3proxy
(tests/iceberg_fixture.py; deploy/with-services.sh starts s3proxy)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from pipeline.catalog import price_for, xid_info
from pipeline.lake.query import Lake, QueryError, canned_queries, parse_duration, parse_time
from pipeline.lake.tables import TABLES
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake


def at(ms: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=ms)


SINCE, UNTIL = at(fx.T0), at(fx.END)
HOUR_STARTS = [at(fx.T0 + h * fx.HOUR) for h in range(fx.HOURS)]


@pytest.fixture(scope="module", params=BACKENDS)
def lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Lake]:
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("lake"))
    with Lake(root, settings) as opened:
        yield opened


def run(lake: Lake, name: str, **params: Any) -> list[dict[str, Any]]:
    params.setdefault("until", UNTIL)
    query = canned_queries()[name]
    if "since" in query.params:
        params.setdefault("since", SINCE)
    return lake.run(name, **params).records()


def devices(pool: str | None = None, zone: str | None = None, model: str | None = None
            ) -> list[tuple[str, str, float, bool, str]]:
    """(node, device, util, allocated, accelerator) of the fixture, filtered."""
    return [
        (node, device, fx.util_of(node, device), allocated, accelerator)
        for p, z, node, _, accelerator, devs, allocated in fx.UNITS
        for device in devs
        if pool in (None, p) and zone in (None, z) and model in (None, accelerator)
    ]


def test_every_canned_query_says_what_question_it_answers_and_runs(lake: Lake) -> None:
    queries = canned_queries()
    assert len(queries) >= 18
    for query in queries.values():
        assert query.question.endswith(("?", ".")) and len(query.question) > 40, query.name
        assert lake.run(query.name).columns, query.name


def test_views_exist_for_every_table_and_reference_data(lake: Lake) -> None:
    for name in [*TABLES, "prices", "xid_catalog"]:
        assert lake.sql(f"SELECT count(*) FROM {name}").rows[0][0] >= 0
    counts = {name: lake.sql(f"SELECT count(*) FROM {name}").rows[0][0] for name in TABLES}
    assert counts == {name: len(make()) for name, make in fx.EVERYTHING.items()}


@pytest.mark.parametrize(("query", "key", "field"), [
    ("utilization_by_pool", "pool", 0), ("utilization_by_zone", "zone", 1),
    ("utilization_by_model", "accelerator", 4),
])
def test_utilization_by_dimension_per_hour(lake: Lake, query: str, key: str, field: int) -> None:
    rows = run(lake, query)
    groups = sorted({unit[field] for unit in fx.UNITS})
    assert [(r["bucket"], r[key]) for r in rows] == [(h, g) for h in HOUR_STARTS for g in groups]
    for row in rows:
        mine = devices(**{{"accelerator": "model"}.get(key, key): row[key]})
        utils = [u for _, _, u, _, _ in mine]
        assert row["device_hours"] == len(mine)
        assert row["util_mean_pct"] == pytest.approx(sum(utils) / len(utils), abs=0.01)
        assert row["util_peak_pct"] == max(utils) + 10
        assert row["allocated_pct"] == pytest.approx(
            100 * sum(a for _, _, _, a, _ in mine) / len(mine), abs=0.01)
        assert row["mem_used_pct"] == 50.0


def test_pool_filter_is_a_bound_parameter(lake: Lake) -> None:
    assert {r["pool"] for r in run(lake, "utilization_by_pool", pool="train")} == {"train"}
    assert run(lake, "utilization_by_pool", pool="train' OR '1'='1") == []
    with pytest.raises(QueryError, match="takes no pool"):
        lake.run("quota_headroom", pool="train")


def test_idle_allocated_capacity(lake: Lake) -> None:
    rows = {r["pool"]: r for r in run(lake, "idle_allocated")}
    assert set(rows) == {"train", "tpu"}  # infer holds no job
    train = rows["train"]
    assert (train["allocated_hours"], train["idle_allocated_hours"]) == (16.0, fx.HOURS * 1.0)
    assert train["idle_pct_of_allocated"] == 25.0 and train["jobs_with_idle_devices"] == 1
    assert rows["tpu"]["idle_allocated_hours"] == 0.0


def _price(accelerator: str) -> float:
    price = price_for(accelerator)
    assert price is not None
    return price.usd_per_hour


def test_cost_of_idle_uses_the_price_table(lake: Lake) -> None:
    rows = {r["pool"]: r for r in run(lake, "cost_of_idle")}
    h100, a100 = _price(fx.H100), _price(fx.A100)
    assert rows["train"]["usd_per_hour"] == h100
    assert rows["train"]["idle_cost_usd"] == pytest.approx(fx.HOURS * h100, abs=0.01)
    assert rows["train"]["idle_allocated_cost_usd"] == pytest.approx(fx.HOURS * h100, abs=0.01)
    assert rows["infer"]["idle_cost_usd"] == pytest.approx(8 * a100, abs=0.01)
    assert rows["infer"]["idle_allocated_cost_usd"] == 0.0
    assert rows["tpu"]["idle_cost_usd"] == 0.0
    assert rows["tpu"]["total_cost_usd"] == pytest.approx(16 * _price(fx.V5E), abs=0.01)


def test_cost_per_useful_hour_and_config_price_override(lake: Lake) -> None:
    rows = {r["pool"]: r for r in run(lake, "cost_per_useful_hour")}
    useful = fx.HOURS * (3 * fx.BUSY + fx.IDLE) / 100
    assert rows["train"]["useful_hours"] == pytest.approx(useful, abs=0.001)
    assert rows["train"]["usd_per_useful_hour"] == pytest.approx(
        16 * _price(fx.H100) / useful, abs=0.01)
    assert rows["infer"]["usd_per_useful_hour"] is None  # nothing useful: no finite price
    with Lake(lake.root, msgspec.structs.replace(lake.settings, prices={"H100": 2.0})) as cheap:
        result = cheap.run("cost_per_useful_hour", since=SINCE, until=UNTIL).records()
    assert next(r for r in result if r["pool"] == "train")["total_cost_usd"] == 32.0


def test_findings_timeline_leaves_out_heartbeats_and_all_clears(lake: Lake) -> None:
    rows = [(r["bucket"], r["check"], r["severity"], r["findings"], r["targets"])
            for r in run(lake, "findings_timeline")]
    assert rows == [
        (HOUR_STARTS[1], "xid", "critical", 2, 1),
        (HOUR_STARTS[1], "ici", "critical", 1, 1),
        (HOUR_STARTS[2], "xid", "warning", 3, 1),
        (HOUR_STARTS[3], "ecc", "warning", 1, 1),
    ]


def test_actions_and_health_timelines(lake: Lake) -> None:
    actions = run(lake, "actions_timeline")
    expected = sorted(fx.ACTIONS, key=lambda a: (a.ts, a.target.name, a.kind))
    assert [r["action_id"] for r in actions] == [a.action_id for a in expected]
    assert [r["dry_run"] for r in actions] == [a.dry_run for a in expected]
    health = run(lake, "health_timeline")
    # a target's first appearance counts as a change from healthy: arriving healthy is none
    last: dict[str, str] = {}
    entered = 0
    for row in sorted(fx.NODE_STATES, key=lambda s: s.ts):
        entered += last.get(row.target.name, "healthy") != row.state
        last[row.target.name] = row.state
    assert entered == len(fx.NODE_STATES) - 3  # g1, s1 arrive healthy; g1 re-reports healthy
    assert sum(r["transitions"] for r in health) == entered
    assert (HOUR_STARTS[0], "healthy") not in {(r["bucket"], r["state"]) for r in health}
    cordoned = [r for r in health if r["state"] == "cordoned"]
    assert cordoned == [{"bucket": HOUR_STARTS[1], "state": "cordoned", "transitions": 2,
                         "targets": 2}]


def test_mtbf_by_model_and_time_between_failures(lake: Lake) -> None:
    mtbf = {r["accelerator"]: r for r in run(lake, "mtbf_by_model")}
    assert (mtbf[fx.H100]["units"], mtbf[fx.H100]["unit_hours"], mtbf[fx.H100]["failures"]) == (
        2, 2.0 * fx.HOURS, 2)
    assert mtbf[fx.H100]["mtbf_hours"] == fx.HOURS
    assert (mtbf[fx.V5E]["failures"], mtbf[fx.V5E]["mtbf_hours"]) == (1, fx.HOURS)
    assert (mtbf[fx.A100]["failures"], mtbf[fx.A100]["mtbf_hours"]) == (0, None)
    gaps = {r["target_name"]: r for r in run(lake, "time_between_failures")}
    assert gaps["g1"]["failures"] == 2 and gaps["g1"]["accelerator"] == fx.H100
    assert gaps["g1"]["mean_hours_between"] == fx.G1_FAILURE_GAP_HOURS
    assert gaps["s1"]["failures"] == 1 and gaps["s1"]["mean_hours_between"] is None
    assert set(gaps) == {"g1", "s1"}


def test_xid_frequency_and_heatmap(lake: Lake) -> None:
    gpu_hours = len([d for d in devices() if not d[4].startswith("v")]) * fx.HOURS
    rows = {r["xid"]: r for r in run(lake, "xid_frequency")}
    # events are kernel-log lines: a coalesced record counts its repeats
    assert {code: r["events"] for code, r in rows.items()} == {13: 5, 79: 2}
    assert rows[79]["mnemonic"] == xid_info(79).mnemonic and rows[79]["nodes"] == 1
    assert rows[13]["per_1k_gpu_hours"] == pytest.approx(1000 * 5 / gpu_hours, abs=0.001)
    heat = [(r["node"], r["bucket"], r["events"], r["fatal_events"], r["codes"])
            for r in run(lake, "xid_heatmap")]
    assert heat == [("g1", HOUR_STARTS[1], 2, 2 if xid_info(79).fatal else 0, "79"),
                    ("g3", HOUR_STARTS[2], 5, 5 if xid_info(13).fatal else 0, "13")]


def test_top_offenders_rank_by_actions_then_errors(lake: Lake) -> None:
    rows = run(lake, "top_offenders")
    assert [r["target_name"] for r in rows] == ["g1", "s1", "g3"]
    g1 = rows[0]
    assert (g1["actions"], g1["findings"], g1["critical_findings"], g1["xids"]) == (3, 3, 2, 2)
    assert g1["action_kinds"] == "cordon,repair" and g1["pool"] == "train"


def test_quota_and_capacity_headroom(lake: Lake) -> None:
    quota = {r["zone"]: r for r in run(lake, "quota_headroom")}
    assert quota["z-a"]["headroom"] == fx.QUOTA_LIMIT - fx.QUOTA_USAGE
    assert quota["z-a"]["stockouts"] == 1
    assert quota["z-b"]["maintenance_scheduled"] == 1 and quota["z-b"]["quota_metric"] is None
    now = {(r["zone"], r["accelerator"]): r for r in run(lake, "capacity_headroom")}
    assert (now[("z-b", fx.A100)]["free"], now[("z-a", fx.H100)]["allocated"]) == (2, 4)
    # 15 minutes into g1's first repair and s1's cordon, both are out of service
    during = {r["accelerator"]: r for r in run(
        lake, "capacity_headroom", until=at(fx.T0 + fx.HOUR + 15 * fx.MINUTE))}
    assert (during[fx.H100]["out_of_service"], during[fx.H100]["allocated"]) == (2, 2)
    assert during[fx.V5E]["out_of_service"] == 4 and during[fx.V5E]["free_pct"] == 0.0


def test_tpu_slice_availability(lake: Lake) -> None:
    (row,) = run(lake, "tpu_slice_availability")
    assert row["slice"] == "s1" and row["chips"] == 4
    assert row["available_pct"] == 100 * (1 - fx.S1_OUT_HOURS / fx.HOURS)
    assert (row["hours_out_of_service"], row["failures"], row["state_now"]) == (
        fx.S1_OUT_HOURS, 1, "healthy")


def test_ici_degraded_links_name_slice_and_link(lake: Lake) -> None:
    (row,) = run(lake, "ici_degraded_links")
    assert (row["slice"], row["link"], row["checks"], row["findings"]) == ("s1", "0", "ici", 1)
    assert row["worst_severity"] == "critical" and row["pool"] == "tpu"
    assert run(lake, "ici_degraded_links", pool="train") == []


def test_mtbf_by_pool(lake: Lake) -> None:
    rows = {r["pool"]: r for r in run(lake, "mtbf_by_pool")}
    # train: g1 fails twice in 2 nodes x 4 h; tpu: s1 once in 4 h; infer: g3 never
    assert (rows["train"]["units"], rows["train"]["failures"]) == (2, 2)
    assert rows["train"]["mtbf_hours"] == 2 * fx.HOURS / 2
    assert (rows["tpu"]["failures"], rows["tpu"]["mtbf_hours"]) == (1, fx.HOURS)
    assert (rows["infer"]["failures"], rows["infer"]["mtbf_hours"]) == (0, None)
    assert [r["pool"] for r in run(lake, "mtbf_by_pool", pool="infer")] == ["infer"]


def test_open_actions_are_those_whose_target_has_not_recovered(lake: Lake) -> None:
    (row,) = run(lake, "open_actions")
    assert (row["target_name"], row["kind"], row["state_now"]) == ("g1", "cordon", "degraded")
    assert row["ts"] == at(fx.T0 + 3 * fx.HOUR + 5 * fx.MINUTE)
    earlier = run(lake, "open_actions", until=at(fx.T0 + fx.HOUR + 20 * fx.MINUTE))
    assert {r["target_name"]: r["kind"] for r in earlier} == {"g1": "repair", "s1": "repair_slice"}


def test_fleet_summary(lake: Lake) -> None:
    (row,) = run(lake, "fleet_summary")
    utils = [u for _, _, u, _, _ in devices()]
    assert (row["devices"], row["device_hours"]) == (len(utils), len(utils) * fx.HOURS)
    assert row["util_mean_pct"] == pytest.approx(sum(utils) / len(utils), abs=0.01)
    assert (row["findings"], row["actions"], row["dry_run_actions"]) == (7, 4, 1)
    assert (row["xid_events"], row["alerts_fired"], row["idle_allocated_hours"]) == (7, 1, 4.0)


def test_fleet_summary_pool_filters_alerts_too(lake: Lake) -> None:
    # the fixture's alert names node g1 (pool train) and carries no pool label
    fired = {pool: run(lake, "fleet_summary", pool=pool)[0]["alerts_fired"]
             for pool in ("train", "infer", "tpu")}
    assert fired == {"train": 1, "infer": 0, "tpu": 0}


def test_defaults_cover_the_last_day_of_data_and_durations_parse(lake: Lake) -> None:
    assert lake.latest() == UNTIL
    rows = lake.run("utilization_by_pool").records()
    assert rows[0]["bucket"] == HOUR_STARTS[0]
    assert parse_duration("24h") == timedelta(hours=24) and parse_duration("15m").seconds == 900
    assert parse_time("2026-01-01T02:00:00+02:00") == datetime(2026, 1, 1)
    with pytest.raises(QueryError, match="15m, 24h"):
        parse_duration("soon")


def test_fixture_events_are_valid_contract_values() -> None:
    from pipeline.wire.codec import decode, encode

    for make in fx.EVERYTHING.values():
        for event in make()[:50]:
            assert decode(encode(event), type(event)) == event


def test_why_not_removed_gives_every_rule_that_held_a_target_back_and_what_came_of_it(
    lake: Lake,
) -> None:
    rows = run(lake, "why_not_removed", target="g2")
    assert [(r["reason"], r["acted_at"]) for r in rows] == [
        ("budget", None), ("common_cause", None), ("dropped: cleared", None)
    ], rows
    assert rows[0]["detail"] == "budget in words" and rows[0]["checks"] == "xid"
    # held at 3 h for the budget, then cordoned at 3 h 5 min (a real action, not a dry run)
    (g1,) = run(lake, "why_not_removed", target="c1/g1")
    assert (g1["reason"], g1["acted_at"], g1["acted_dry_run"]) == (
        "budget", at(fx.T0 + 3 * fx.HOUR + 5 * fx.MINUTE), False
    )
    assert run(lake, "why_not_removed", target="g3") == []
    assert len(run(lake, "why_not_removed")) == len(fx.WITHHELD)  # no target: every one
    assert run(lake, "why_not_removed", target="g2", until=at(fx.T0 + 2 * fx.HOUR))[-1][
        "reason"] == "common_cause"  # the period ends before the drop


def test_a_question_per_dimension_is_one_query_with_its_old_names_as_aliases(lake: Lake) -> None:
    queries = canned_queries()
    assert queries["utilization_timeline"].choices == {"by": ("pool", "zone", "accelerator")}
    assert queries["mtbf_by_model"].alias_of == "mtbf"
    for alias, by in (("utilization_by_zone", "zone"), ("mtbf_by_pool", "pool")):
        target = queries[alias].alias_of
        assert target is not None
        assert run(lake, alias) == run(lake, target, by=by)
    per_zone = {r["zone"]: r for r in run(lake, "mtbf", by="zone")}
    assert set(per_zone) == {z for _, z, *_ in fx.UNITS}
    assert "accelerators" not in run(lake, "mtbf", by="accelerator")[0]


def test_a_dimension_is_one_of_those_its_query_names(lake: Lake) -> None:
    with pytest.raises(QueryError, match="expected by to be one of pool, zone, accelerator, got 'node'"):
        run(lake, "utilization_timeline", by="node")
    with pytest.raises(QueryError, match="is 'utilization_timeline' with by=pool"):
        run(lake, "utilization_by_pool", by="zone")
