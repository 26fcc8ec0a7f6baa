"""DeadLetter.from_record, the one dead-letter builder: any record, any error, gives a letter
that fits its schema and the broker, keeps the bytes, and is the same on a replay."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from pipeline.model import DEAD_LETTER_MAX_RAW, DeadLetter, RawRecord
from pipeline.wire.codec import decode, encode

records = st.builds(
    RawRecord,
    topic=st.text(min_size=1, max_size=300),
    partition=st.integers(-1, 1000),
    offset=st.integers(-1, 2**40),
    key=st.none() | st.binary(max_size=400) | st.text(max_size=400),
    value=st.none() | st.binary(max_size=2000),
    timestamp=st.integers(0, 9_999_999_999_999),
)


@given(records, st.text(max_size=5000), st.text(min_size=1, max_size=80))
def test_every_letter_fits_its_schema_and_is_the_same_on_a_replay(
    record: RawRecord, error: str, reason: str
) -> None:
    letter = DeadLetter.from_record(record, reason=reason, error=error)
    assert decode(encode(letter), DeadLetter) == letter  # within every bound of the schema
    assert letter == DeadLetter.from_record(record, reason=reason, error=error)
    assert base64.b64decode(letter.raw_b64) == (record.value or b"")
    assert (letter.partition, letter.offset) == (record.partition, record.offset)
    assert letter.ts == max(1_000_000_000_000, record.timestamp)


def test_a_huge_record_keeps_its_head_and_says_so() -> None:
    record = RawRecord(topic="t", value=b"x" * (2 * DEAD_LETTER_MAX_RAW))
    letter = DeadLetter.from_record(record, reason="too_large", error="big", ts_ms=5)
    assert len(encode(letter)) < 1_000_000
    assert letter.error.startswith(f"[raw_b64 keeps the first {DEAD_LETTER_MAX_RAW} of")
    assert letter.ts == 1_000_000_000_000


def test_a_credential_in_the_error_never_reaches_the_letter() -> None:
    record = RawRecord(topic="t", key=b"k")
    letter = DeadLetter.from_record(
        record, reason="refused", error="POST http://ops:hunter2@alerts.example/x: 400"
    )
    assert "hunter2" not in letter.error and letter.key == "k"
