"""NVIDIA XID lines from the kernel log → XidEvent, following the file across rotations.

The parser reads one line (reference/data-shapes.md §2.1): an optional syslog prefix (RFC 3339
as rsyslog and `journalctl -o short-iso-precise` write it, or classic `Nov 29 14:00:04`), an
optional `[uptime]`, then `NVRM: Xid (PCI:0000:53:00): <code>[, pid=…][, name=…][, text]`, or
the old driver form without `PCI:`. PCI ids are normalised (codec.normalize_pci). The line
`NVRM: GPU at PCI:…: GPU-<uuid>` teaches the PCI → UUID map; other kernel lines are skipped,
and an NVRM Xid line that does not parse becomes a dead letter.

The tailer keeps the open file of every log it still reads: after a rename (logrotate `create`)
the old file is drained for `rotate_wait_s` while the new one is read from its start; a file
that shrank (`copytruncate`) is read again from 0. Position = [(inode, offset), …] of the
files being read, so a restart finds a rotated file again by its inode.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pipeline.codec import normalize_pci
from pipeline.config import SourcesSettings
from pipeline.errors import DecodeError
from pipeline.model import Event, XidEvent
from pipeline.sources.base import (
    BadRecord,
    Batch,
    Parsed,
    load_checkpoint,
    save_checkpoint,
    validated,
)

_ISO = r"(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
_CLASSIC = r"(?P<classic>[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2})"
_PREFIX = re.compile(rf"^(?:(?:{_ISO}|{_CLASSIC}) +\S+ +kernel: *)?(?:\[ *\d+\.\d+\] *)?")
_XID = re.compile(
    r"^NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'[^']*'|[^,]*))?(?:, name=(?P<name>[^,]*))?(?:,? ?(?P<text>.*))?$"
)
_GPU_AT = re.compile(r"^NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_MAX_MESSAGE = 4096
_MAX_NAME = 256


@dataclass(frozen=True)
class Identity:
    cluster: str
    node: str
    pool: str
    zone: str


@dataclass(frozen=True)
class GpuInfo:
    index: int | None
    uuid: str | None


# --- the pure parser ------------------------------------------------------------------------


def parse_line(
    line: str,
    identity: Identity,
    *,
    fallback_ts_ms: int,
    gpus: Mapping[str, GpuInfo] | None = None,
) -> XidEvent | tuple[str, str] | None:
    """One kernel-log line → an XidEvent, a (pci, uuid) announcement, or None (not ours).

    Raises DecodeError for a line that says `NVRM: Xid` but is not a well-formed XID line.
    """
    line = line.rstrip("\r\n")
    prefix = _PREFIX.match(line)
    assert prefix is not None  # every part of the prefix is optional
    message = line[prefix.end() :]
    announced = _GPU_AT.match(message)
    if announced:
        return normalize_pci(announced["pci"]), announced["uuid"]
    if not message.startswith("NVRM: Xid"):
        return None
    match = _XID.match(message)
    if match is None:
        raise DecodeError(
            field="line", expected="NVRM: Xid (PCI:dddd:bb:dd): <code>, …", got=repr(line[:200])
        )
    pci = normalize_pci(match["pci"])
    gpu = (gpus or {}).get(pci, GpuInfo(None, None))
    event = XidEvent(
        ts=_timestamp(prefix, fallback_ts_ms),
        cluster=identity.cluster,
        node=identity.node,
        pool=identity.pool,
        zone=identity.zone,
        pci_bus_id=pci,
        gpu_index=gpu.index,
        uuid=gpu.uuid,
        xid=int(match["xid"]),
        pid=_pid(match["pid"]),
        process=_name(match["name"]),
        message=message[:_MAX_MESSAGE],
        source="kernel_log",
    )
    return validated(event)


def _timestamp(prefix: re.Match[str], fallback_ts_ms: int) -> int:
    if prefix["iso"]:
        stamp = dt.datetime.fromisoformat(prefix["iso"].replace(" ", "T", 1))
    elif prefix["classic"]:
        # Classic syslog has no year and no zone: the reader's year, UTC (a December line read
        # in January lands a year late; use the RFC 3339 format where that matters).
        year = dt.datetime.fromtimestamp(fallback_ts_ms / 1000, tz=dt.UTC).year
        stamp = dt.datetime.strptime(f"{year} {prefix['classic']}", "%Y %b %d %H:%M:%S")
    else:
        return fallback_ts_ms  # dmesg without wall-clock time: when we read it
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return round(stamp.timestamp() * 1000)


def _pid(text: str | None) -> int | None:
    text = (text or "").strip().strip("'")
    return int(text) if text.isdigit() else None  # '<unknown>', 'N/A'


def _name(text: str | None) -> str | None:
    text = (text or "").strip()
    return text[:_MAX_NAME] if text and text != "<unknown>" else None


def parse_lines(
    lines: list[str],
    identity: Identity,
    *,
    fallback_ts_ms: int,
    gpus: dict[str, GpuInfo],
) -> Parsed:
    """Lines in file order; `gpus` learns PCI → UUID from announcements as they go by."""
    parsed = Parsed()
    for line in lines:
        try:
            result = parse_line(line, identity, fallback_ts_ms=fallback_ts_ms, gpus=gpus)
        except (DecodeError, ValueError, msgspec.ValidationError) as exc:
            error = exc if isinstance(exc, DecodeError) else _invalid(line, exc)
            parsed.bad.append(BadRecord(line.encode(), error))
            continue
        if isinstance(result, tuple):
            pci, uuid = result
            gpus[pci] = GpuInfo(gpus.get(pci, GpuInfo(None, None)).index, uuid)
        elif result is not None:
            parsed.events.append(result)
    return parsed


def _invalid(line: str, exc: Exception) -> DecodeError:
    return DecodeError(field="line", expected="an XID line valid for xid_event/1", got=str(exc))


# --- the tailer -----------------------------------------------------------------------------


class FilePosition(msgspec.Struct, frozen=True, array_like=True):
    inode: int
    offset: int
    tail: str = ""  # digest of the bytes just before `offset`: tells a rewritten file


class XidPosition(msgspec.Struct, frozen=True):
    files: list[FilePosition]  # oldest first; the last is the file under the log's name
    uuids: dict[str, str] = {}  # PCI → UUID learned from `NVRM: GPU at` lines


@dataclass
class _Tracked:
    fd: int
    inode: int
    offset: int
    tail: str = ""
    rotated_at: float | None = None  # wall time we saw it renamed away


_TAIL_BYTES = 64


def _tail_digest(fd: int, offset: int) -> str:
    start = max(0, offset - _TAIL_BYTES)
    return hashlib.blake2b(os.pread(fd, offset - start, start), digest_size=8).hexdigest()


class XidSource:
    """Tails the kernel log; `poll()` returns the XID events of complete new lines."""

    name = "xid"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        path: Path | None = None,
        checkpoint: Path | None = None,
        gpus: Mapping[str, GpuInfo] | None = None,
        clock: Callable[[], float] = time.time,
        rotate_wait_s: float = 5.0,
        max_bytes: int = 1 << 20,
    ) -> None:
        self.path = path or Path(settings.xid_log_path)
        self._identity = Identity(
            settings.cluster, settings.node or socket.gethostname(), settings.pool, settings.zone
        )
        self._checkpoint = checkpoint or Path(settings.state_dir) / "xid.json"
        self._clock = clock
        self._rotate_wait = rotate_wait_s
        self._max_bytes = max_bytes
        self._known = dict(gpus or {})
        self._tracked: list[_Tracked] = []
        saved = load_checkpoint(self._checkpoint, XidPosition)
        self._uuids: dict[str, str] = dict(saved.uuids) if saved else {}
        if saved:
            self._reopen(saved.files)
        # Every file we read was rotated away and deleted while we were stopped.
        self._lost_track = bool(saved and saved.files) and not self._tracked

    # -- files ------------------------------------------------------------------------------

    def _reopen(self, files: list[FilePosition]) -> None:
        """After a restart: find each saved file by inode under the log's name or a rotation."""
        by_inode: dict[int, Path] = {}
        for candidate in [self.path, *sorted(self.path.parent.glob(f"{self.path.name}.*"))]:
            try:
                by_inode.setdefault(candidate.stat().st_ino, candidate)
            except FileNotFoundError:
                continue
        for saved in files:
            found = by_inode.get(saved.inode)
            if found is not None:
                fd = os.open(found, os.O_RDONLY)
                self._tracked.append(_Tracked(fd, saved.inode, saved.offset, saved.tail))

    def _follow_name(self) -> None:
        """Start reading a new file under the log's name, and any rotated in between."""
        try:
            inode = self.path.stat().st_ino
        except FileNotFoundError:
            return  # between rename and create: try again next poll
        if self._tracked and self._tracked[-1].inode == inode:
            return
        now = self._clock()
        for tracked in self._tracked:
            tracked.rotated_at = tracked.rotated_at or now
        known = {tracked.inode for tracked in self._tracked}
        if self._tracked:
            missed = self._rotated_after(self._tracked[-1].inode)
        else:
            missed = self._rotated_after(None) if self._lost_track else []
        self._lost_track = False
        for path in [*missed, self.path]:
            fd = os.open(path, os.O_RDONLY)
            inode = os.fstat(fd).st_ino
            if inode in known:
                os.close(fd)
                continue
            self._tracked.append(
                _Tracked(fd, inode, 0, rotated_at=None if path == self.path else now)
            )

    def _rotated_after(self, inode: int | None) -> list[Path]:
        """Files rotated away after the one with `inode` (kern.log.N … kern.log.1), oldest
        first: with two rotations between polls (or while stopped) the middle file is there.
        When that file is gone it was the oldest, deleted by rotation: all of them are newer."""
        numbered = []
        for path in self.path.parent.glob(f"{self.path.name}.*"):
            suffix = path.name[len(self.path.name) + 1 :]
            if suffix.isdigit():
                try:
                    numbered.append((int(suffix), path.stat().st_ino, path))
                except FileNotFoundError:
                    continue
        numbered.sort(reverse=True)
        inodes = [found for _, found, _ in numbered]
        after = inodes.index(inode) + 1 if inode in inodes else 0
        return [path for _, _, path in numbered[after:]]

    def _read(self, tracked: _Tracked, budget: int) -> tuple[list[str], int, int]:
        """Complete lines from the tracked offset, the offset after them, the bytes read."""
        size = os.fstat(tracked.fd).st_size
        offset = tracked.offset
        if size < offset or (offset and _tail_digest(tracked.fd, offset) != tracked.tail):
            offset = 0  # shrank or rewritten: copytruncate
        data = os.pread(tracked.fd, max(0, min(budget, size - offset)), offset)
        end = data.rfind(b"\n") + 1
        lines = data[:end].decode("utf-8", errors="replace").splitlines(keepends=True)
        return lines, offset + end, end

    def _drop_drained(self) -> None:
        now = self._clock()
        keep = []
        for tracked in self._tracked:
            done = tracked.rotated_at is not None and now - tracked.rotated_at > self._rotate_wait
            drained = os.fstat(tracked.fd).st_size <= tracked.offset
            if done and drained:
                os.close(tracked.fd)
            else:
                keep.append(tracked)
        self._tracked = keep

    # -- Source -----------------------------------------------------------------------------

    def poll(self) -> Batch:
        self._drop_drained()
        self._follow_name()
        gpus = {**{p: GpuInfo(None, u) for p, u in self._uuids.items()}, **self._known}
        parsed = Parsed()
        positions = []
        budget = self._max_bytes
        now_ms = int(self._clock() * 1000)
        for tracked in self._tracked:
            lines, offset, consumed = self._read(tracked, budget)
            budget -= consumed
            parsed.extend(parse_lines(lines, self._identity, fallback_ts_ms=now_ms, gpus=gpus))
            tail = _tail_digest(tracked.fd, offset) if offset else ""
            positions.append(FilePosition(tracked.inode, offset, tail))
        uuids = {pci: info.uuid for pci, info in gpus.items() if info.uuid}
        events: list[Event] = list(parsed.events)
        return Batch(events, parsed.bad, XidPosition(positions, uuids))

    def commit(self, position: msgspec.Struct | None) -> None:
        if not isinstance(position, XidPosition):
            return
        save_checkpoint(self._checkpoint, position)
        saved = {file.inode: file for file in position.files}
        for tracked in self._tracked:
            if tracked.inode in saved:
                tracked.offset, tracked.tail = (
                    saved[tracked.inode].offset,
                    saved[tracked.inode].tail,
                )
        self._uuids = dict(position.uuids)

    def close(self) -> None:
        for tracked in self._tracked:
            os.close(tracked.fd)
        self._tracked = []
