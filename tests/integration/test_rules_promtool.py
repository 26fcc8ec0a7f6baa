"""The chart's PrometheusRule, rendered by helm, checked by `promtool check rules` and unit-tested
by `promtool test rules` (deploy/prometheus/fleetpulse-rules.test.yml), and every metric the
rules and their tests name is one a running worker or actuator really exports (scraped from
the processes of tests/integration/fleet_processes.py), with the labels the tests give it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.fleet_processes import Scraped
from tests.integration.test_kubernetes_helm import OPERATOR, render
from tests.kube_fixture import REPO

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
TESTS = REPO / "deploy" / "prometheus" / "fleetpulse-rules.test.yml"
# series Prometheus makes itself, not a FleetPulse process
BUILT_IN = {"up"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool is missing: apt-get install -y prometheus (deploy/system-deps.sh)")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def rules_dir(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's rule groups as a rules file, beside a copy of the unit tests."""
    (rule,) = [d for d in render(helm, "fleetpulse", "monitoring", *OPERATOR)
               if d["kind"] == "PrometheusRule"]  # fmt: skip
    folder = tmp_path_factory.mktemp("rules")
    (folder / "fleetpulse-rules.yml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    shutil.copy(TESTS, folder / TESTS.name)
    return folder


def test_promtool_checks_the_rules(rules_dir: Path) -> None:
    done = _promtool("check", "rules", "fleetpulse-rules.yml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert(rules_dir: Path) -> None:
    done = _promtool("test", "rules", TESTS.name, cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {case["alertname"] for test in _unit_tests()["tests"]
              for case in test.get("alert_rule_test", [])}  # fmt: skip
    assert tested == {rule["alert"] for rule in _rules(rules_dir)}


def test_the_unit_tests_can_fail(rules_dir: Path) -> None:
    """A rule that no longer does what its test says is caught: the lag threshold raised."""
    rules = rules_dir / "fleetpulse-rules.yml"
    broken = rules_dir / "broken"
    broken.mkdir(exist_ok=True)
    (broken / "fleetpulse-rules.yml").write_text(rules.read_text().replace("> 10000", "> 20000"))
    shutil.copy(TESTS, broken / TESTS.name)
    done = _promtool("test", "rules", TESTS.name, cwd=broken)
    assert done.returncode != 0 and "FleetPulseConsumerLag" in done.stderr, done.stdout


def test_every_metric_the_rules_name_is_exported(
    rules_dir: Path,
    fleet_scraped: Scraped,
) -> None:
    exported = _families(fleet_scraped.metrics("worker")) | _families(
        fleet_scraped.metrics("actuator"))
    named = {name for rule in _rules(rules_dir) for name in _metric_names(rule["expr"])}
    assert named - BUILT_IN - set(exported) == set(), sorted(set(exported))
    # and the unit tests' series: names the processes export, with labels they really carry
    for test in _unit_tests()["tests"]:
        for series in test["input_series"]:
            name, labels = _series(series["series"])
            if name in BUILT_IN:
                continue
            assert name in exported, name
            carried = exported[name]
            assert not carried or set(labels) <= carried, (name, labels, carried)


def _rules(rules_dir: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((rules_dir / "fleetpulse-rules.yml").read_text())
    return [rule for group in spec["groups"] for rule in group["rules"]]


def _unit_tests() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(TESTS.read_text())
    return loaded


def _metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not functions, labels or keywords)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}|\bby\s*\([^)]*\)|\[[^\]]*\]", " ", without_strings)
    return {n for n in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_labels)
            if n not in {"sum", "by", "and", "or", "unless", "on", "ignoring"}
            and not n.isdigit()}  # fmt: skip


def _families(text: str) -> dict[str, set[str]]:
    """Every sample name of a /metrics page (families without samples by their HELP line)
    with the label names its samples carry."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            found.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest)) if rest else set()
            found.setdefault(name.split()[0], set()).update(labels - {"le", "quantile"})
    return found


def _series(selector: str) -> tuple[str, set[str]]:
    name, _, rest = selector.partition("{")
    return name, set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest))
