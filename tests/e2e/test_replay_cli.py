"""`fleetpulse simulate` → inventory.jsonl → `fleetpulse replay`, as a user runs them (no Kafka)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.sim import read_truth

SMALL = ["--duration", "600", "--gpu-nodes", "8", "--tpu-slices", "1", "--seed", "5",
         "--no-random-faults", "--quiet"]
GARBAGE = [b"not json at all", b'{"schema": "gpu_sample/3", "ts": 5}', b"", b'{"schema": "nope/1"}',
           b'{"schema": "finding/2", "ts": 1767225700000}']


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},
    )


def _replay_json(*args: str) -> dict[str, Any]:
    run = _cli("replay", *args, "--json")
    assert run.returncode == 0, run.stderr
    document: dict[str, Any] = json.loads(run.stdout)
    return document


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "run"
    run = _cli("simulate", "--to", "jsonl", "--out", str(out), "--inject", "G1@120", *SMALL)
    assert run.returncode == 0, run.stderr
    assert "inventory.jsonl" in run.stdout
    return out


@pytest.fixture(scope="module")
def clean(recording: Path) -> dict[str, Any]:
    return _replay_json(str(recording / "events.jsonl"), "--inventory",
                        str(recording / "inventory.jsonl"))


def _consistent(document: dict[str, Any]) -> None:
    counts = document["counts"]
    for name in ("actions", "findings", "withheld", "withheld_records", "dead_letters"):
        assert counts[name] == len(document[name]), name


def test_simulate_writes_an_inventory_that_load_accepts(recording: Path) -> None:
    lines = (recording / "inventory.jsonl").read_text().splitlines()
    fleet = json.loads((recording / "fleet.json").read_text())
    assert len(lines) == len(fleet["gpu_nodes"]) + len(fleet["tpu_slices"]) == 9
    run = _cli("inventory", "load", str(recording / "inventory.jsonl"), "--dry-run")
    assert run.returncode == 0, run.stderr
    assert "9 records (8 nodes, 1 slices)" in run.stdout and "nothing sent" in run.stdout


def test_replay_with_inventory_acts_on_the_injected_fatal_fault(
    recording: Path, clean: dict[str, Any]
) -> None:
    _consistent(clean)
    assert clean["inventory"]["records"] == 9 and clean["inventory_enforced"] is True
    assert clean["counts"]["lines"] == len((recording / "events.jsonl").read_bytes().splitlines())
    assert clean["actions"] and all(a["dry_run"] for a in clean["actions"])
    (fault,) = [f for f in read_truth(recording / "events.truth.jsonl") if f.forced]
    cordons = [a for a in clean["actions"] if a["kind"] == "cordon"]
    assert [a["target"]["name"] for a in cordons] == [fault.target.name]
    assert cordons[0]["ts"] >= fault.onset_ms
    assert any(f["entity"]["target"]["name"] == fault.target.name for f in clean["findings"])
    assert clean["dead_letters"] == []


def test_garbage_lines_are_dead_letters_and_change_nothing_else(
    recording: Path, clean: dict[str, Any], tmp_path: Path
) -> None:
    lines = (recording / "events.jsonl").read_bytes().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    spliced = lines[:3] + GARBAGE[:2] + lines[3:200] + GARBAGE[2:] + lines[200:]
    mixed.write_bytes(b"\n".join(spliced) + b"\n")
    run = _cli("replay", str(mixed), "--inventory", str(recording / "inventory.jsonl"),
               "--json", "--out", str(tmp_path / "report"))
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    _consistent(document)
    letters = document["dead_letters"]
    assert [d["line"] for d in letters] == [4, 5, 204, 205]  # the blank line 203 is no record
    assert all(d["file"] == str(mixed) and d["error"] for d in letters)
    assert "JSON object" in letters[0]["error"] and "$.ts" in letters[1]["error"]
    assert "schema" in letters[2]["error"]
    assert document["counts"]["lines"] == len(lines) + 4
    assert document["actions"] == clean["actions"]
    for name in ("actions", "findings", "withheld", "withheld_records", "dead_letters"):
        written = (tmp_path / "report" / f"{name}.jsonl").read_text().splitlines()
        assert len(written) == document["counts"][name], name
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["counts"] == document["counts"]


def test_files_split_by_topic_merge_back_by_event_time(
    recording: Path, clean: dict[str, Any], tmp_path: Path
) -> None:
    gpu, rest = tmp_path / "gpu.jsonl", tmp_path / "rest.jsonl"
    lines = (recording / "events.jsonl").read_bytes().splitlines()
    gpu.write_bytes(b"".join(line + b"\n" for line in lines if b'"gpu_sample/3"' in line))
    rest.write_bytes(b"".join(line + b"\n" for line in lines if b'"gpu_sample/3"' not in line))
    document = _replay_json(str(gpu), str(rest), "--inventory", str(recording / "inventory.jsonl"))
    assert document["counts"]["lines"] == len(lines)
    assert document["actions"] == clean["actions"]


def test_a_recording_of_the_previous_gpu_sample_version_replays_the_same_actions(
    recording: Path, clean: dict[str, Any], tmp_path: Path
) -> None:
    # written by producers not yet upgraded: gpu_sample/2, no step compute time
    old = tmp_path / "v2.jsonl"
    with old.open("w") as out:
        for line in (recording / "events.jsonl").read_text().splitlines():
            value = json.loads(line)
            if value["schema"] == "gpu_sample/3":
                value["schema"] = "gpu_sample/2"
                for gpu in value["gpus"]:
                    gpu.pop("step_compute_s", None)
            out.write(json.dumps(value) + "\n")
    assert '"gpu_sample/2"' in old.read_text() and "step_compute_s" not in old.read_text()
    document = _replay_json(str(old), "--inventory", str(recording / "inventory.jsonl"))
    assert document["counts"]["dead_letters"] == 0
    assert document["actions"] == clean["actions"] and clean["actions"]


def test_removals_beyond_the_caps_are_reported_with_their_rule(tmp_path: Path) -> None:
    out = tmp_path / "wave"
    nodes = [f"fp-us-central1-h100-train-{i:03d}" for i in range(7)]
    injects = [arg for node in nodes for arg in ("--inject", f"G5@120:{node}")]
    run = _cli("simulate", "--to", "jsonl", "--out", str(out), "--duration", "420",
               "--gpu-nodes", "64", "--tpu-slices", "0", "--seed", "5", "--no-random-faults",
               "--quiet", *injects)
    assert run.returncode == 0, run.stderr
    document = _replay_json(str(out / "events.jsonl"), "--inventory", str(out / "inventory.jsonl"))
    _consistent(document)
    cordoned = {a["target"]["name"] for a in document["actions"] if a["kind"] == "cordon"}
    held = {w["target"].split("/")[1]: w for w in document["withheld"] if w["kind"] == "cordon"}
    assert cordoned and held, document["counts"]
    assert cordoned | {name for name, w in held.items() if not w["acted"]} == set(nodes)
    assert all(w["rule"] and not w["acted"] for w in held.values())
    # the withheld/1 records the worker would publish: each held cordon's rule, as the summary
    # has it last, with its numbers in words; a second replay says the same, ids included
    records = [r for r in document["withheld_records"] if r["kind"] == "cordon"]
    last = {r["target"]["name"]: r for r in records if not r["reason"].startswith("dropped")}
    assert {name: r["reason"] for name, r in last.items()} == {
        name: w["rule"] for name, w in held.items()
    }
    assert all(r["schema"] == "withheld/1" and r["detail"] and r["checks"] for r in records)
    assert len({(r["proposal_id"], r["reason"]) for r in records}) == len(records)
    human = _cli("replay", str(out / "events.jsonl"), "--inventory", str(out / "inventory.jsonl"),
                 "--out", str(tmp_path / "again"))
    assert f"Withheld proposals: {len(document['withheld'])}" in human.stdout
    assert "held by " in human.stdout and "Actions (dry run):" in human.stdout
    again = (tmp_path / "again" / "withheld_records.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in again] == document["withheld_records"]


def test_without_inventory_replay_says_where_budgets_come_from(recording: Path) -> None:
    run = _cli("replay", str(recording / "events.jsonl"))
    assert run.returncode == 0, run.stderr
    assert "budgets come from telemetry" in run.stderr
    assert "Dead letters: 0" in run.stdout


def test_a_bad_inventory_file_is_refused_with_its_lines(tmp_path: Path, recording: Path) -> None:
    rows = (recording / "inventory.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([rows[0], rows[1].replace('"capacity":8', '"capacity":"eight"')]))
    for command in (["inventory", "load", str(bad)],
                    ["replay", str(recording / "events.jsonl"), "--inventory", str(bad)]):
        run = _cli(*command)
        assert run.returncode == 2, run.stdout
        assert 'line 2: $.capacity: expected `int`, got `str` "eight"' in run.stderr, run.stderr


def test_policy_release_dry_run_prints_the_record() -> None:
    run = _cli("policy", "release", "--scope", "pool", "--name", "gke-a/h100", "--check",
               "node.down", "--by", "alice", "--reason", "switch replaced", "--dry-run")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout.splitlines()[-1])
    assert record["schema"] == "policy_release/1" and record["actor"] == "alice"
    assert (record["scope"], record["name"], record["check"]) == ("pool", "gke-a/h100", "node.down")
    assert "fleet.events.policy" in run.stdout and "key pool:gke-a/h100" in run.stdout
    wrong = _cli("policy", "release", "--scope", "pool", "--check", "node.down", "--dry-run")
    assert wrong.returncode == 2 and "needs --name" in wrong.stderr


def test_every_new_command_has_help() -> None:
    for command, words in [
        (["replay"], ["--inventory", "--json", "--out", "dry run", "dead letter"]),
        (["inventory", "load"], ["--dry-run", "fleet.inventory", "cluster/name"]),
        (["policy", "release"], ["--scope", "--check", "--by", "--reason", "fleet.events.policy"]),
        (["demo"], ["--no-inventory"]),
    ]:
        run = _cli(*command, "--help")
        text = " ".join(run.stdout.split())
        assert run.returncode == 0, run.stderr
        for word in words:
            assert word in text, (command, word)


def test_the_demo_enforces_its_inventory_unless_told_not_to(tmp_path: Path) -> None:
    small = ["--gpu-nodes", "4", "--tpu-slices", "1", "--hours", "0.1", "--no-report"]
    default = _cli("demo", "--out", str(tmp_path / "a"), *small)
    assert default.returncode == 0, default.stderr
    assert "no inventory" not in default.stderr
    old = _cli("demo", "--out", str(tmp_path / "b"), *small, "--no-inventory")
    assert old.returncode == 0, old.stderr
    assert "budgets come from telemetry" in old.stderr
