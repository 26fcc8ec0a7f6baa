"""The fleet-input batches of the Kafka driver (streams/batches.py): what goes in comes out, in
order, split where a record would grow too big; a malformed batch is a clear DecodeError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.errors import DecodeError
from streams.batches import BATCH_HEADER, Batches, is_batch, unpack

Item = tuple[str, str, bytes]  # (key, content type, value)


def _taken(batches: Batches) -> dict[str, list[tuple[str, bytes]]]:
    out: dict[str, list[tuple[str, bytes]]] = {}
    for topic, key, packed in batches.take():
        assert topic == "fleet-input"
        out.setdefault(key, []).extend(unpack(packed))
    return out


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["c1", "c2"]),
            st.sampled_from(["application/json", "application/msgpack"]),
            st.binary(max_size=64),
        ),
        max_size=60,
    )
)
def test_every_value_comes_out_once_in_its_keys_order(items: list[Item]) -> None:
    batches = Batches(max_items=7, max_bytes=300)
    for key, content_type, value in items:
        batches.add("fleet-input", key, value, content_type)
    expected: dict[str, list[tuple[str, bytes]]] = {}
    for key, content_type, value in items:
        expected.setdefault(key, []).append((content_type, value))
    assert _taken(batches) == expected
    assert list(batches.take()) == []  # taken: the next flush starts empty


def test_a_batch_is_split_before_it_passes_the_limits() -> None:
    batches = Batches(max_items=3, max_bytes=1000)
    for i in range(7):
        batches.add("fleet-input", "c1", bytes([i]) * 10, "application/msgpack")
    sizes = [len(unpack(packed)) for _, _, packed in batches.take()]
    assert sizes == [3, 3, 1]
    batches = Batches(max_items=100, max_bytes=150)  # 2 values of 40 bytes and their framing
    for i in range(4):
        batches.add("fleet-input", "c1", bytes([i]) * 40, "application/msgpack")
    assert [len(unpack(packed)) for _, _, packed in batches.take()] == [2, 2]


def test_cleared_values_are_never_written() -> None:
    batches = Batches()
    batches.add("fleet-input", "c1", b"x", "application/json")
    batches.clear()
    assert list(batches.take()) == []


@pytest.mark.parametrize("raw", [None, b"\xc1", b"\x92\x01\x02", b"\x91\x92\xa1a\x01"])
def test_a_malformed_batch_is_a_decode_error_saying_what_a_batch_is(raw: bytes | None) -> None:
    with pytest.raises(DecodeError, match="batch"):
        unpack(raw)


def test_only_records_with_the_header_are_batches() -> None:
    class Record:
        def __init__(self, headers: object) -> None:
            self.headers = headers

    assert is_batch(Record([(BATCH_HEADER, b"1")]))
    assert is_batch(Record({BATCH_HEADER: b"1"}))
    assert not is_batch(Record([("content-type", b"application/msgpack")]))
    assert not is_batch(Record(None))
