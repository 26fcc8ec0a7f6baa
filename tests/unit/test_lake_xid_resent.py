"""The xid view counts each kernel-log line once when the source, restarted, sends lines again
coalesced into other records (sql/xid.sql): the same record again, a backlog's longer window
over the live ones, a line sent at once inside a record that counted it. Records of other text,
GPUs or processes are all counted. On both lake backends (local Parquet, Iceberg on s3proxy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import LakeSettings
from pipeline.lake.query import Lake
from pipeline.model import XidEvent
from tests.iceberg_fixture import BACKENDS, fixture_writer, iceberg_settings

T0 = 1_767_225_600_000
TEXT = "NVRM: Xid (PCI:0000:53:00): 13, pid=7, name=python, Graphics Exception"


def _xid(ts: int, count: int = 1, last: int | None = None, text: str = TEXT,
         pid: int = 7) -> XidEvent:
    return XidEvent(
        ts=ts, cluster="c1", node="gpu-node-1", pool="a3", zone="z1", pci_bus_id="0000:53:00",
        xid=13, pid=pid, process="python", message=text, source="kernel_log", count=count,
        last_ts=last,
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _lines(tmp_path: Path, records: list[XidEvent], backend: str = "local") -> int:
    settings = iceberg_settings(tmp_path) if backend == "iceberg" else LakeSettings()
    writer = fixture_writer(tmp_path, settings)
    for offset, record in enumerate(records):
        writer.add("xid", record, ("t.events.xid", 0, offset))
    writer.checkpoint()
    with Lake(tmp_path, settings) as lake:
        total = lake.sql("SELECT sum(lines) FROM xid").rows[0][0]
    return int(total)


def test_a_storm_sent_again_after_a_restart_counts_its_lines_once(tmp_path: Path, backend: str) -> None:
    # live: the first line at once, then two windows the wall clock closed (1 + 500 + 500)
    live = [_xid(T0), _xid(T0 + 10, 500, T0 + 9_990), _xid(T0 + 10_000, 500, T0 + 19_990)]
    # restarted before the checkpoint moved past them: the first line again, and the backlog,
    # read at once, in one window over both
    again = [_xid(T0), _xid(T0 + 10, 1000, T0 + 19_990)]
    assert _lines(tmp_path, [*live, *again], backend) == 1001


def test_a_line_sent_at_once_again_inside_the_record_that_counted_it(tmp_path: Path, backend: str) -> None:
    sent = _xid(T0 + 10, 500, T0 + 9_990)
    records = [_xid(T0), sent, _xid(T0 + 10), _xid(T0 + 20, 499, T0 + 9_990)]
    assert _lines(tmp_path, records, backend) == 501


def test_other_text_and_other_processes_are_counted(tmp_path: Path, backend: str) -> None:
    storm = _xid(T0, 500, T0 + 9_990)
    other = [_xid(T0 + 100, text=TEXT + " ESR 0x1"), _xid(T0 + 200, pid=8)]
    assert _lines(tmp_path, [storm, *other], backend) == 502
