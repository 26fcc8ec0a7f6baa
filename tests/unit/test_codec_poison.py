"""No bytes stop a consumer: `codec.decode` gives a value or a DecodeError with its reason."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import schemas_tool
from pipeline.errors import DecodeError
from pipeline.model import (
    DEAD_LETTER_MAX_RAW,
    TOPIC_VALUES,
    Action,
    DeadLetter,
    Event,
    GpuSample,
    Inventory,
    RawRecord,
)
from pipeline.wire import codec

TYPES = [*TOPIC_VALUES.values(), Event]


def _sample(name: str) -> bytes:
    path = schemas_tool.SCHEMA_DIR / "samples" / schemas_tool.file_name(TOPIC_VALUES[name])
    return path.read_bytes()


def _reason(raw: bytes | None, expected: type[Event] = GpuSample, **kw: Any) -> str:
    with pytest.raises(DecodeError) as caught:
        codec.decode(raw, expected, **kw)
    return caught.value.reason


def _decodes_or_refuses(raw: bytes, expected: type[Event]) -> None:
    try:
        event = codec.decode(raw, expected)
    except DecodeError as exc:
        assert exc.reason in {"invalid", "too_deep", "too_large"}, exc.reason
        assert str(exc)
    else:
        assert isinstance(event, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=512), expected=st.sampled_from(TYPES))
def test_any_bytes_decode_or_raise_decode_error(raw: bytes, expected: type[Event]) -> None:
    _decodes_or_refuses(raw, expected)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(sorted(TOPIC_VALUES)),
    field=st.text(max_size=12),
    value=_JSON,
    depth=st.integers(min_value=0, max_value=3000),
)
def test_samples_with_a_field_replaced_decode_or_raise_decode_error(
    name: str, field: str, value: Any, depth: int
) -> None:
    """Near-valid values reach the deeper paths (validation messages, _value_at), and any
    field may hold nesting of any depth."""
    sample = json.loads(_sample(name))
    keys = [*sample, field]
    sample[keys[len(field) % len(keys)]] = value
    raw = json.dumps(sample).encode()
    nested = raw.replace(b'"schema"', b'"x": ' + b"[" * depth + b"]" * depth + b', "schema"', 1)
    _decodes_or_refuses(raw, TOPIC_VALUES[name])
    _decodes_or_refuses(nested, TOPIC_VALUES[name])


def test_a_tombstone_is_told_apart() -> None:
    assert _reason(None, Inventory) == "tombstone"


def test_nesting_a_thousand_deep_is_too_deep() -> None:
    # the record of the issue: 2 kB, nested 1,000 deep
    assert _reason(b"[" * 1000 + b"]" * 1000) == "too_deep"
    assert _reason(b'{"schema": "gpu_sample/3", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}") == (
        "too_deep"
    )
    assert _reason(b"{" + b'"a":{' * 5000) == "too_deep"


def test_too_deep_below_a_field_that_already_failed() -> None:
    # the typed decoder stops at $.ts; the generic one that shows the value then goes deep
    raw = b'{"schema": "gpu_sample/3", "ts": "x", "z": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    assert _reason(raw) == "too_deep"


def test_deep_nesting_is_refused_whatever_the_stack_depth() -> None:
    # a consumer may decode with much of the stack already used (asyncio, faust)
    raw = b'{"schema": "gpu_sample/3", "gpus": ' + b"[" * 300 + b"]" * 300 + b"}"

    def at_depth(n: int) -> str:
        return at_depth(n - 1) if n else _reason(raw)

    assert at_depth(sys.getrecursionlimit() - 400) in {"too_deep", "invalid"}


def test_too_large_is_refused_before_parsing() -> None:
    ten_mb = b"[" * (10 << 20)  # would be too deep too: the size check comes first
    assert _reason(ten_mb) == "too_large"
    sample = _sample("gpu_sample")
    assert _reason(sample, max_bytes=len(sample) - 1) == "too_large"
    assert isinstance(codec.decode(sample, GpuSample, max_bytes=len(sample)), GpuSample)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe\xfd",
        b'"\xff"',
        _sample("gpu_sample").replace(b'"driver": "', b'"driver": "\xc3\x28', 1),
        b"",
        b"null",
        b"{}",
        b'{"schema": "gpu_sample/3"}',
        b'{"schema": "nope/1"}',
        b"\x00" * 64,
        b'{"schema": "gpu_sample/3", "ts": 1e999}',
    ],
)
def test_invalid_utf8_wrong_schema_and_garbage_are_invalid(raw: bytes) -> None:
    assert _reason(raw) == "invalid"


def test_invalid_enum_value_names_the_allowed_values() -> None:
    sample = json.loads(_sample("action"))
    sample["kind"] = "explode"
    with pytest.raises(DecodeError) as caught:
        codec.decode(json.dumps(sample).encode(), Action)
    assert caught.value.field == "$.kind"
    assert caught.value.expected.startswith("one of 'cordon', 'drain'"), caught.value.expected
    assert caught.value.got == "'explode'"
    sample["kind"], sample["target"]["kind"] = "drain", "rack"
    with pytest.raises(DecodeError, match=r"\$\.target\.kind: expected one of 'link', 'node', 'slice', "
                       r"'switch', got 'rack'"):  # fmt: skip
        codec.decode(json.dumps(sample).encode(), Action)


def test_a_dead_letter_of_a_huge_record_still_fits_the_broker() -> None:
    record = RawRecord(topic="t", partition=0, offset=1, key=b"k" * 1000,
                       value=b"x" * (3 * DEAD_LETTER_MAX_RAW))
    letter = DeadLetter.from_record(record, reason="too_large", error="e" * 10_000, ts_ms=0)
    assert len(codec.encode(letter)) < 1_000_000
    assert (letter.reason, letter.key, letter.ts) == ("too_large", "k" * 256, 1_000_000_000_000)
    assert f"first {DEAD_LETTER_MAX_RAW} of {3 * DEAD_LETTER_MAX_RAW} bytes" in letter.error
