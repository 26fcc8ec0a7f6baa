"""Inventory files: what `fleetpulse inventory load`, `replay --inventory` and the demo read.

An inventory file lists the fleet as its owner knows it, one inventory/1 value per node or
slice: JSON lines (what `fleetpulse simulate --to jsonl` writes as OUT/inventory.jsonl), or one
JSON array of the same objects. Every value is checked with the topic decoder, and every bad
one is reported by its line (or array item), field, what was expected and what arrived, so
the owner can fix the whole file at once. A name listed twice is an error too: which pool the
node is in would depend on the order of the lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pipeline.errors import DecodeError, FleetPulseError
from pipeline.model import Inventory
from pipeline.wire.codec import decode, encode
from pipeline.wire.topics import record_key

FILE_NAME = "inventory.jsonl"  # beside a simulated recording's events.jsonl
_SHOWN_ERRORS = 20


@dataclass(frozen=True)
class LineError:
    line: int  # 1-based line of a JSONL file, or item of a JSON array
    error: DecodeError


class InventoryFileError(FleetPulseError):
    """An inventory file with bad values; `errors` has every one of them."""

    def __init__(self, path: Path, errors: list[LineError], unit: str = "line") -> None:
        self.path, self.errors = path, errors
        shown = [f"  {unit} {e.line}: {e.error}" for e in errors[:_SHOWN_ERRORS]]
        if len(errors) > _SHOWN_ERRORS:
            shown.append(f"  … and {len(errors) - _SHOWN_ERRORS} more")
        super().__init__(f"{path}: {len(errors)} bad inventory value(s)\n" + "\n".join(shown))


def load_inventory(path: Path | str, not_after_ms: int | None = None) -> list[Inventory]:
    """Every record of an inventory file, in file order; raises InventoryFileError naming
    every bad line (one dated after `not_after_ms` too: the worker would dead-letter it), and
    FleetPulseError when the file cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FleetPulseError(f"cannot read inventory file {path}: {exc.strerror}") from None
    unit = "item" if data.lstrip().startswith(b"[") else "line"
    items = _array_items(path, data) if unit == "item" else _lines(data)
    records: list[Inventory] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for number, raw in items:
        try:
            record = decode(raw, Inventory)
        except DecodeError as exc:
            errors.append(LineError(number, exc))
            continue
        key = record_key(record)
        if not_after_ms is not None and record.ts > not_after_ms:
            errors.append(LineError(number, _future(record.ts, not_after_ms)))
            continue
        if key in seen:
            errors.append(
                LineError(
                    number,
                    DecodeError("$.name", f"a name not listed before (cluster/name {key})",
                                f"a repeat of {unit} {seen[key]}"),
                )
            )
            continue
        seen[key] = number
        records.append(record)
    if errors:
        raise InventoryFileError(path, errors, unit)
    return records


def _future(ts: int, not_after_ms: int) -> DecodeError:
    return DecodeError(
        "$.ts",
        f"a time at most {not_after_ms} (now, plus clock.max_ahead_s)",
        f"{ts}, {(ts - not_after_ms) / 1000:.0f} s later (a future-dated record moves no clock "
        "of ours: the worker dead-letters it)",
    )


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            yield number, line


def _array_items(path: Path, data: bytes) -> Iterator[tuple[int, bytes]]:
    try:
        items = msgspec.json.decode(data, type=list[msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FleetPulseError(f"{path}: not a JSON array of inventory values: {exc}") from None
    for number, item in enumerate(items, start=1):
        yield number, bytes(item)


def write_inventory(path: Path, records: Iterable[Inventory]) -> int:
    """Write records as JSON lines (the format load_inventory reads); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("wb") as handle:
        for record in records:
            handle.write(encode(record) + b"\n")
            count += 1
    return count
