"""Inventory files (pipeline/sources/inventory_file.py) and the release record of `fleetpulse policy release`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.commands.policy import release_record
from pipeline.config import SimSettings
from pipeline.errors import ConfigError, FleetPulseError
from pipeline.sim.engine import Simulation
from pipeline.sim.inventory import from_fleet
from pipeline.sources.inventory_file import (
    InventoryFileError,
    load_inventory,
    write_inventory,
)
from pipeline.wire.topics import record_key

GOOD = {
    "schema": "inventory/1",
    "ts": 1767225600000,
    "cluster": "gke-a",
    "kind": "node",
    "name": "gpu-node-017",
    "pool": "h100-train",
    "zone": "us-central1-a",
    "accelerator": "nvidia-h100-80gb",
    "capacity": 8,
}


def _row(**changes: object) -> dict[str, object]:
    return {**GOOD, **changes}


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_good_jsonl_file_loads_in_order_and_skips_blank_lines(tmp_path: Path) -> None:
    file = tmp_path / "inv.jsonl"
    rows = [_row(name="n1"), _row(name="n2", kind="slice", capacity=16, accelerator="v5p-16")]
    file.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    records = load_inventory(file)
    assert [r.name for r in records] == ["n1", "n2"]
    assert [r.kind for r in records] == ["node", "slice"] and records[1].capacity == 16
    assert [record_key(r) for r in records] == ["gke-a/n1", "gke-a/n2"]


def test_a_json_array_loads_too(tmp_path: Path) -> None:
    file = tmp_path / "inv.json"
    file.write_text(json.dumps([_row(name="a"), _row(name="b", cluster="gke-b")], indent=2))
    assert [record_key(r) for r in load_inventory(file)] == ["gke-a/a", "gke-b/b"]


def test_every_bad_line_is_named_with_field_expected_and_got(tmp_path: Path) -> None:
    file = tmp_path / "inv.jsonl"
    file.write_text(
        json.dumps(_row(name="ok")) + "\n"
        + json.dumps(_row(name="n2", capacity=-1)) + "\n"
        + "{not json\n"
        + json.dumps({k: v for k, v in GOOD.items() if k != "pool"} | {"name": "n4"}) + "\n"
        + json.dumps(_row(name="../etc")) + "\n"
        + json.dumps({"schema": "gpu_sample/3"} | {"ts": 1767225600000}) + "\n"
    )
    with pytest.raises(InventoryFileError) as caught:
        load_inventory(file)
    errors = {e.line: e.error for e in caught.value.errors}
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert errors[2].field == "$.capacity" and ">= 0" in errors[2].expected and "-1" in errors[2].got
    assert errors[3].field == "$" and "JSON object" in errors[3].expected
    assert errors[4].field == "$.pool" and errors[4].got == "nothing"
    assert errors[5].field == "$.name" and "../etc" in errors[5].got
    assert errors[6].field.startswith("$") and errors[6].expected  # the wrong kind of value
    message = str(caught.value)
    assert str(file) in message and "5 bad inventory value(s)" in message
    assert "line 2: $.capacity: expected" in message and "line 4: $.pool" in message


def test_a_name_listed_twice_in_one_cluster_is_an_error(tmp_path: Path) -> None:
    file = _jsonl(
        tmp_path / "inv.jsonl",
        [_row(name="n1"), _row(name="n1", cluster="gke-b"), _row(name="n1", pool="other")],
    )
    with pytest.raises(InventoryFileError) as caught:
        load_inventory(file)
    (only,) = caught.value.errors
    assert only.line == 3 and "repeat of line 1" in only.error.got


def test_unreadable_and_non_array_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FleetPulseError, match="cannot read inventory file"):
        load_inventory(tmp_path / "missing.jsonl")
    broken = tmp_path / "broken.json"
    broken.write_text("[{\"schema\": ")
    with pytest.raises(FleetPulseError, match="not a JSON array"):
        load_inventory(broken)


def test_the_simulated_fleet_round_trips_through_a_file(tmp_path: Path) -> None:
    sim = Simulation(SimSettings(seed=3, gpu_nodes=6, tpu_slices=2, duration_s=60), [])
    records = from_fleet(sim.fleet, sim.start_ms)
    assert write_inventory(tmp_path / "inventory.jsonl", records) == 8
    assert load_inventory(tmp_path / "inventory.jsonl") == records
    slices = [r for r in records if r.kind == "slice"]
    assert len(slices) == 2 and all(r.capacity > 0 for r in slices)
    names = {r.name for r in records}
    assert names == {n.name for n in sim.fleet.gpu_nodes} | {s.name for s in sim.fleet.slices}


def test_a_release_names_one_scope() -> None:
    ts = 1767225600000
    pool = release_record("pool", "gke-a/h100", "node.down", "alice", "outage over", ts)
    assert (pool.scope, pool.name, pool.actor) == ("pool", "gke-a/h100", "alice")
    assert record_key(pool) == "pool:gke-a/h100"
    inline = release_record("zone:us-central1-a", None, "silence", "bob", "", ts)
    assert (inline.scope, inline.name) == ("zone", "us-central1-a")
    assert release_record("fleet", None, "xid.79", "carol", "", ts).name == "fleet"
    for scope, name, words in [
        ("rack", "r1", "expected one of pool, zone, fleet"),
        ("pool", None, "needs --name"),
        ("pool", "h100", "CLUSTER/POOL"),
        ("zone:a", "b", "give one"),
        ("fleet", "eu", "'fleet'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            release_record(scope, name, "node.down", "x", "", ts)
    with pytest.raises(ConfigError, match=r"\$.check"):
        release_record("fleet", None, "c" * 300, "x", "", ts)
