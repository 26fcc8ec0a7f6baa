"""The Grafana dashboard the chart ships (deploy/helm/fleetpulse/files/dashboard.json) against a
real Prometheus scraping a real worker and actuator (tests/integration/fleet_processes.py):
every panel's every query returns data, so a renamed metric or label cannot leave a panel
silently empty."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from tests.integration.fleet_processes import Scraped
from tests.kube_fixture import REPO

pytestmark = [pytest.mark.kafka, pytest.mark.prometheus]
DASHBOARD = REPO / "deploy" / "helm" / "fleetpulse" / "files" / "dashboard.json"


def _queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def test_the_dashboard_has_queries_for_every_pipeline_stage() -> None:
    titles = {title for title, _ in _queries()}
    assert len(_queries()) >= 11 and {"Consumer lag (records)", "Actuator outcomes (per hour)",
                                      "Dead letters (per s) by reason"} <= titles  # fmt: skip


def test_every_panel_query_returns_data(fleet_scraped: Scraped) -> None:
    # a few scrapes after the last work: a rate needs two samples
    deadline = time.monotonic() + 20
    while empty := _empty_panels(fleet_scraped):
        assert time.monotonic() < deadline, "panels without data:\n" + "\n".join(empty)
        time.sleep(0.5)


def _empty_panels(scraped: Scraped) -> list[str]:
    empty: list[str] = []
    for title, expr in _queries():
        values = [float(r["value"][1]) for r in scraped.query(expr)]
        if not values or all(math.isnan(v) for v in values):
            empty.append(f"{title}: {expr}")
    return empty


def test_panels_show_what_happened(fleet_scraped: Scraped) -> None:
    """Not only series, but the work done: unhealthy findings, cordons decided, the
    actuator's cordon, the dead letter."""

    def total(expr: str) -> float:
        return sum(float(r["value"][1]) for r in fleet_scraped.query(expr))

    found: dict[str, Any] = {
        "unhealthy findings": total('sum(fleetpulse_worker_findings_total{healthy="false"})'),
        "cordons decided": total('sum(fleetpulse_worker_actions_total{kind="cordon"})'),
        "actuator cordons": total(
            'sum(fleetpulse_actuate_kubernetes_outcomes_total{outcome="cordoned"})'),
        "dead letters": total("sum(fleetpulse_worker_dead_letters_total)"),
    }
    assert all(v >= 1 for v in found.values()), found
