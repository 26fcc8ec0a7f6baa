"""The listening side of the long-running processes: live counters on /metrics, /healthz and
/readyz, a port per kind of process, and a taken port refused by name."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config import DEFAULT_METRICS_PORTS, MetricsSettings, load_settings
from pipeline.errors import ListenError
from pipeline.selfmetrics import Readiness, serve_stats

LOCAL_ANY = MetricsSettings(host="127.0.0.1", port=0)


@dataclass
class Stats:
    records: int = 0
    dead_letters: int = 0
    label: str = "not a number"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape(port: int) -> dict[str, float]:
    status, text = _get(port, "/metrics")
    assert status == 200
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_counters_are_read_at_scrape_time() -> None:
    stats = Stats()
    port = serve_stats("lake_sink", stats, LOCAL_ANY, Readiness())
    assert _scrape(port)["fleetpulse_lake_sink_records_total"] == 0
    stats.records, stats.dead_letters = 41, 2
    samples = _scrape(port)
    assert samples["fleetpulse_lake_sink_records_total"] == 41
    assert samples["fleetpulse_lake_sink_dead_letters_total"] == 2
    assert samples["fleetpulse_lake_sink_start_time_seconds"] > 1.7e9
    assert not any("label" in name for name in samples)


@dataclass
class BlockingStats:
    errors: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})
    blocked: int = field(default=0, metadata={"gauge": True})
    tables: dict[str, int] = field(default_factory=dict)  # no label: not exported


def test_labelled_counters_and_gauges_come_from_field_metadata() -> None:
    stats = BlockingStats()
    port = serve_stats("lake_sink", stats, LOCAL_ANY, Readiness())
    stats.errors["disk_full"], stats.blocked, stats.tables["t"] = 3, 1, 9
    text = _get(port, "/metrics")[1]
    assert 'fleetpulse_lake_sink_errors_total{reason="disk_full"} 3.0' in text
    assert "# TYPE fleetpulse_lake_sink_blocked gauge" in text
    assert "fleetpulse_lake_sink_blocked 1.0" in text
    assert "tables" not in text
    stats.blocked = 0
    assert "fleetpulse_lake_sink_blocked 0.0" in _get(port, "/metrics")[1]


def test_a_failed_write_is_told_apart_by_its_errno() -> None:
    import errno
    import os

    from pipeline.errors import SinkError
    from pipeline.lake.sink import write_error_reason

    def failed(cause: OSError) -> SinkError:
        try:
            raise SinkError("lake: cannot write x") from cause
        except SinkError as exc:
            return exc

    assert write_error_reason(failed(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))) == (
        "disk_full")
    # Arrow's OSError carries the errno only in its text
    arrow = OSError("error writing bytes to file. Detail: [errno 28] No space left on device")
    assert write_error_reason(failed(arrow)) == "disk_full"
    assert write_error_reason(failed(OSError(errno.EDQUOT, "quota"))) == "quota"
    assert write_error_reason(failed(OSError(errno.EIO, "I/O error"))) == "io_error"


def test_healthz_answers_and_readyz_follows_the_process() -> None:
    readiness = Readiness()
    port = serve_stats("alerts", Stats(), LOCAL_ANY, readiness)
    assert _get(port, "/healthz") == (200, "ok\n")
    assert _get(port, "/readyz") == (503, "not ready: starting\n")
    readiness.check = lambda: (True, "joined group g")
    assert _get(port, "/readyz") == (200, "ready: joined group g\n")
    assert _get(port, "/nothing")[0] == 404


def test_a_taken_port_is_refused_naming_the_port_and_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        settings = MetricsSettings(host="127.0.0.1", port=busy)
        with pytest.raises(ListenError) as refused:
            serve_stats("alerts", Stats(records=3), settings, Readiness())
    message = str(refused.value)
    assert f"127.0.0.1:{busy}" in message and "already in use" in message
    assert "metrics.port" in message and "FLEETPULSE_METRICS__PORT" in message
    assert "\n" not in message


def test_a_bad_host_is_refused_naming_the_setting() -> None:
    with pytest.raises(ListenError, match=r"metrics.host 'no such host\.invalid'"):
        serve_stats("alerts", Stats(), MetricsSettings(host="no such host.invalid", port=0),
                    Readiness())


def test_each_kind_of_process_has_its_own_default_port() -> None:
    defaults = MetricsSettings()
    assert defaults.host == "0.0.0.0"  # all interfaces, as exporters do
    ports = {kind: defaults.port_for(kind) for kind in DEFAULT_METRICS_PORTS}
    assert ports["worker"] == 9108 and ports["lake_sink"] == 9109 and ports["alerts"] == 9110
    assert ports["ingest_prometheus"] == 9111 and ports["ingest_xid"] == 9114
    assert len(set(ports.values())) == len(ports)  # the README's setup on one host: no clash


def test_an_explicit_port_wins_for_every_kind_and_zero_means_any() -> None:
    settings = load_settings(
        environ={"FLEETPULSE_METRICS__PORT": "0", "FLEETPULSE_METRICS__HOST": "127.0.0.1"}
    )
    assert {settings.metrics.port_for(kind) for kind in DEFAULT_METRICS_PORTS} == {0}
    assert settings.metrics.host == "127.0.0.1"
    assert MetricsSettings(port=9200).port_for("worker") == 9200
