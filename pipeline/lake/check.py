"""Unreadable lake files: found cheaply, skipped by readers, quarantined by compaction.

One damaged file (zero bytes after a disk-full, cut short by a copy, overwritten with garbage)
must not take every query down with it. `check_file` says why a file cannot be read, cheaply:
its size, the 'PAR1' magic at both ends, the footer length, and the footer itself as pyarrow
parses it. Verdicts are kept per (path, inode, size, mtime), so a process that opens many
`Lake`s checks each file once. Damage inside the data pages with an intact footer only shows
when the pages are read: `read_checked` reads and validates a whole file (compaction does so
anyway), and `check_file(deep=True)` records what it finds, so readers skip that file from then
on (`fleetpulse lake status --verify` and `lake compact --verify` read every file this way).

`readable_files` is `visible_files` (pipeline/lake/writer.py) less the unreadable files: a
compacted file that cannot be read supersedes nothing, so the files it merged stay visible for
as long as they exist. `quarantine` moves a file to `<lake>/_quarantine/<same relative path>`,
which no reader lists (it is not a table's directory).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import FleetPulseError
from pipeline.lake.writer import LakeFile, partition_dirs, scan_dir, supersedes

QUARANTINE_DIR = "_quarantine"
MAGIC = b"PAR1"
_SMALLEST = 12  # magic, footer length, magic: the bytes of a Parquet file with an empty footer


class UnreadableFileError(FleetPulseError):
    """A lake file that cannot be read as Parquet; the message names it and says why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"unreadable lake file {path}: {reason}")


@dataclass(frozen=True)
class BadFile:
    path: Path
    reason: str


@dataclass(frozen=True)
class _Verdict:
    stamp: tuple[int, int, int]  # (inode, size, mtime_ns): a replaced file is checked again
    deep: bool  # the data pages were read too
    reason: str | None


_verdicts: dict[str, _Verdict] = {}


def check_file(path: Path, deep: bool = False) -> str | None:
    """Why `path` cannot be read as Parquet, or None if it can.

    Reads the two ends and the footer; with `deep`, every page as well. Raises
    FileNotFoundError if the file is gone (a compaction may delete files at any time).
    """
    stat = path.stat()
    stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    known = _verdicts.get(str(path))
    if known is not None and known.stamp == stamp and (known.deep or known.reason or not deep):
        return known.reason
    reason = _check_ends(path, stat.st_size)
    if reason is None and deep:
        try:
            read_checked(path)
        except UnreadableFileError as exc:
            reason = exc.reason
    _verdicts[str(path)] = _Verdict(stamp, deep, reason)
    return reason


def _check_ends(path: Path, size: int) -> str | None:
    if size == 0:
        return "empty file (0 bytes)"
    if size < _SMALLEST:
        return f"too small to be Parquet ({size} bytes)"
    try:
        with open(path, "rb") as file:
            head = file.read(4)
            file.seek(-8, os.SEEK_END)
            tail = file.read(8)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"cannot be opened: {exc.strerror or exc}"
    if head != MAGIC:
        return "not Parquet: no 'PAR1' magic at the start"
    if tail[4:] != MAGIC:
        return "truncated or damaged: no 'PAR1' magic at the end"
    footer = int.from_bytes(tail[:4], "little")
    if footer > size - _SMALLEST:
        return f"damaged: the footer claims {footer} bytes of a {size}-byte file"
    try:
        pq.read_metadata(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        return f"damaged footer: {_first_line(exc)}"
    return None


def read_checked(path: Path) -> pa.Table:
    """Every row of `path`, pages decoded and validated (UTF-8 too); else UnreadableFileError."""
    try:
        with pq.ParquetFile(path) as file:
            table = file.read()
        table.validate(full=True)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableFileError(path, f"damaged data: {_first_line(exc)}") from None
    return table


def check_dir(directory: Path, deep: bool = False) -> tuple[list[LakeFile], list[BadFile]]:
    """The files of one partition a reader should read, and the unreadable ones it must skip.

    A bad file that a readable compacted file supersedes is neither: nobody reads it, and
    compaction deletes it in time. With `deep`, every page of every file is read.
    """
    found = scan_dir(directory)
    reasons: dict[Path, str | None] = {}
    for lake_file in found:
        with contextlib.suppress(FileNotFoundError):  # gone: a compaction deleted it
            reasons[lake_file.path] = check_file(lake_file.path, deep)
    present = [f for f in found if f.path in reasons]
    ranges = [f for f in present if f.compacted and reasons[f.path] is None]
    live = [f for f in present if not any(supersedes(r, f) for r in ranges)]
    good = sorted(f for f in live if reasons[f.path] is None)
    bad = [BadFile(f.path, reason) for f in sorted(live) if (reason := reasons[f.path])]
    return good, bad


def readable_files(root: Path, table: str, deep: bool = False
                   ) -> tuple[list[Path], list[BadFile]]:
    """`visible_files(root, table)` without the unreadable files, and those files with why."""
    good: list[Path] = []
    bad: list[BadFile] = []
    for directory in partition_dirs(root, table):
        files, broken = check_dir(directory, deep)
        good += [f.path for f in files]
        bad += broken
    return good, bad


def quarantine(root: Path, path: Path) -> Path:
    """Move `path` to `<root>/_quarantine/<its path under root>` by an atomic rename."""
    target = root / QUARANTINE_DIR / path.relative_to(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    number = 1
    while target.exists():  # the same name went bad before: keep both
        number += 1
        target = target.with_name(f"{path.name}.{number}")
    os.rename(path, target)
    for directory in (target.parent, path.parent):  # both renames must survive a power cut
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _verdicts.pop(str(path), None)
    return target


def quarantined_files(root: Path) -> list[Path]:
    """Every file under `<root>/_quarantine`, by path."""
    folder = root / QUARANTINE_DIR
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
