"""No record stops the offline consumers: `EmbeddedRuntime.feed_raw` and `fleetpulse backtest`.

The same poison as on the broker (test_poison_kafka.py) goes between the valid records of a
simulated fleet: into every input topic fed raw to the embedded runtime, and as lines of a
JSONL recording replayed by the backtest. Every poison becomes a dead letter with its reason
(the runtime) or a counted bad line (the backtest), and the valid records give exactly what
they give without the poison.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec

from pipeline.backtest import run as bt
from pipeline.config import Settings, load_settings
from pipeline.model import Action, DeadLetter, Event, Finding
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.wire.codec import MAX_VALUE_BYTES, encode
from pipeline.wire.topics import TOPICS, record_key
from streams.testing import INPUT_SUFFIX, embedded_outputs, scenario
from tests.faults import reliability
from tests.faults.test_poison_kafka import KINDS, LIMIT, REASON, poison

_VALUE_OF = {spec.suffix: spec.value for spec in TOPICS}
SUFFIXES = tuple(sorted({*INPUT_SUFFIX.values(), "inventory"}))  # the recording carries inventory too


def _settings() -> Settings:
    base = load_settings(environ={})
    return msgspec.structs.replace(
        base, kafka=msgspec.structs.replace(base.kafka, max_value_bytes=LIMIT)
    )


def test_feed_raw_dead_letters_every_poison_and_decides_as_without_them() -> None:
    settings = _settings()
    events = list(scenario().events())
    clean = embedded_outputs(settings, events)
    outputs: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(settings, lambda s, e: outputs.setdefault(s, []).append(e))
    sent: dict[tuple[str, int], str] = {}  # (suffix, offset) -> kind
    offset, step = 0, len(events) // len(KINDS) + 1
    for i, kind in enumerate(KINDS):
        for suffix in SUFFIXES:
            sent[(suffix, offset)] = kind
            runtime.feed_raw(suffix, poison(kind, _VALUE_OF[suffix]), offset, "poison/key")
            offset += 1
        for event in events[i * step : (i + 1) * step]:
            runtime.feed_raw(INPUT_SUFFIX[type(event)], encode(event), offset, record_key(event))
            offset += 1
    runtime.finish()

    letters = {(d.topic, d.offset): d for d in outputs["dlq"] if isinstance(d, DeadLetter)}
    skipped = {at for at, kind in sent.items() if kind == "tombstone" and at[0] == "inventory"}
    for at, kind in sent.items():
        if at in skipped:
            assert at not in letters
        else:
            assert letters[at].reason == REASON[kind], (at, kind, letters[at].error)
    assert runtime.counts["tombstones"] == len(skipped) == 1
    poisoned = {at for at in letters if at in sent}
    others = [d.error for at, d in letters.items() if at not in sent]
    assert Counter(others) == Counter(d.error for d in clean.get("dlq", []))

    def ids(out: dict[str, list[Event]]) -> tuple[set[str], set[str]]:
        actions = {a.action_id for a in out.get("actions", []) if isinstance(a, Action)}
        findings = {f.finding_id for f in out.get("findings", []) if isinstance(f, Finding)}
        return actions, findings

    assert ids(outputs) == ids(clean) and ids(clean)[0]
    valid_out = sum(n for name, n in runtime.counts.items() if name.startswith("in."))
    reliability.record(
        "poison",
        "embedded runtime feed_raw: 6 kinds in each of 8 input topics",
        {
            "poison_in": len(sent),
            "dead_lettered": len(poisoned),
            "tombstones_skipped": len(skipped),
            "valid_in": len(events),
            "valid_out": valid_out,
            "actions same as without poison": "yes",
            "lost": len(events) - valid_out,
        },
    )
    assert valid_out == len(events)


def _recording_lines(events: list[Event]) -> tuple[list[bytes], Counter[str]]:
    """Valid lines with a poison line of each kind that JSONL can hold between them. Any topic
    value is a valid line, so the wrong schema is an unknown version."""
    lines: list[bytes] = []
    reasons: Counter[str] = Counter()
    step = len(events) // len(KINDS) + 1
    for i, kind in enumerate(KINDS):
        if kind == "too_large":  # a valid line, padded above the default limit
            raw = encode(events[0])[:-1] + b', "pad": "' + b"x" * MAX_VALUE_BYTES + b'"}'
        else:
            raw = poison(kind, None) or b"null"  # JSONL has no tombstones; null stands in
        lines.append(raw.replace(b"\n", b" "))  # one line each
        reasons["invalid" if kind == "tombstone" else REASON[kind]] += 1
        lines += [encode(event) for event in events[i * step : (i + 1) * step]]
    return lines, reasons


def test_backtest_counts_and_reports_bad_lines_and_replays_the_rest(tmp_path: Path) -> None:
    events = [e for e in scenario().events() if type(e).__name__ in {"GpuSample", "XidEvent"}]
    clean, poisoned = tmp_path / "clean.jsonl", tmp_path / "poisoned.jsonl"
    clean.write_bytes(b"\n".join(encode(e) for e in events) + b"\n")
    lines, reasons = _recording_lines(events)
    poisoned.write_bytes(b"\n".join(lines) + b"\n")
    detect = load_settings(environ={}).detect
    want, want_stats = bt.run_recording(clean, detect)
    got, stats = bt.run_recording(poisoned, detect)
    assert got == want and want_stats.findings > 0
    assert (stats.records, stats.findings) == (want_stats.records, want_stats.findings)
    assert stats.bad_lines == len(KINDS)
    assert stats.bad_reasons == dict(reasons)

    # the command: exit 0, the bad lines reported by reason
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_")}
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "backtest", "--json", str(poisoned)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (recording,) = json.loads(done.stdout)["recordings"]
    assert recording["bad_lines"] == len(KINDS) and recording["bad_reasons"] == dict(reasons)
    reliability.record(
        "poison",
        "backtest: a bad line of each kind in a JSONL recording",
        {
            "poison_in": len(KINDS),
            "bad_lines_counted": stats.bad_lines,
            "valid_in": len(events),
            "valid_out": stats.records,
            "lost": len(events) - stats.records,
        },
    )
