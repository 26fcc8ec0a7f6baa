"""A kernel-log stand-in: NVRM Xid lines appended to a file the way rsyslog writes kern.log.

Each line is `<RFC 3339 time, µs> <host> kernel: [<uptime>] <message>` (rsyslog's
high-precision file format; `journalctl -k -o short-iso-precise` looks the same), so the event
time survives to the millisecond. XID lines follow reference/data-shapes.md §2.1: the full
form `NVRM: Xid (PCI:0000:53:00): 13, pid=2280636, name=train.3, <text>`, `pid='<unknown>',
name=<unknown>` when the driver does not know, and for XID 79 the companion lines the driver
prints around it (`NVRM: GPU at PCI:…: GPU-<uuid>` before, `NVRM: GPU 0000:2b:00.0: GPU has
fallen off the bus.` after). Ordinary kernel chatter can be written too, so readers must skip it.

Rotation is logrotate's `create` mode: rename the file (kern.log → kern.log.1, shifting older
ones) and open a fresh one under the old name; `truncate()` is `copytruncate` without the copy.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TextIO

from pipeline.model import XidEvent


def format_xid_message(event: XidEvent) -> str:
    """The `NVRM: Xid …` message of an event (its own message when that already is one)."""
    if event.message.startswith("NVRM: Xid "):
        return event.message
    pid = str(event.pid) if event.pid is not None else "'<unknown>'"
    name = event.process if event.process else "<unknown>"
    text = f", {event.message}" if event.message else ""
    return f"NVRM: Xid (PCI:{event.pci_bus_id}): {event.xid}, pid={pid}, name={name}{text}"


def companion_messages(event: XidEvent) -> tuple[list[str], list[str]]:
    """Driver lines printed before and after the XID line (only XID 79 has them)."""
    if event.xid != 79:
        return [], []
    before = [f"NVRM: GPU at PCI:{event.pci_bus_id}: {event.uuid}"] if event.uuid else []
    return before, [f"NVRM: GPU {event.pci_bus_id}.0: GPU has fallen off the bus."]


def syslog_line(ts_ms: int, host: str, boot_ms: int, message: str) -> str:
    stamp = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).isoformat(timespec="microseconds")
    uptime = max(0, ts_ms - boot_ms) / 1000
    return f"{stamp} {host} kernel: [{uptime:12.6f}] {message}\n"


class KernelLogWriter:
    """Appends kernel-log lines to `path`, flushing each, and rotates like logrotate."""

    def __init__(self, path: Path, host: str, *, boot_ms: int = 0) -> None:
        self.path = path
        self.host = host
        self.boot_ms = boot_ms
        self.lines_written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out: TextIO = path.open("a", encoding="utf-8")

    def write_line(self, ts_ms: int, message: str) -> None:
        self._out.write(syslog_line(ts_ms, self.host, self.boot_ms, message))
        self._out.flush()
        self.lines_written += 1

    def write_xid(self, event: XidEvent) -> None:
        before, after = companion_messages(event)
        for message in [*before, format_xid_message(event), *after]:
            self.write_line(event.ts, message)

    def rotate(self, keep: int = 3) -> Path:
        """kern.log → kern.log.1 (→ .2 …, the oldest beyond `keep` deleted); reopen kern.log."""
        self._out.close()
        for n in range(keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                if n == keep:
                    older.unlink()
                else:
                    older.rename(self.path.with_name(f"{self.path.name}.{n + 1}"))
        rotated = self.path.with_name(f"{self.path.name}.1")
        self.path.rename(rotated)
        self._out = self.path.open("a", encoding="utf-8")
        return rotated

    def truncate(self) -> None:
        """copytruncate: the same file (same inode) cut to zero length."""
        self._out.flush()
        os.truncate(self.path, 0)

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> KernelLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
