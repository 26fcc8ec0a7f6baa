"""Replay: recordings of topic values through detect → health → policy, dry run.

What would FleetPulse have done with this history? The recordings are JSON lines of input
topic values (what `fleetpulse simulate --to jsonl` writes, or a dump of the input topics);
several files are merged by event time, each file read in its own order, as a partition would
deliver it. The embedded runtime runs them with every action a dry run, after the inventory
when one is given (and then enforced, as the worker does with `[inventory] enforce`). Each line
is decoded like a consumer decodes a record: a bad line becomes a dead letter naming its file,
line and what is wrong, and the replay goes on.

Withheld proposals are read from the policy state after each record that can change it, and
reported with the rule that held them last (pipeline/decide/policy.py WITHHELD_ALERT lists the
rules) and whether an action for them went out later; `withheld_records` are the policy's withheld/1
records as the worker publishes them on fleet.withheld (every rule in turn, and drops).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import Settings
from pipeline.errors import DecodeError, FleetPulseError
from pipeline.model import (
    INPUT_TYPES,
    Action,
    DeadLetter,
    Event,
    Finding,
    Inventory,
    WithheldRecord,
)
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.stages.keys import pool_key, target_name
from pipeline.wire.codec import OLDER, decode
from pipeline.wire.topics import TOPICS


def _tags(value: type[Event]) -> list[object]:
    """The value's schema tag and those of its older versions (codec.OLDER), which go where
    the value goes."""
    return [v.__struct_config__.tag for v in (value, *OLDER) if issubclass(v, value)]


_SUFFIX_BY_TAG = {
    tag: spec.suffix for spec in TOPICS if spec.value in INPUT_TYPES for tag in _tags(spec.value)
}
_TELEMETRY_SUFFIXES = frozenset({"telemetry.gpu", "telemetry.tpu", "telemetry.ici", "events.xid"})
# outputs after which the policy state (and so what it withholds) may have changed
_POLICY_OUTPUTS = frozenset({"node-state", "proposals", "actions", "alerts"})
_MAX_RAW_SHOWN = 512


class _Peek(msgspec.Struct):
    """Just enough of a line to route it and merge it by event time."""

    schema: str = ""
    ts: int = 0


_PEEK = msgspec.json.Decoder(_Peek)


class WithheldProposal(msgspec.Struct, kw_only=True):
    """A proposal the policy held back at some point of the replay."""

    proposal_id: str
    kind: str
    target: str  # cluster/name
    pool: str
    zone: str
    rule: str  # the rule that held it, the last time it was seen held
    first_ts: int
    last_ts: int
    acted: bool = False  # an action for it went out later


class LineDeadLetter(msgspec.Struct, kw_only=True):
    """A line of a recording that could not be processed, and why."""

    file: str
    line: int
    topic: str
    key: str | None
    error: str
    raw: str  # the line as text (shortened)


@dataclass
class ReplayResult:
    files: list[str]
    inventory_file: str | None = None
    inventory_records: int = 0
    enforced: bool = False
    lines: int = 0
    actions: list[Action] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # not healthy: what was found
    cleared: int = 0  # healthy findings other than heartbeats: checks that closed
    withheld: dict[str, WithheldProposal] = field(default_factory=dict)
    withheld_records: list[WithheldRecord] = field(default_factory=list)  # fleet.withheld
    dead_letters: list[LineDeadLetter] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "actions": len(self.actions),
            "findings": len(self.findings),
            "findings_cleared": self.cleared,
            "withheld": len(self.withheld),
            "withheld_records": len(self.withheld_records),
            "dead_letters": len(self.dead_letters),
        }

    def lists(self) -> dict[str, list[Any]]:
        """The reports as plain JSON values, by name."""
        return {
            "actions": msgspec.to_builtins(self.actions),
            "findings": msgspec.to_builtins(self.findings),
            "withheld": msgspec.to_builtins(list(self.withheld.values())),
            "withheld_records": msgspec.to_builtins(self.withheld_records),
            "dead_letters": msgspec.to_builtins(self.dead_letters),
        }

    def document(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "inventory": None
            if self.inventory_file is None
            else {"file": self.inventory_file, "records": self.inventory_records},
            "inventory_enforced": self.enforced,
            "dry_run": True,
            "counts": self.counts(),
            **self.lists(),
        }


Progress = Callable[[int, int, int], None]  # bytes read, bytes in all, lines read


def replay(
    settings: Settings,
    files: Sequence[Path],
    inventory: list[Inventory] | None = None,
    progress: Progress | None = None,
) -> ReplayResult:
    """Run the recordings (merged by event time) through the embedded pipeline, dry run."""
    settings = replay_settings(settings, enforce=inventory is not None)
    result = ReplayResult(files=[str(f) for f in files], enforced=settings.inventory.enforce)
    at: list[tuple[str, int]] = [("", 0)]  # the file and line being fed, for dead letters
    dirty = [False]

    def emit(suffix: str, event: Event) -> None:
        if suffix in _POLICY_OUTPUTS:
            dirty[0] = True
        if isinstance(event, Action):
            result.actions.append(event)
        elif isinstance(event, Finding):
            if not event.healthy:
                result.findings.append(event)
            elif event.check != "heartbeat":
                result.cleared += 1
        elif isinstance(event, DeadLetter):
            result.dead_letters.append(_line_letter(at[0], event))
        elif isinstance(event, WithheldRecord):
            result.withheld_records.append(event)

    runtime = EmbeddedRuntime(settings, emit)
    for record in inventory or []:
        runtime.feed(record)
    result.inventory_records = len(inventory or [])
    total = sum(_size(path) for path in files)
    done = 0
    for name, number, raw in _merged(files):
        at[0] = (name, number)
        result.lines += 1
        done += len(raw) + 1
        suffix = _route(runtime, name, number, raw)
        if suffix is not None and suffix not in _TELEMETRY_SUFFIXES:
            dirty[0] = True
        if dirty[0]:
            _note_withheld(runtime, result)
            dirty[0] = False
        if progress is not None and result.lines % 10_000 == 0:
            progress(done, total, result.lines)
    runtime.finish()
    acted = {action.proposal_id for action in result.actions}
    for held in result.withheld.values():
        held.acted = held.proposal_id in acted
    return result


def replay_settings(settings: Settings, enforce: bool) -> Settings:
    """Every action a dry run; the inventory enforced when there is one to enforce."""
    policy = msgspec.structs.replace(settings.policy, dry_run=True)
    membership = msgspec.structs.replace(
        settings.inventory, enforce=enforce or settings.inventory.enforce
    )
    return msgspec.structs.replace(settings, policy=policy, inventory=membership)


def _route(runtime: EmbeddedRuntime, name: str, number: int, raw: bytes) -> str | None:
    """Feed one line; returns the topic it went to, None when it was dead-lettered here."""
    try:
        suffix = _SUFFIX_BY_TAG.get(_PEEK.decode(raw).schema)
    except (msgspec.DecodeError, msgspec.ValidationError):
        suffix = None
    if suffix is not None:
        runtime.feed_raw(suffix, raw, number)
        return suffix
    runtime.reject(f"file:{name}"[-256:], raw, number, _why_not_input(raw))
    return None


def _why_not_input(raw: bytes) -> str:
    try:
        event = decode(raw, Event)
    except DecodeError as exc:
        return str(exc)
    tags = ", ".join(repr(tag) for tag in _SUFFIX_BY_TAG)
    got = repr(event.__struct_config__.tag)
    return f"$.schema: expected an input value ({tags}), got {got}"


def _note_withheld(runtime: EmbeddedRuntime, result: ReplayResult) -> None:
    for state in runtime.policy.values():
        for held in state.withheld.values():
            proposal = held.proposal
            target = proposal.target
            result.withheld[proposal.proposal_id] = WithheldProposal(
                proposal_id=proposal.proposal_id,
                kind=proposal.kind,
                target=target_name(target),
                pool=pool_key(target),
                zone=target.zone,
                rule=held.reason or "pending",
                first_ts=held.first_ts,
                last_ts=held.last_ts,
            )


def _line_letter(at: tuple[str, int], letter: DeadLetter) -> LineDeadLetter:
    raw = base64.b64decode(letter.raw_b64).decode("utf-8", errors="replace")
    if len(raw) > _MAX_RAW_SHOWN:
        raw = raw[:_MAX_RAW_SHOWN] + f"… ({len(raw)} chars)"
    return LineDeadLetter(
        file=at[0], line=at[1], topic=letter.topic, key=letter.key, error=letter.error, raw=raw
    )


# --- reading ------------------------------------------------------------------------------


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise FleetPulseError(f"cannot read recording {path}: {exc.strerror}") from None


def _merged(files: Sequence[Path]) -> Iterator[tuple[str, int, bytes]]:
    """(file, line number, line) of every non-blank line, merged by event time."""
    streams = [_timed_lines(index, path) for index, path in enumerate(files)]
    for _, _, name, number, raw in heapq.merge(*streams):
        yield name, number, raw


def _timed_lines(index: int, path: Path) -> Iterator[tuple[int, int, str, int, bytes]]:
    # A line without a readable time keeps the time of the line before it, so it stays in
    # place; (ts, file index, line number) orders ties the same way on every run.
    last_ts = 0
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise FleetPulseError(f"cannot read recording {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            raw = line.rstrip(b"\r\n")
            if not raw.strip():
                continue
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                last_ts = _PEEK.decode(raw).ts or last_ts
            yield last_ts, index, str(path), number, raw
