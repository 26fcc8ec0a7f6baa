"""Run the detectors over history and score what they would have flagged.

Two inputs:
- a plain `timestamp,value` CSV (NAB format), run through the single-series detector
  (`pipeline.detect.series`): one series per file;
- a JSONL file of topic values (one encoded event per line, as the simulator records them),
  run through the telemetry stage on the embedded runtime (pipeline/runtime/embedded.py, the
  stage table's own driver, with the telemetry stage alone): the device detectors keyed and
  ticked exactly as the stream runs them (`cluster/node`, `cluster/slice`, a staleness check
  at every 10 s boundary of the fleet's robust clock), node and capacity events announced to
  them as the health and zone stages would. One series per target.

Scoring follows NAB's windows: a window is hit when a flag opens inside it; flags outside every
window are false alarms (reported per series-week); delay runs from the window start to the
first flag inside it.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import msgspec

from pipeline.config import DetectSettings, Settings
from pipeline.detect.series import SeriesParams, SeriesState, series_step
from pipeline.errors import DecodeError, FleetPulseError
from pipeline.model import (
    CapacityEvent,
    Event,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    TpuSample,
    XidEvent,
)
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.stages import telemetry
from pipeline.stages.keys import announcement_key
from pipeline.wire.codec import MAX_VALUE_BYTES, decode
from pipeline.wire.internal import ANNOUNCE_INPUT, TELEMETRY_TOPICS
from pipeline.wire.topics import TOPICS

WEEK_MS = 7 * 24 * 3600 * 1000
# NAB centres a window on each label; all windows of a file together span 10 % of its length.
NAB_WINDOW_SHARE = 0.10


class BacktestError(FleetPulseError):
    """An input file cannot be read as a series, a recording or a label file."""


class Flag(msgspec.Struct, frozen=True, kw_only=True):
    ts: int
    series: str
    check: str
    score: float | None
    value: float | None = None
    baseline: float | None = None
    severity: str = "warning"
    action: str = "watch"
    device: str | None = None
    window: int | None = None  # index of the labelled window it falls in, if any


class SeriesResult(msgspec.Struct, kw_only=True):
    series: str
    points: int
    start_ts: int
    end_ts: int
    flags: list[Flag] = []
    dropped: int = 0
    windows: list[tuple[int, int]] = []
    hits: list[int | None] = []  # per window: ts of the first flag inside, or None
    false_alarms: int = 0

    @property
    def weeks(self) -> float:
        return max(self.end_ts - self.start_ts, 0) / WEEK_MS


class Summary(msgspec.Struct, kw_only=True):
    series: int
    windows: int
    hits: int
    recall: float | None
    false_alarms: int
    weeks: float
    false_alarms_per_week: float
    delay_median_s: float | None
    delay_mean_s: float | None
    delays_s: list[float]


# --- reading -------------------------------------------------------------------------------


def parse_time(text: str | int | float) -> int:
    """NAB timestamps (`YYYY-MM-DD HH:MM:SS[.ffffff]`, UTC), ISO 8601, or epoch ms, to ms."""
    if isinstance(text, int | float):
        return int(text)
    raw = text.strip()
    if raw.isdigit():
        return int(raw)
    try:
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        msg = f"timestamp {raw!r}: expected 'YYYY-MM-DD HH:MM:SS' or epoch ms"
        raise BacktestError(msg) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def format_time(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def read_csv_series(path: Path) -> list[tuple[int, float]]:
    """`timestamp,value` rows; unparseable values become NaN (the detector skips them)."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise BacktestError(f"cannot read {path}: {exc.strerror}") from None
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["timestamp", "value"]:
        raise BacktestError(f"{path}: expected a header 'timestamp,value'")
    points = []
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) < 2:
            raise BacktestError(f"{path}:{number}: expected 'timestamp,value', got {row!r}")
        try:
            value = float(row[1])
        except ValueError:
            value = math.nan
        try:
            points.append((parse_time(row[0]), value))
        except BacktestError as exc:
            raise BacktestError(f"{path}:{number}: {exc}") from None
    return points


def read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise BacktestError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BacktestError(f"{path} is not valid JSON: {exc}") from None


def read_windows(path: Path) -> dict[str, list[tuple[int, int]]]:
    """NAB windows.json: `{series: [[start, end], ...]}`."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise BacktestError(f"{path}: expected an object of series -> [[start, end], ...]")
    windows: dict[str, list[tuple[int, int]]] = {}
    for name, spans in data.items():
        if not isinstance(spans, list) or not all(
            isinstance(s, list) and len(s) == 2 for s in spans
        ):
            raise BacktestError(f"{path}: {name}: expected a list of [start, end] pairs")
        windows[name] = sorted((parse_time(a), parse_time(b)) for a, b in spans)
    return windows


def read_labels(path: Path) -> dict[str, list[int]]:
    """NAB labels.json: `{series: [timestamp, ...]}`."""
    data = read_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise BacktestError(f"{path}: expected an object of series -> [timestamp, ...]")
    return {name: sorted(parse_time(t) for t in stamps) for name, stamps in data.items()}


def windows_from_labels(labels: list[int], start_ts: int, end_ts: int) -> list[tuple[int, int]]:
    """NAB's rule when only points are labelled: centred windows sharing 10 % of the span."""
    if not labels:
        return []
    half = int((end_ts - start_ts) * NAB_WINDOW_SHARE / len(labels) / 2)
    return [(max(start_ts, t - half), min(end_ts, t + half)) for t in labels]


def lookup(table: Mapping[str, object], series: str) -> str | None:
    """The key naming `series`: exact, else the longest key the series path ends with."""
    if series in table:
        return series
    path = series.replace("\\", "/")
    matches = [key for key in table if path.endswith("/" + key.lstrip("/")) or path == key]
    return max(matches, key=len) if matches else None


# --- running -------------------------------------------------------------------------------


def run_series(
    name: str, points: Iterable[tuple[int, float]], params: SeriesParams
) -> SeriesResult:
    """The single-series detector over one history; flags are the episode openings."""
    state = SeriesState()
    flags = []
    count, first, last = 0, 0, 0
    for ts, value in points:
        count += 1
        first = first or ts
        last = max(last, ts)
        flag = series_step(state, ts, value, params)
        if flag is not None and flag.opened:
            flags.append(
                Flag(
                    ts=ts,
                    series=name,
                    check=flag.check,
                    score=round(flag.score, 3),
                    value=flag.value,
                    baseline=round(flag.baseline, 6),
                )
            )
    return SeriesResult(
        series=name, points=count, start_ts=first, end_ts=last, flags=flags, dropped=state.dropped
    )


def score_series(result: SeriesResult, windows: list[tuple[int, int]]) -> None:
    """Attach windows, hits and false alarms to a result (flags get their window index)."""
    result.windows = windows
    result.hits = [None] * len(windows)
    scored = []
    false_alarms = 0
    for flag in result.flags:
        index = next((i for i, (a, b) in enumerate(windows) if a <= flag.ts <= b), None)
        if index is None:
            false_alarms += 1
        elif result.hits[index] is None:
            result.hits[index] = flag.ts
        scored.append(msgspec.structs.replace(flag, window=index))
    result.flags = scored
    result.false_alarms = false_alarms


def summarise(results: list[SeriesResult]) -> Summary:
    windows = sum(len(r.windows) for r in results)
    delays = [
        (hit - start) / 1000
        for r in results
        for (start, _), hit in zip(r.windows, r.hits, strict=True)
        if hit is not None
    ]
    weeks = sum(r.weeks for r in results)
    false_alarms = sum(r.false_alarms for r in results)
    ordered = sorted(delays)
    return Summary(
        series=len(results),
        windows=windows,
        hits=len(delays),
        recall=len(delays) / windows if windows else None,
        false_alarms=false_alarms,
        weeks=round(weeks, 3),
        false_alarms_per_week=round(false_alarms / weeks, 4) if weeks else 0.0,
        delay_median_s=_median(ordered),
        delay_mean_s=round(sum(delays) / len(delays), 1) if delays else None,
        delays_s=delays,
    )


def _median(ordered: list[float]) -> float | None:
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Recording(msgspec.Struct, kw_only=True):
    """What a JSONL replay read: records fed, lines that did not decode, findings emitted."""

    records: int = 0
    bad_lines: int = 0
    bad_reasons: dict[str, int] = {}  # DecodeError.reason -> lines
    first_bad: str = ""
    ignored: int = 0
    refused: int = 0  # records the telemetry stage's door refused (dead letters on a stream)
    findings: int = 0
    clears: int = 0
    heartbeats: int = 0


_TELEMETRY = {spec.value for spec in TOPICS if spec.suffix in TELEMETRY_TOPICS}


def run_recording(
    path: Path, settings: DetectSettings, max_bytes: int = MAX_VALUE_BYTES
) -> tuple[list[SeriesResult], Recording]:
    """Replay a JSONL recording of topic values through the telemetry stage.

    Series are targets (node or slice names); flags are unhealthy findings. Lines that do not
    decode (whatever they hold, `max_bytes` at most) are counted by reason and skipped, as the
    stream would send them to the dead-letter topic.
    """
    results: dict[str, SeriesResult] = {}
    stats = Recording()

    def emit(topic: str, event: Event) -> None:
        if isinstance(event, Finding):
            _note_finding(results, stats, event)
        elif topic == "dlq":
            stats.refused += 1

    runtime = EmbeddedRuntime(
        Settings(detect=settings), emit, stages=(telemetry.STAGE,)
    )
    for event in _events(path, max_bytes, stats):
        stats.records += 1
        _note_record(results, event)
        announced = (
            announcement_key(event) if isinstance(event, NodeEvent | CapacityEvent) else None
        )
        if type(event) in _TELEMETRY:
            runtime.feed(event)
        elif announced is not None:  # what the health and zone stages pass on to it
            runtime.deliver(ANNOUNCE_INPUT, announced, event)
        else:
            stats.ignored += 1
    runtime.finish()
    return sorted(results.values(), key=lambda r: r.series), stats


def _events(path: Path, max_bytes: int, stats: Recording) -> Iterator[Event]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise BacktestError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield decode(line.strip(), Event, max_bytes)
            except DecodeError as exc:
                stats.bad_lines += 1
                stats.bad_reasons[exc.reason] = stats.bad_reasons.get(exc.reason, 0) + 1
                stats.first_bad = stats.first_bad or f"{path}:{number}: {exc}"


def _note_record(results: dict[str, SeriesResult], event: Event) -> None:
    if isinstance(event, GpuSample | XidEvent):
        name, ts = event.node, event.ts
    elif isinstance(event, TpuSample | IciSample):
        name, ts = event.slice, event.ts
    else:
        return
    result = results.get(name)
    if result is None:
        results[name] = SeriesResult(series=name, points=1, start_ts=ts, end_ts=ts)
        return
    result.points += 1
    result.start_ts = min(result.start_ts, ts)
    result.end_ts = max(result.end_ts, ts)


def _note_finding(results: dict[str, SeriesResult], stats: Recording, finding: Finding) -> None:
    if finding.check == "heartbeat":
        stats.heartbeats += 1
        return
    if finding.healthy:
        stats.clears += 1
        return
    stats.findings += 1
    name = finding.entity.target.name
    result = results.get(name)
    if result is None:
        result = results[name] = SeriesResult(
            series=name, points=0, start_ts=finding.ts, end_ts=finding.ts
        )
    proof = finding.evidence
    result.flags.append(
        Flag(
            ts=finding.ts,
            series=name,
            check=finding.check,
            score=proof.score if proof else None,
            value=proof.value if proof else None,
            baseline=proof.baseline if proof else None,
            severity=finding.severity,
            action=finding.recommended_action,
            device=finding.entity.device,
        )
    )


def csv_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Files as given; a directory stands for every CSV below it (sorted)."""
    for path in paths:
        if path.is_dir():
            yield from sorted(path.rglob("*.csv"))
        else:
            yield path


def params_for(settings: DetectSettings) -> SeriesParams:
    return SeriesParams.from_settings(settings)
