"""The XID source's journal (`journalctl -k -o json`) and /dev/kmsg inputs, with resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.config import SourcesSettings
from pipeline.model import XidEvent
from pipeline.sources.base import Batch
from pipeline.sources.xid_streams import JournalXidSource, KmsgXidSource, cursor_after

UUID = "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
REALTIME_US = 1_717_410_121_123_456  # 2024-06-03T10:22:01.123456Z


def _settings(tmp_path: Path, node: str = "") -> SourcesSettings:
    return SourcesSettings(
        cluster="c1", node=node, pool="a3", zone="us-central1-a", state_dir=str(tmp_path)
    )


def _record(seq: int, message: str | list[int], host: str = "gpu-node-7") -> str:
    cursor = f"s=4f1e0a;i={seq:x};b=9c2d;m={seq * 1000:x};t={REALTIME_US + seq:x};x=77"
    return json.dumps(
        {
            "__CURSOR": cursor,
            "__REALTIME_TIMESTAMP": str(REALTIME_US + seq * 1_000_000),
            "__MONOTONIC_TIMESTAMP": str(seq * 1000),
            "_HOSTNAME": host,
            "_TRANSPORT": "kernel",
            "SYSLOG_IDENTIFIER": "kernel",
            "PRIORITY": "3",
            "MESSAGE": message,
        }
    )


def _xids(batch: Batch) -> list[tuple[int, str, str | None, int, str]]:
    events = [e for e in batch.events if isinstance(e, XidEvent)]
    return [(e.xid, e.pci_bus_id, e.uuid, e.ts, e.node) for e in events]


def test_journal_records_resume_after_the_saved_cursor(tmp_path: Path) -> None:
    journal = tmp_path / "kernel.json"
    lines = [
        _record(1, f"NVRM: GPU at PCI:0000:3b:00: {UUID}"),
        _record(2, "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, DBE"),
        _record(3, "EXT4-fs (sda1): mounted filesystem"),
    ]
    journal.write_text("\n".join(lines) + "\n")
    source = JournalXidSource(_settings(tmp_path), path=str(journal))
    batch = source.poll()
    assert batch.bad == []
    assert _xids(batch) == [(48, "0000:3b:00", UUID, 1_717_410_123_123, "gpu-node-7")]
    assert source.poll().events  # not committed yet: the same records again
    source.commit(batch.position)
    assert source.poll().events == []
    source.close()
    # More records arrive; a restart resumes after the cursor, and the learned UUID is kept.
    with journal.open("a") as out:
        out.write(_record(4, "NVRM: Xid (PCI:3b:00): 79, GPU has fallen off the bus.") + "\n")
        out.write(_record(5, [78, 86, 82, 77, 58, 32, 88, 105, 100, 32, 40, 0xFF]) + "\n")
        out.write("this is not json\n")
        out.write(_record(6, "NVRM: GPU 0000:3c:00.0: GPU has fallen off the bus."))  # no \n
    source = JournalXidSource(_settings(tmp_path), path=str(journal))
    batch = source.poll()
    assert _xids(batch) == [(79, "0000:3b:00", UUID, 1_717_410_125_123, "gpu-node-7")]
    garbled, not_json = batch.bad
    assert garbled.raw.startswith(b"{") and b"__CURSOR" in garbled.raw  # the whole record
    assert "NVRM: Xid" in str(garbled.error) and not_json.raw == b"this is not json"
    source.commit(batch.position)
    with journal.open("a") as out:
        out.write("\n")  # the last record is complete now
    batch = source.poll()
    assert [(x, p) for x, p, *_ in _xids(batch)] == [(79, "0000:3c:00")]  # inferred
    source.commit(batch.position)
    source.close()
    # The file is written again from the start (journalctl re-run): the cursor still holds.
    journal.write_text("\n".join([*lines, _record(7, "NVRM: Xid (PCI:0000:3b:00): 13")]) + "\n")
    source = JournalXidSource(_settings(tmp_path, node="set-node"), path=str(journal))
    assert _xids(source.poll()) == [(13, "0000:3b:00", UUID, 1_717_410_128_123, "set-node")]
    source.close()


def test_journal_cursor_order() -> None:
    a = "s=4f1e0a;i=10;b=9c2d;m=1;t=100;x=1"
    assert cursor_after("s=4f1e0a;i=11;b=9c2d;m=2;t=99;x=2", a)  # same journal: by seqnum
    assert not cursor_after("s=4f1e0a;i=10;b=9c2d;m=1;t=100;x=1", a)
    assert cursor_after("s=ffff;i=1;b=9c2d;m=2;t=101;x=2", a)  # another journal: by time
    assert not cursor_after("s=ffff;i=99;b=9c2d;m=2;t=99;x=2", a)
    assert cursor_after("anything", "")


def test_journal_from_a_pipe_keeps_what_was_not_committed(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, (_record(1, "NVRM: Xid (PCI:0000:3b:00): 31") + "\n").encode())
    os.write(write_end, _record(2, "NVRM: Xid (PCI:0000:3b:00): 43")[:40].encode())
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        source = JournalXidSource(_settings(tmp_path), path="-")
        assert [x for x, *_ in _xids(source.poll())] == [31]
        batch = source.poll()  # nothing committed: the record is still there
        assert [x for x, *_ in _xids(batch)] == [31]
        source.commit(batch.position)
        os.write(write_end, _record(2, "NVRM: Xid (PCI:0000:3b:00): 43")[40:].encode() + b"\n")
        assert [x for x, *_ in _xids(source.poll())] == [43]
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
        os.close(write_end)


def test_kmsg_records_skip_user_space_and_resume_by_sequence(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000000,-;NVRM: GPU at PCI:0000:3b:00: " + UUID + "\n"
        " SUBSYSTEM=pci\n"
        " DEVICE=+pci:0000:3b:00.0\n"
        "3,101,6000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        "11,102,6500000,-;NVRM: Xid (PCI:0000:3b:00): 13, a user-space forgery\n"
        "3,103,7000000,c;NVRM: Xid (PCI:0000:3b:00): not a code\n"
    )
    clock = {"wall": 1_717_410_121.0, "mono": 100.0}  # booted at wall - mono

    def make() -> KmsgXidSource:
        return KmsgXidSource(
            _settings(tmp_path, node="n1"),
            path=str(kmsg),
            clock=lambda: clock["wall"],
            monotonic=lambda: clock["mono"],
            boot_id=lambda: "boot-a",
        )

    source = make()
    batch = source.poll()
    assert _xids(batch) == [(79, "0000:3b:00", UUID, 1_717_410_027_000, "n1")]
    [bad] = batch.bad
    assert bad.raw == b"3,103,7000000,c;NVRM: Xid (PCI:0000:3b:00): not a code"
    source.commit(batch.position)
    source.close()
    with kmsg.open("a") as out:
        out.write("4,104,8000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n")
    source = make()
    assert [(x, u) for x, _, u, *_ in _xids(source.poll())] == [(48, UUID)]
    source.close()


def test_ingest_help_lists_the_xid_inputs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "ingest", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    ).stdout
    for word in ("xid", "--once", "--journal-json", "--kmsg", "--log"):
        assert word in out


def test_ingest_xid_once_from_journal_json(tmp_path: Path) -> None:
    journal = tmp_path / "kernel.json"
    journal.write_text(_record(1, "NVRM: Xid (PCI:0000:3b:00): 119, pid='N/A', GSP") + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path),
        "FLEETPULSE_METRICS__PORT": "0",
    }
    command = [sys.executable, "-m", "pipeline.cli", "ingest", "xid", "--once", "--stdout"]
    out = subprocess.run(
        [*command, "--journal-json", str(journal)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    assert json.loads(line)["xid"] == 119
    assert (tmp_path / "xid-journal.json").exists()
