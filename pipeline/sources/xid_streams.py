"""The XID source's other inputs: `journalctl -k -o json` records and /dev/kmsg records.

Both feed the message of each record to the same line parser as the kernel-log tailer
(pipeline.sources.xid.LineReader), so every message form it reads is read here too.

Journal (`fleetpulse ingest xid --journal-json FILE|-`): JSON lines as `journalctl -k -o json
[--follow]` writes them, from a file that grows or from a pipe. The event time is the record's
__REALTIME_TIMESTAMP (when the journal received it); the node is sources.node, else _HOSTNAME.
The position is the __CURSOR of the last record read (and, for a file, the byte offset after
it): after a restart, records not after that cursor are skipped — compared by sequence number
within one journal (`s=`), else by receive time (`t=`) — so a pipe restarted with
`journalctl -k -o json --follow --after-cursor "$(jq -r .cursor <state_dir>/xid-journal.json)"`
or a file read again from its start repeats nothing. A line that is not a JSON object is a dead
letter, as is a record whose NVRM Xid message does not parse (with the whole record).

/dev/kmsg (`--kmsg [PATH]`): records `<prio>,<seq>,<usec since boot>,<flags>;<message>` (one
per read; continuation lines ` KEY=value` are skipped). Only kernel-facility records count
(user space can write to /dev/kmsg). The event time is boot time + usec, boot time being the
wall clock minus the monotonic clock (printk's clock, near enough). The position is the boot id
and the last sequence number: within one boot, records up to it are skipped after a restart.
Records overwritten in the ring before we read them (EPIPE) are lost; we log how often.

Until a position is committed, what was read stays buffered: a poll whose batch was not
published reads it again (a pipe or /dev/kmsg cannot be read twice).

A storm's repeats are coalesced as in the tailer (pipeline.sources.xid.Coalescer); the saved
position stays before the first record still held (the cursor and offset before it), so a
restart reads the held records again.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pipeline.config import SourcesSettings
from pipeline.errors import DecodeError
from pipeline.model import Event, XidEvent
from pipeline.sources.base import BadRecord, Batch, Parsed, load_checkpoint, save_checkpoint
from pipeline.sources.xid import Coalescer, GpuInfo, Identity, LineReader

log = logging.getLogger(__name__)


class _Record(msgspec.Struct):
    """The fields of a `journalctl -o json` record we use (MESSAGE may be a byte array)."""

    message: str | list[int] | None = msgspec.field(default=None, name="MESSAGE")
    realtime: str | None = msgspec.field(default=None, name="__REALTIME_TIMESTAMP")
    hostname: str | None = msgspec.field(default=None, name="_HOSTNAME")
    cursor: str | None = msgspec.field(default=None, name="__CURSOR")


class StreamPosition(msgspec.Struct, frozen=True):
    cursor: str = ""  # journal: __CURSOR; kmsg: "<boot id>;<seq>"
    offset: int = 0  # bytes of the input consumed (a file's offset; a stream's count)
    uuids: dict[str, str] = {}  # PCI → UUID learned from `NVRM: GPU at` lines


@dataclass
class _Polled:
    """What a poll read (the position in memory) and held: its commit installs them."""

    saved: StreamPosition  # what the checkpoint says: before the first record still held
    read: StreamPosition
    coalescer: Coalescer


def _coalesced(
    coalescer: Coalescer, parsed: Parsed, seen: int, now: float, mark: tuple[str, int],
    out: list[Event],
) -> None:
    """The events parsed since `seen` into the coalescer (read at `mark`: cursor, offset)."""
    for event in parsed.events[seen:]:
        assert isinstance(event, XidEvent)  # LineReader makes nothing else
        coalescer.add(event, now, mark, out)


def _ends(
    coalescer: Coalescer, now: float, once: bool, read: StreamPosition, out: list[Event]
) -> _Polled:
    """The windows that ended sent (all, `once`); the position to save: before the first
    record still held."""
    coalescer.due(now, out)
    if once:
        coalescer.flush(out)
    marks = sorted(coalescer.marks(), key=lambda mark: mark[1])
    saved = read if not marks else StreamPosition(marks[0][0], marks[0][1], read.uuids)
    return _Polled(saved, read, coalescer)


def _drained(source: JournalXidSource | KmsgXidSource, read: StreamPosition) -> Batch:
    events: list[Event] = []
    source._polled = _ends(source._coalescer.copy(), 0.0, True, read, events)
    return Batch(events, [], source._polled.saved)


def cursor_after(cursor: str, saved: str) -> bool:
    """Whether journal `cursor` comes after `saved` (a record not yet read)."""
    if not saved:
        return True
    new, old = _cursor_fields(cursor), _cursor_fields(saved)
    try:
        if new.get("s") and new.get("s") == old.get("s") and "i" in new and "i" in old:
            return int(new["i"], 16) > int(old["i"], 16)
        if "t" in new and "t" in old:
            return int(new["t"], 16) > int(old["t"], 16)
    except ValueError:
        pass
    return cursor != saved  # unknown cursor form: read it (at least once)


def _cursor_fields(cursor: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in cursor.split(";") if "=" in part)


class _Input:
    """Bytes of a file or a stream from the committed point, kept until committed."""

    def __init__(self, path: str, offset: int, max_bytes: int) -> None:
        self.fd = 0 if path == "-" else os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        if not self.regular:
            os.set_blocking(self.fd, False)
        size = os.fstat(self.fd).st_size if self.regular else 0
        self.start = offset if self.regular and offset <= size else 0  # offset of buffer[0]
        self.buffer = b""
        self.overwritten = 0  # /dev/kmsg records lost in the ring (EPIPE)
        self._max = max_bytes

    def available(self) -> bytes:
        if self.regular:
            return os.pread(self.fd, self._max, self.start)
        while len(self.buffer) < self._max:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except BrokenPipeError:  # /dev/kmsg: the next records were overwritten
                self.overwritten += 1
                continue
            if not chunk:
                break
            # /dev/kmsg returns one record per read, a pipe any bytes: end kmsg records' lines
            self.buffer += chunk
        return self.buffer

    def consumed(self, offset: int) -> None:
        if not self.regular:
            self.buffer = self.buffer[offset - self.start :]
        self.start = offset

    def close(self) -> None:
        if self.fd != 0:
            os.close(self.fd)


class JournalXidSource:
    """XIDs from `journalctl -k -o json` output (a file or `-` for a pipe on stdin)."""

    name = "xid"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        path: str,
        checkpoint: Path | None = None,
        clock: Callable[[], float] = time.time,
        max_bytes: int = 1 << 20,
        once: bool = False,
    ) -> None:
        self._settings = settings
        self._coalescer = Coalescer(settings.xid_coalesce_s, settings.xid_coalesce_max_keys)
        self._once = once
        self._polled: _Polled | None = None
        self._checkpoint = checkpoint or Path(settings.state_dir) / "xid-journal.json"
        self._clock = clock
        saved = load_checkpoint(self._checkpoint, StreamPosition) or StreamPosition()
        self._position = saved
        self._input = _Input(path, saved.offset, max_bytes)
        self._last_79: dict[str, int] = {}

    def poll(self) -> Batch:
        data = self._input.available()
        end = data.rfind(b"\n") + 1
        gpus = {pci: GpuInfo(None, uuid) for pci, uuid in self._position.uuids.items()}
        default = Identity(
            self._settings.cluster,
            self._settings.node or socket.gethostname(),
            self._settings.pool,
            self._settings.zone,
        )
        reader = LineReader(default, gpus, self._last_79)
        parsed = Parsed()
        cursor = self._position.cursor
        now = self._clock()
        now_ms = int(now * 1000)
        coalescer = self._coalescer.copy()  # installed by commit, once the batch is sent
        events: list[Event] = []
        at = self._input.start
        for raw in data[:end].split(b"\n")[:-1]:
            if raw.strip():
                seen, before = len(parsed.events), cursor
                cursor = self._record(raw.rstrip(b"\r"), cursor, reader, now_ms, parsed)
                _coalesced(coalescer, parsed, seen, now, (before, at), events)
            at += len(raw) + 1
        uuids = {pci: info.uuid for pci, info in gpus.items() if info.uuid}
        read = StreamPosition(cursor, self._input.start + end, uuids)
        self._polled = _ends(coalescer, now, self._once, read, events)
        return Batch(events, parsed.bad, self._polled.saved)

    @property
    def held(self) -> int:
        """Lines read and held in a storm's window, not sent yet."""
        return self._coalescer.held

    def drain(self) -> Batch:
        """Everything held, as records (sent before a stop)."""
        return _drained(self, self._position)

    def _record(
        self, raw: bytes, cursor: str, reader: LineReader, now_ms: int, parsed: Parsed
    ) -> str:
        """Feed one JSON line; returns the cursor after it."""
        try:
            record = msgspec.json.decode(raw, type=_Record)
        except msgspec.DecodeError as exc:
            expected = "a journalctl -o json object"
            error = DecodeError(field="record", expected=expected, got=str(exc))
            parsed.bad.append(BadRecord(raw, error))
            return cursor
        if record.cursor and not cursor_after(record.cursor, self._position.cursor):
            return cursor  # read before the restart
        message = record.message
        if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
            message = bytes(b & 0xFF for b in message).decode("utf-8", errors="replace")
        if message:
            realtime = record.realtime
            ts = int(realtime) // 1000 if realtime and realtime.isdigit() else now_ms
            node = self._settings.node or record.hostname or reader.identity.node
            reader.identity = Identity(
                reader.identity.cluster, node, reader.identity.pool, reader.identity.zone
            )
            bad = len(parsed.bad)
            reader.feed(message, ts, parsed)
            if len(parsed.bad) > bad:  # dead-letter the whole record, not just its message
                parsed.bad[-1] = BadRecord(raw, parsed.bad[-1].error)
        return record.cursor or cursor

    def commit(self, position: msgspec.Struct | None) -> None:
        if not isinstance(position, StreamPosition):
            return
        save_checkpoint(self._checkpoint, position)
        if self._polled is not None and self._polled.saved is position:
            position, self._coalescer = self._polled.read, self._polled.coalescer
        self._polled = None
        self._input.consumed(position.offset)
        self._position = position

    def close(self) -> None:
        self._input.close()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class KmsgXidSource:
    """XIDs from /dev/kmsg records (or a file of them)."""

    name = "xid"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        path: str = "/dev/kmsg",
        checkpoint: Path | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        boot_id: Callable[[], str] = _boot_id,
        max_bytes: int = 1 << 20,
        once: bool = False,
    ) -> None:
        self._coalescer = Coalescer(settings.xid_coalesce_s, settings.xid_coalesce_max_keys)
        self._once = once
        self._polled: _Polled | None = None
        self._identity = Identity(
            settings.cluster, settings.node or socket.gethostname(), settings.pool, settings.zone
        )
        self._checkpoint = checkpoint or Path(settings.state_dir) / "xid-kmsg.json"
        self._clock, self._monotonic = clock, monotonic
        self._boot = boot_id()
        saved = load_checkpoint(self._checkpoint, StreamPosition) or StreamPosition()
        boot, _, seq = saved.cursor.partition(";")
        self._after = int(seq) if boot == self._boot and seq.isdigit() else -1
        self._uuids = dict(saved.uuids) if boot == self._boot else {}
        self._input = _Input(path, 0, max_bytes)
        self._last_79: dict[str, int] = {}

    def poll(self) -> Batch:
        data = self._input.available()
        end = data.rfind(b"\n") + 1
        gpus = {pci: GpuInfo(None, uuid) for pci, uuid in self._uuids.items()}
        reader = LineReader(self._identity, gpus, self._last_79)
        now = self._clock()
        boot_ms = (now - self._monotonic()) * 1000
        parsed = Parsed()
        seq = self._after
        coalescer = self._coalescer.copy()  # installed by commit, once the batch is sent
        events: list[Event] = []
        at = self._input.start
        for line in data[:end].split(b"\n")[:-1]:
            start, at = at, at + len(line) + 1
            raw = line.decode("utf-8", errors="replace").rstrip("\r")
            header, sep, message = raw.partition(";")
            fields = header.split(",")
            if not sep or len(fields) < 3 or not all(f.isdigit() for f in fields[:3]):
                continue  # a continuation line (` KEY=value`)
            if int(fields[0]) >> 3 != 0 or int(fields[1]) <= self._after:
                continue  # not the kernel's, or read before the restart
            before, seq = seq, max(seq, int(fields[1]))
            bad, seen = len(parsed.bad), len(parsed.events)
            reader.feed(message, round(boot_ms + int(fields[2]) / 1000), parsed)
            if len(parsed.bad) > bad:
                parsed.bad[-1] = BadRecord(raw.encode(), parsed.bad[-1].error)
            _coalesced(coalescer, parsed, seen, now, (f"{self._boot};{before}", start), events)
        if self._input.overwritten:
            log.warning("/dev/kmsg: %d reads found records overwritten", self._input.overwritten)
            self._input.overwritten = 0
        uuids = {pci: info.uuid for pci, info in gpus.items() if info.uuid}
        read = StreamPosition(f"{self._boot};{seq}", self._input.start + end, uuids)
        self._polled = _ends(coalescer, now, self._once, read, events)
        return Batch(events, parsed.bad, self._polled.saved)

    @property
    def held(self) -> int:
        """Lines read and held in a storm's window, not sent yet."""
        return self._coalescer.held

    def drain(self) -> Batch:
        """Everything held, as records (sent before a stop)."""
        read = StreamPosition(f"{self._boot};{self._after}", self._input.start, self._uuids)
        return _drained(self, read)

    def commit(self, position: msgspec.Struct | None) -> None:
        if not isinstance(position, StreamPosition):
            return
        save_checkpoint(self._checkpoint, position)
        if self._polled is not None and self._polled.saved is position:
            position, self._coalescer = self._polled.read, self._polled.coalescer
        self._polled = None
        self._input.consumed(position.offset)
        self._after = int(position.cursor.partition(";")[2])
        self._uuids = dict(position.uuids)

    def close(self) -> None:
        self._input.close()
