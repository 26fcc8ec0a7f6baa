"""Self-metrics of the sink, ingest and alerts processes: live counters on /metrics."""

from __future__ import annotations

import socket
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pipeline.selfmetrics import serve_stats


@dataclass
class Stats:
    records: int = 0
    dead_letters: int = 0
    label: str = "not a number"


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_counters_are_read_at_scrape_time() -> None:
    stats = Stats()
    port = serve_stats("lake_sink", stats, 0)
    assert _scrape(port)["fleetpulse_lake_sink_records_total"] == 0
    stats.records, stats.dead_letters = 41, 2
    samples = _scrape(port)
    assert samples["fleetpulse_lake_sink_records_total"] == 41
    assert samples["fleetpulse_lake_sink_dead_letters_total"] == 2
    assert samples["fleetpulse_lake_sink_start_time_seconds"] > 1.7e9
    assert not any("label" in name for name in samples)


def test_a_busy_port_falls_back_to_a_free_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        port = serve_stats("alerts", Stats(records=3), busy)
        assert port != busy
        assert _scrape(port)["fleetpulse_alerts_records_total"] == 3
