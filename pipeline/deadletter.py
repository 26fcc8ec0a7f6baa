"""One way to build a dead letter (fleet.dlq), for every consumer: worker, lake sink, alerts,
ingest and the embedded runtime.

A dead letter keeps the record's coordinates and raw bytes, so it can be replayed once its
producer is fixed, the error message a person reads, and a short `reason` a dashboard counts.
Fields are cut to what the DeadLetter schema (and the broker) allows, so building and sending
one never fails for its size. The error is redacted (pipeline.redact): no credential quoted in
an error message reaches fleet.dlq.
"""

from __future__ import annotations

import base64

from pipeline.model import DeadLetter
from pipeline.redact import redact

_MAX_KEY = 256  # DeadLetter.key is ShortText
_MAX_ERROR = 4096  # DeadLetter.error is Text
_MAX_REASON = 64
_MIN_TS = 1_000_000_000_000  # the smallest TimestampMs
# Raw bytes kept, at most: base64 makes them a third larger, and the letter must still fit the
# broker's message.max.bytes (1 MiB by default) — a too_large record would not, whole.
MAX_RAW = 512 * 1024


def dead_letter(
    *,
    ts_ms: int,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | str | None,
    raw: bytes | None,
    error: str,
    reason: str,
) -> DeadLetter:
    """A DeadLetter; `ts_ms` below the schema's range (a record without a timestamp) becomes
    the smallest one it allows, so a replay of the same bad record gives the same letter."""
    error = redact(error)  # an error may quote a URL with its credentials, or a token
    text = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key
    raw = raw or b""
    if len(raw) > MAX_RAW:
        error = f"[raw_b64 keeps the first {MAX_RAW} of {len(raw)} bytes] {error}"
        raw = raw[:MAX_RAW]
    return DeadLetter(
        ts=max(_MIN_TS, ts_ms),
        topic=topic[:_MAX_KEY],
        partition=partition,
        offset=offset,
        key=None if text is None else text[:_MAX_KEY],
        error=error[:_MAX_ERROR],
        raw_b64=base64.b64encode(raw).decode("ascii"),
        reason=reason[:_MAX_REASON],
    )
