"""NVIDIA XID lines from the kernel log → XidEvent, following the file across rotations.

The parser reads one line (reference/data-shapes.md §2.1) whatever precedes its `NVRM:`
message: syslog (RFC 3164/5424, rsyslog RFC 3339), journalctl short/short-iso/short-precise/
short-unix in any locale, `dmesg` plain, `-T`/`--ctime`, `--decode --time-format iso` (facility
and level columns, comma decimals), a bare `kernel: [uptime]`, a /dev/kmsg record header,
indentation. The message is `NVRM: Xid (PCI:0000:53:00): <code>[, pid=…][, name=…][, text]`
with the bus id in every form drivers printed (PCI:dddd:bb:dd[.f], PCI:bb:dd, no `PCI:`); the
text after the code (NVLink5 sub-codes of Xid 144–150 included) stays in `message`. PCI ids are
normalised (codec.normalize_pci). `NVRM: GPU at [PCI:]…: GPU-<uuid>` teaches the PCI → UUID
map; `NVRM: GPU …: GPU has fallen off the bus.` with no Xid 79 before it is an inferred Xid 79;
other kernel lines are skipped, and a line that mentions NVRM and Xid but does not parse becomes
a dead letter. Which time an event gets: see the note on _ISO below.

The tailer keeps the open file of every log it still reads: after a rename (logrotate `create`)
the old file is drained for `rotate_wait_s` while the new one is read from its start; a file
that shrank (`copytruncate`) is read again from 0. Position = [(inode, offset), …] of the
files being read, so a restart finds a rotated file again by its inode.

Storms (a node can print hundreds of thousands of lines of one Xid): the Coalescer sends a GPU's
first line of an Xid at once and its repeats within `sources.xid_coalesce_s` as one record with
their count (xid_event/2 `count`, `last_ts`). What it holds goes out when its window ends (at the
first poll after), at the end of `--once`, and at a stop (`drain`); the saved position stays
before the first line held, so a crash loses none of them (and sends the lines after it again).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import socket
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import SourcesSettings
from pipeline.detect.xid import what_rules_read
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
from pipeline.wire.codec import normalize_pci

# Where the time of a line comes from: a date the line itself carries when it carries one we can
# read without guessing (ISO 8601/RFC 3339 anywhere before the message, with `.` or `,`
# decimals; `dmesg -T` / `--ctime` `[Mon Jun  3 10:22:01 2024]`; English classic syslog
# `Jun  3 10:22:01[.123456]`; journalctl short-unix `1717410121.123456`); otherwise the
# fallback the reader gives (the journal's __REALTIME_TIMESTAMP, or the time of reading). A date
# in another language (`juin 03`, `Mär 03`, `июн 03`) is not parsed: the fallback is used. Dates
# without a zone are read as UTC (journalctl short-full naming a zone other than UTC: the
# fallback).
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = "(?:" + "|".join(_MONTHS) + ")"
_ISO = re.compile(
    r"(?<![\d.])(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?)(?![\d:])(?: (?P<zone>[A-Z]{3,5})\b)?"
)
_HAS_OFFSET = re.compile(r"(?:Z|[+-]\d{2}:?\d{2})$")
_CTIME = re.compile(
    rf"\[\S+ +(?P<month>{_MONTH}) +(?P<day>\d{{1,2}}) (?P<time>\d{{2}}:\d{{2}}:\d{{2}}) "
    r"(?P<year>\d{4})\]"
)
_CLASSIC = re.compile(
    rf"^(?:<\d{{1,3}}>)?(?P<month>{_MONTH}) +(?P<day>\d{{1,2}}) "
    r"(?P<time>\d{2}:\d{2}:\d{2})(?P<frac>\.\d+)? "
)
_UNIX = re.compile(r"^(?P<unix>\d{9,11}\.\d+) ")
# The message starts at `NVRM:`, wherever that is in the line (after any prefix: date, host,
# `kernel:`, `[uptime]`, dmesg facility/level columns, a /dev/kmsg `6,1234,5678901,-;` header,
# indentation).
_NVRM = re.compile(r"NVRM:")
_MENTIONS_XID = re.compile(r"\bXid\b")
_MENTIONS_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)
# The bus id in every form drivers printed: PCI:0000:3b:00, PCI:0000:3b:00.0, PCI:3b:00,
# 0000:3b:00 (old drivers, no `PCI:`), 00000000:3b:00.0; codec.normalize_pci checks it.
_BUS = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{0,8}:?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID = re.compile(
    rf"^NVRM: +Xid +\({_BUS}\): +(?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'[^']*'|[^,]*))?(?:, name=(?P<name>[^,]*))?(?:,? ?(?P<text>.*))?$"
)
# `NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>` and the older `NVRM: GPU at 0000:3b:00: GPU-<uuid>`.
_GPU_AT = re.compile(rf"^NVRM: +GPU at {_BUS}:? +(?P<uuid>GPU-[0-9a-fA-F-]+)")
# `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` — printed with or without an Xid 79.
_FALLEN = re.compile(rf"^NVRM: +GPU(?: at)? {_BUS}:? +GPU has fallen off the bus")
FALLEN_OFF_BUS_XID = 79
INFERRED_NOTE = " [Xid 79 inferred: the driver printed no Xid line]"
_REAL_79_WINDOW_MS = 180_000  # a fallen-off-bus line this close to an Xid 79 is the same fault
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


@dataclass(frozen=True)
class Inferred:
    """An Xid 79 the driver did not print: read from `GPU has fallen off the bus`."""

    event: XidEvent


# --- the pure parser ------------------------------------------------------------------------


def parse_line(
    line: str,
    identity: Identity,
    *,
    fallback_ts_ms: int,
    gpus: Mapping[str, GpuInfo] | None = None,
) -> XidEvent | Inferred | tuple[str, str] | None:
    """One kernel-log line → an XidEvent, an inferred Xid 79, a (pci, uuid) announcement, or
    None (not ours).

    Raises DecodeError (or ValueError) for a line that mentions `NVRM` and `Xid` (or a GPU
    fallen off the bus) but is not a well-formed line of its kind: the caller dead-letters it
    with the line.
    """
    line = line.rstrip("\r\n")
    found = _NVRM.search(line)
    if found is None:
        return None
    prefix, message = line[: found.start()], line[found.start() :]
    announced = _GPU_AT.match(message)
    if announced:
        return normalize_pci(announced["pci"]), announced["uuid"]
    fallen = _FALLEN.match(message)
    if fallen and not _MENTIONS_XID.search(message):
        pci = normalize_pci(fallen["pci"])
        ts = _timestamp(prefix, fallback_ts_ms)
        note = message[: _MAX_MESSAGE - len(INFERRED_NOTE)] + INFERRED_NOTE
        return Inferred(_event(identity, pci, gpus, ts, FALLEN_OFF_BUS_XID, None, None, note))
    if not _MENTIONS_XID.search(message):
        if _MENTIONS_FALLEN.search(message):
            # a GPU lost from the bus whose line we cannot read is still a lost GPU: say so
            raise DecodeError(
                field="line",
                expected="NVRM: GPU <bus id>: GPU has fallen off the bus",
                got=repr(line[:200]),
            )
        return None
    match = _XID.match(message)
    if match is None:
        raise DecodeError(
            field="line", expected="NVRM: Xid (PCI:dddd:bb:dd): <code>, …", got=repr(line[:200])
        )
    pci = normalize_pci(match["pci"])
    ts = _timestamp(prefix, fallback_ts_ms)
    pid, name = _pid(match["pid"]), _name(match["name"])
    return _event(identity, pci, gpus, ts, int(match["xid"]), pid, name, message[:_MAX_MESSAGE])


def _event(
    identity: Identity,
    pci: str,
    gpus: Mapping[str, GpuInfo] | None,
    ts: int,
    xid: int,
    pid: int | None,
    process: str | None,
    message: str,
) -> XidEvent:
    gpu = (gpus or {}).get(pci, GpuInfo(None, None))
    event = XidEvent(
        ts=ts,
        cluster=identity.cluster,
        node=identity.node,
        pool=identity.pool,
        zone=identity.zone,
        pci_bus_id=pci,
        gpu_index=gpu.index,
        uuid=gpu.uuid,
        xid=xid,
        pid=pid,
        process=process,
        message=message,
        source="kernel_log",
    )
    return validated(event)


def _timestamp(prefix: str, fallback_ts_ms: int) -> int:
    """The time the line's prefix carries, or the fallback (see the note on _ISO)."""
    stamp: dt.datetime | None = None
    if (iso := _ISO.search(prefix)) is not None:
        if iso["zone"] not in (None, "UTC", "GMT") and not _HAS_OFFSET.search(iso["iso"]):
            return fallback_ts_ms  # journalctl short-full in a local zone named, not given
        stamp = dt.datetime.fromisoformat(iso["iso"].replace(",", ".").replace(" ", "T", 1))
    elif (ctime := _CTIME.search(prefix)) is not None:
        stamp = _month_date(ctime["year"], ctime["month"], ctime["day"], ctime["time"])
    elif (classic := _CLASSIC.match(prefix)) is not None:
        # Classic syslog has no year: the reader's (a December line read in January lands a
        # year late; use the RFC 3339 format where that matters).
        year = str(dt.datetime.fromtimestamp(fallback_ts_ms / 1000, tz=dt.UTC).year)
        stamp = _month_date(year, classic["month"], classic["day"], classic["time"])
        if classic["frac"]:
            stamp += dt.timedelta(seconds=float(classic["frac"]))
    elif (unix := _UNIX.match(prefix)) is not None:
        return round(float(unix["unix"]) * 1000)
    if stamp is None:
        return fallback_ts_ms  # dmesg uptime, kmsg, a date in another language: the fallback
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return round(stamp.timestamp() * 1000)


def _month_date(year: str, month: str, day: str, clock: str) -> dt.datetime:
    hour, minute, second = (int(part) for part in clock.split(":"))
    return dt.datetime(int(year), _MONTHS.index(month) + 1, int(day), hour, minute, second)


def _pid(text: str | None) -> int | None:
    text = (text or "").strip().strip("'")
    return int(text) if text.isdigit() else None  # '<unknown>', 'N/A'


def _name(text: str | None) -> str | None:
    text = (text or "").strip()
    return text[:_MAX_NAME] if text and text != "<unknown>" else None


@dataclass
class LineReader:
    """The state lines teach the lines after them: PCI → UUID from `NVRM: GPU at` lines, and
    when each GPU last printed an Xid 79 (so that the `fallen off the bus` line that follows it
    is not a second event)."""

    identity: Identity
    gpus: dict[str, GpuInfo]
    last_79: dict[str, int] = field(default_factory=dict)

    def feed(self, line: str, fallback_ts_ms: int, into: Parsed) -> None:
        try:
            result = parse_line(
                line, self.identity, fallback_ts_ms=fallback_ts_ms, gpus=self.gpus
            )
        except (DecodeError, ValueError, msgspec.ValidationError) as exc:
            error = exc if isinstance(exc, DecodeError) else _invalid(line, exc)
            into.bad.append(BadRecord(line.encode(), error))
            return
        if isinstance(result, tuple):
            pci, uuid = result
            self.gpus[pci] = GpuInfo(self.gpus.get(pci, GpuInfo(None, None)).index, uuid)
        elif isinstance(result, Inferred):
            event = result.event
            last = self.last_79.get(event.pci_bus_id)
            if last is None or abs(event.ts - last) > _REAL_79_WINDOW_MS:
                into.events.append(event)
        elif result is not None:
            if result.xid == FALLEN_OFF_BUS_XID:
                self.last_79[result.pci_bus_id] = result.ts
            into.events.append(result)


def parse_lines(
    lines: list[str],
    identity: Identity,
    *,
    fallback_ts_ms: int,
    gpus: dict[str, GpuInfo],
) -> Parsed:
    """Lines in file order; `gpus` learns PCI → UUID from announcements as they go by."""
    parsed = Parsed()
    reader = LineReader(identity, gpus)
    for line in lines:
        reader.feed(line, fallback_ts_ms, parsed)
    return parsed


def _invalid(line: str, exc: Exception) -> DecodeError:
    return DecodeError(field="line", expected="an XID line valid for xid_event/2", got=str(exc))


# --- storms: repeats coalesced ---------------------------------------------------------------


@dataclass
class _Window:
    """One GPU/Xid/process's window: the repeats held since it opened."""

    ends_at: float  # wall time it closes: what it holds goes out then
    lo: int  # event times of the lines in it, the opening line included
    hi: int
    held: XidEvent | None = None  # the first repeat held (the record's fields)
    count: int = 0
    first_ts: int = 0
    last_ts: int = 0
    uuid: str | None = None
    mark: Any = None  # where a re-read from the checkpoint takes in the first repeat

    def record(self) -> XidEvent | None:
        if self.held is None:
            return None
        last = self.last_ts if self.count > 1 or self.last_ts != self.first_ts else None
        return replace_event(
            self.held, ts=self.first_ts, last_ts=last, count=self.count, uuid=self.uuid
        )


def replace_event(event: XidEvent, **changes: object) -> XidEvent:
    return msgspec.structs.replace(event, **changes)


class Coalescer:
    """Storms at the source: the first line of a GPU's Xid (per process, and per what the rules
    read in its text: pipeline.detect.xid.what_rules_read) goes out at once and opens a window
    of `window_s`; the repeats that arrive in it, no more than `window_s` of event time apart
    from its other lines, are held and go out as ONE record with their `count`, first and last
    times when it ends (`due`, on the wall clock) or when a repeat falls outside it. A line after
    a window that held repeats is the storm going on: it opens the next window held, not sent.
    So a storm is about one record per window, a lone line is sent as it was, and every line is
    in some record's count.

    Bounded: at most `max_keys` windows; the oldest goes out early to make room. `marks()`
    names where the lines still held were read, so the source commits no offset past them.
    Pure (the caller passes the wall clock); `copy()` lets a poll work on a copy that its
    commit installs, so a batch the broker refused is read again into the same state.
    """

    def __init__(self, window_s: float, max_keys: int = 4096) -> None:
        self.window_s = window_s
        self._window_ms = round(window_s * 1000)
        self._max_keys = max_keys
        self._windows: dict[Hashable, _Window] = {}

    def copy(self) -> Coalescer:
        other = Coalescer(self.window_s, self._max_keys)
        other._windows = {key: replace(window) for key, window in self._windows.items()}
        return other

    def add(self, event: XidEvent, now: float, mark: Any, out: list[Event]) -> None:
        """One parsed line (read at `mark`): sent into `out`, or held."""
        if self._window_ms == 0:
            out.append(event)
            return
        key = (event.node, event.pci_bus_id, event.xid, event.pid, event.process,
               what_rules_read(event))  # fmt: skip
        window = self._windows.get(key)
        if window is not None:
            lo, hi = min(window.lo, event.ts), max(window.hi, event.end_ts)
            if now < window.ends_at and hi - lo <= self._window_ms:
                window.lo, window.hi = lo, hi
                _hold(window, event, mark)
                return
            del self._windows[key]
            self._emit(window, out)
        while len(self._windows) >= self._max_keys:
            self._emit(self._windows.pop(next(iter(self._windows))), out)
        opened = _Window(now + self.window_s, event.ts, event.end_ts)
        self._windows[key] = opened
        if window is not None and window.count:
            _hold(opened, event, mark)  # the storm goes on
        else:
            out.append(event)

    def due(self, now: float, out: list[Event]) -> None:
        """Send what the windows ended by `now` held."""
        for key in [key for key, window in self._windows.items() if now >= window.ends_at]:
            self._emit(self._windows.pop(key), out)

    def flush(self, out: list[Event]) -> None:
        """Send everything held (the end of a `--once` run)."""
        for window in self._windows.values():
            self._emit(window, out)
        self._windows.clear()

    def marks(self) -> Iterator[Any]:
        return (window.mark for window in self._windows.values() if window.held is not None)

    @property
    def held(self) -> int:
        """Lines held, not sent yet."""
        return sum(window.count for window in self._windows.values())

    @staticmethod
    def _emit(window: _Window, out: list[Event]) -> None:
        record = window.record()
        if record is not None:
            out.append(record)


def _hold(window: _Window, event: XidEvent, mark: Any) -> None:
    if window.held is None:
        window.held, window.mark = event, mark
        window.first_ts, window.last_ts, window.uuid = event.ts, event.end_ts, event.uuid
    else:
        window.first_ts = min(window.first_ts, event.ts)
        window.last_ts = max(window.last_ts, event.end_ts)
        window.uuid = window.uuid or event.uuid
    window.count += event.count


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
    """Tails the kernel log; `poll()` returns the XID events of complete new lines, a storm's
    repeats coalesced (Coalescer). The checkpoint stays before the first line still held, so a
    restart reads it again: a line's offset is saved only once the record counting it is sent
    (lines after it sent already are sent again then: at least once). `once`: read the log to
    its end and send everything held (`ingest xid --once`)."""

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
        once: bool = False,
    ) -> None:
        self.path = path or Path(settings.xid_log_path)
        self._coalescer = Coalescer(settings.xid_coalesce_s, settings.xid_coalesce_max_keys)
        self._once = once
        # what the last poll read and held: its commit installs them (see poll)
        self._polled: tuple[XidPosition, list[FilePosition], Coalescer] | None = None
        self._identity = Identity(
            settings.cluster, settings.node or socket.gethostname(), settings.pool, settings.zone
        )
        self._checkpoint = checkpoint or Path(settings.state_dir) / "xid.json"
        self._clock = clock
        self._rotate_wait = rotate_wait_s
        self._max_bytes = max_bytes
        self._known = dict(gpus or {})
        self._tracked: list[_Tracked] = []
        self._last_79: dict[str, int] = {}  # PCI → ts of its last Xid 79 (see LineReader)
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

    def _read(
        self, tracked: _Tracked, offset: int, tail: str, budget: int
    ) -> tuple[list[tuple[int, str]], int, int]:
        """Complete lines from `offset` (each with the offset it starts at), the offset after
        them, the bytes read."""
        size = os.fstat(tracked.fd).st_size
        if size < offset or (offset and _tail_digest(tracked.fd, offset) != tail):
            offset = 0  # shrank or rewritten: copytruncate
        data = os.pread(tracked.fd, max(0, min(budget, size - offset)), offset)
        end = data.rfind(b"\n") + 1
        lines = []
        at = offset
        for raw in data[:end].split(b"\n")[:-1]:
            text = raw.decode("utf-8", errors="replace")
            lines += [(at, line) for line in (text + "\n").splitlines(keepends=True)]
            at += len(raw) + 1
        return lines, offset + end, end

    def _drop_drained(self) -> None:
        now = self._clock()
        holding = {inode for inode, _ in self._coalescer.marks()}
        keep = []
        for tracked in self._tracked:
            done = tracked.rotated_at is not None and now - tracked.rotated_at > self._rotate_wait
            drained = os.fstat(tracked.fd).st_size <= tracked.offset
            if done and drained and tracked.inode not in holding:
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
        events: list[Event] = []
        read = []
        budget = self._max_bytes
        now = self._clock()
        now_ms = int(now * 1000)
        reader = LineReader(self._identity, gpus, self._last_79)
        coalescer = self._coalescer.copy()  # installed by commit, once the batch is sent
        for tracked in self._tracked:
            offset, tail = tracked.offset, tracked.tail
            while True:
                lines, offset, consumed = self._read(tracked, offset, tail, budget)
                tail = _tail_digest(tracked.fd, offset) if offset else ""
                for at, line in lines:
                    seen = len(parsed.events)
                    reader.feed(line, now_ms, parsed)
                    for event in parsed.events[seen:]:
                        assert isinstance(event, XidEvent)  # LineReader makes nothing else
                        coalescer.add(event, now, (tracked.inode, at), events)
                if not self._once:
                    budget -= consumed
                if not (self._once and consumed):
                    break  # --once reads the log to its end, a chunk at a time
            read.append(FilePosition(tracked.inode, offset, tail))
        coalescer.due(now, events)
        if self._once:
            coalescer.flush(events)
        uuids = {pci: info.uuid for pci, info in gpus.items() if info.uuid}
        position = XidPosition(self._durable(read, coalescer), uuids)
        self._polled = (position, read, coalescer)
        return Batch(events, parsed.bad, position)

    def _durable(self, read: list[FilePosition], coalescer: Coalescer) -> list[FilePosition]:
        """What the checkpoint may say: each file's read offset, or the first line still held
        in it when that is earlier (a restart reads the held lines again)."""
        held: dict[int, int] = {}
        for inode, at in coalescer.marks():
            held[inode] = min(held.get(inode, at), at)
        fds = {tracked.inode: tracked.fd for tracked in self._tracked}
        out = []
        for file in read:
            at = held.get(file.inode, file.offset)
            if at < file.offset:
                tail = _tail_digest(fds[file.inode], at) if at else ""
                file = FilePosition(file.inode, at, tail)
            out.append(file)
        return out

    @property
    def held(self) -> int:
        """Lines read and held in a storm's window, not sent yet."""
        return self._coalescer.held

    def drain(self) -> Batch:
        """Everything held, as records, and the position after what was read: sent before a
        stop, so a held window neither waits for the next start nor is read twice."""
        events: list[Event] = []
        coalescer = self._coalescer.copy()
        coalescer.flush(events)
        read = [FilePosition(t.inode, t.offset, t.tail) for t in self._tracked]
        position = XidPosition(read, dict(self._uuids))
        self._polled = (position, read, coalescer)
        return Batch(events, [], position)

    def commit(self, position: msgspec.Struct | None) -> None:
        if not isinstance(position, XidPosition):
            return
        save_checkpoint(self._checkpoint, position)
        read = position.files
        if self._polled is not None and self._polled[0] is position:
            _, read, self._coalescer = self._polled
        self._polled = None
        saved = {file.inode: file for file in read}
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
