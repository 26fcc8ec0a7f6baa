"""The lake's columns are the model's: each table's Parquet schema is derived from its event's
msgspec Struct (pipeline/lake/tables.py), and it is exactly the schema the lake has always
written (the hand-written columns before the derivation: name, order, type and version), so
files already on disk read beside new ones."""

from __future__ import annotations

import pytest

from pipeline.lake.columns import columns_of
from pipeline.lake.tables import TABLES
from pipeline.model import Action, Event

# name -> (version, "column:arrow type" in order), as the lake wrote them before the derivation
WRITTEN: dict[str, tuple[int, tuple[str, ...]]] = {
    "utilization": (
        2,
        (
            "window_start:timestamp[ms]", "window_s:int32", "cluster:string",
            "pool:string", "zone:string", "node:string", "slice:string",
            "device:string", "accelerator:string", "job:string", "allocated:bool",
            "util_mean:double", "util_max:double", "mem_used_frac:double",
            "power_w_mean:double", "samples:int32", "step_compute_s:double", "schema:string",
        ),
    ),
    "findings": (
        1,
        (
            "ts:timestamp[ms]", "finding_id:string", "entity_kind:string",
            "target_cluster:string", "target_kind:string", "target_name:string",
            "target_pool:string", "target_zone:string", "device:string", "check:string",
            "severity:string", "healthy:bool", "fatal:bool",
            "recommended_action:string", "evidence_metric:string",
            "evidence_value:double", "evidence_baseline:double",
            "evidence_score:double", "evidence_window_s:int64", "message:string",
            "schema:string",
        ),
    ),
    "actions": (
        2,
        (
            "ts:timestamp[ms]", "action_id:string", "kind:string",
            "target_cluster:string", "target_kind:string", "target_name:string",
            "target_pool:string", "target_zone:string",
            "reason_checks:list<item:string>", "reason_finding_ids:list<item:string>",
            "reason_summary:string", "dry_run:bool", "proposal_id:string",
            "expires_at:timestamp[ms]", "device:string", "schema:string",
        ),
    ),
    "node_state": (
        1,
        (
            "ts:timestamp[ms]", "target_cluster:string", "target_kind:string",
            "target_name:string", "target_pool:string", "target_zone:string",
            "state:string", "since:timestamp[ms]", "episode:string",
            "cordoned_by_us:bool", "human_hold:bool", "repairs:int32",
            "last_action:string", "open_checks:list<item:string>", "schema:string",
        ),
    ),
    "alerts": (
        1,
        (
            "ts:timestamp[ms]", "fingerprint:string", "status:string",
            "alertname:string", "severity:string", "labels:map<string,string>",
            "annotations:map<string,string>", "starts_at:string", "ends_at:string",
            "generator_url:string", "schema:string",
        ),
    ),
    "withheld": (
        1,
        (
            "ts:timestamp[ms]", "withheld_id:string", "proposal_id:string",
            "kind:string", "target_cluster:string", "target_kind:string",
            "target_name:string", "target_pool:string", "target_zone:string",
            "reason:string", "detail:string", "checks:list<item:string>", "fatal:bool",
            "schema:string",
        ),
    ),
    "capacity": (
        1,
        (
            "ts:timestamp[ms]", "event_id:string", "provider:string", "source:string",
            "kind:string", "severity:string", "region:string", "zone:string",
            "cluster:string", "pool:string", "target_kind:string", "target:string",
            "accelerator_type:string", "quota_metric:string", "quota_limit:double",
            "quota_usage:double", "quota_unit:string", "window_start:timestamp[ms]",
            "window_end:timestamp[ms]", "window_notice_s:int64", "state:string",
            "previous_state:string", "error_code:string", "message:string",
            "schema:string",
        ),
    ),
    "capacity_snapshots": (
        1,
        (
            "ts:timestamp[ms]", "region:string", "zone:string", "accelerator_type:string",
            "provisioning_model:string", "devices:int32", "healthy:int32",
            "healthy_free:int32", "allocated:int32", "allocated_idle:int32", "suspect:int32",
            "out_of_service_cordoned:int32", "out_of_service_draining:int32",
            "out_of_service_repairing:int32", "out_of_service_maintenance:int32",
            "out_of_service_silent:int32", "maintenance_announced:int32",
            "quota_metric:string", "quota_limit:double", "quota_usage:double",
            "quota_headroom:double", "quota_trend_per_h:double",
            "quota_exhausts_at:timestamp[ms]", "quota_confidence:double", "quota_points:int64",
            "reservations_count:int64", "reservations_reserved:int32",
            "reservations_in_use:int32", "reservations_unused:int32", "stockouts_1h:int32",
            "queued_waits_1h:int32", "preemptions_1h:int32", "useful_pct:double",
            "usd_per_useful_hour:double", "price_usd_per_hour:double", "price_basis:string",
            "price_source:string", "price_location:string", "schema:string",
        ),
    ),
    "xid": (
        2,
        (
            "ts:timestamp[ms]", "cluster:string", "node:string", "pool:string",
            "zone:string", "pci_bus_id:string", "gpu_index:int32", "uuid:string",
            "xid:int32", "pid:int64", "process:string", "job:string", "message:string",
            "source:string", "count:int64", "last_ts:timestamp[ms]", "schema:string",
        ),
    ),
}


def test_every_table_is_listed() -> None:
    assert sorted(TABLES) == sorted(WRITTEN)


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_tables_schema_is_the_one_written_before(name: str) -> None:
    version, columns = WRITTEN[name]
    spec = TABLES[name]
    got = tuple(f"{f.name}:{str(f.type).replace(' ', '')}" for f in spec.schema)
    assert got == columns, f"{name}: expected columns {columns}, got {got}"
    assert spec.version == version
    assert spec.schema.metadata == {
        b"fleetpulse.table": name.encode(), b"fleetpulse.version": str(version).encode()
    }


class _Odd(Event, frozen=True, kw_only=True, tag_field="schema", tag="odd/1"):
    ts: int
    blob: bytes


def test_a_field_the_lake_cannot_hold_is_named() -> None:
    with pytest.raises(TypeError, match=r"_Odd\.blob: expected a type the lake can hold"):
        columns_of(_Odd)


def test_a_table_without_its_time_field_is_refused() -> None:
    with pytest.raises(ValueError, match="expected a time field 'window_start'"):
        columns_of(Action, time="window_start")
