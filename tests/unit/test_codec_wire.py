"""The two wire formats: msgpack for telemetry (marked by a content-type header), JSON always
accepted and always the format of what downstream consumers read (pipeline/wire/codec.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import schemas_tool
from pipeline.config import load_settings
from pipeline.errors import DecodeError
from pipeline.model import TOPIC_VALUES, Event, GpuSample, XidEvent
from pipeline.runtime.embedded import collect
from pipeline.wire import codec
from streams.records import decode_value
from streams.testing import embedded_outputs
from tests import lake_fixture
from tests.schema_strategies import from_schema

SCHEMAS = schemas_tool.SCHEMA_DIR
SETTINGS = load_settings(environ={})
FAST = ["gpu_sample", "tpu_sample", "ici_sample", "fabric_sample", "peer_sample", "fabric_tick"]


def _sample(name: str) -> Event:
    path = SCHEMAS / "samples" / schemas_tool.file_name(TOPIC_VALUES[name])
    return codec.decode(path.read_bytes(), TOPIC_VALUES[name])


class _Record:
    """What faust hands the worker (the fields streams.records reads)."""

    def __init__(self, value: bytes | None, headers: Any) -> None:
        self.topic, self.partition, self.offset, self.timestamp = "t", 0, 0, 0.0
        self.key, self.value, self.headers = b"k", value, headers


@pytest.mark.parametrize("name", FAST)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_telemetry_round_trips_through_msgpack(name: str, data: st.DataObject) -> None:
    schema = json.loads((SCHEMAS / schemas_tool.file_name(TOPIC_VALUES[name])).read_text())
    event = codec.decode(json.dumps(data.draw(from_schema(schema))).encode(), TOPIC_VALUES[name])
    value, content_type = codec.encode_as(event, "msgpack")
    assert content_type == codec.MSGPACK
    assert codec.decode(value, TOPIC_VALUES[name], content_type=content_type) == event


def test_only_telemetry_is_written_as_msgpack_and_json_can_be_chosen() -> None:
    for name, cls in TOPIC_VALUES.items():
        event = _sample(name)
        value, content_type = codec.encode_as(event, "msgpack")
        assert content_type == (codec.MSGPACK if name in FAST else codec.JSON), name
        assert codec.encode_as(event, "json") == (codec.encode(event), codec.JSON)
        assert codec.decode(value, cls, content_type=content_type) == event
    env = {"FLEETPULSE_KAFKA__TELEMETRY_FORMAT": "json"}
    assert load_settings(environ=env).kafka.telemetry_format == "json"
    assert SETTINGS.kafka.telemetry_format == "msgpack"


def test_a_json_record_is_accepted_where_the_producers_write_msgpack() -> None:
    gpu = _sample("gpu_sample")
    packed, content_type = codec.encode_as(gpu, "msgpack")
    headers = codec.record_headers(content_type)
    assert decode_value(_Record(packed, headers), GpuSample) == gpu
    assert decode_value(_Record(codec.encode(gpu), None), GpuSample) == gpu  # no header: JSON
    as_json = [("Content-Type", b"application/json; charset=utf-8")]
    assert decode_value(_Record(codec.encode(gpu), as_json), GpuSample) == gpu
    assert decode_value(_Record(packed, {"content-type": b"application/x-msgpack"}), GpuSample)


def test_msgpack_without_its_header_is_a_dead_letter_not_a_crash() -> None:
    packed, _ = codec.encode_as(_sample("gpu_sample"), "msgpack")
    with pytest.raises(DecodeError) as caught:
        decode_value(_Record(packed, None), GpuSample)
    assert caught.value.field == "$" and "JSON" in caught.value.expected


@pytest.mark.parametrize(
    ("raw", "content_type", "field", "words"),
    [
        (b"\xc1junk", codec.MSGPACK, "$", "msgpack map"),
        (b"{}", "text/xml", "header content-type", "'application/msgpack'"),
        (
            msgspec.msgpack.encode({**msgspec.to_builtins(_sample("gpu_sample")), "ts": "soon"}),
            codec.MSGPACK,
            "$.ts",
            "`int`",
        ),
        (
            msgspec.msgpack.encode({"schema": "gpu_sample/3"}),
            codec.MSGPACK,
            "$.ts",
            "required",
        ),
        (codec.encode_as(_sample("tpu_sample"), "msgpack")[0], codec.MSGPACK, "$.schema", "gpu"),
    ],
)
def test_bad_msgpack_names_the_field_what_was_expected_and_what_came(
    raw: bytes, content_type: str, field: str, words: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode(raw, GpuSample, content_type=content_type)
    assert caught.value.field == field
    assert words in str(caught.value), str(caught.value)


def test_msgpack_and_json_inputs_make_the_same_decisions() -> None:
    gpu, xid = _sample("gpu_sample"), _sample("xid_event")
    assert isinstance(gpu, GpuSample) and isinstance(xid, XidEvent)
    events: list[Event] = [msgspec.structs.replace(gpu, ts=gpu.ts + i * 10_000) for i in range(30)]
    events.insert(10, msgspec.structs.replace(xid, ts=gpu.ts + 95_000, node=gpu.node))
    as_json = msgspec.structs.replace(
        SETTINGS, kafka=msgspec.structs.replace(SETTINGS.kafka, telemetry_format="json")
    )
    packed = embedded_outputs(SETTINGS, events)
    assert packed == embedded_outputs(as_json, events)
    fed_as_objects = collect(SETTINGS, events)  # and finished: its last windows closed
    assert all(packed[topic] == fed_as_objects[topic] for topic in packed if topic != "utilization")
    assert [a.kind for a in packed["actions"]][:1] == ["cordon"]  # type: ignore[attr-defined]


def test_decode_all_gives_what_decode_gives_or_none_when_any_value_is_not_one() -> None:
    """The lake sink's path for a batch of JSON values: all of them `expected` values, or None
    (then each is decoded on its own to say what is wrong)."""
    xids = lake_fixture.XIDS
    raws = [codec.encode(x) for x in xids]
    assert codec.decode_all(raws, XidEvent) == [codec.decode(r, XidEvent) for r in raws]
    missing_tag = json.loads(raws[1])
    del missing_tag["schema"]
    another = codec.encode(lake_fixture.utilization()[0])
    for bad in (b"{", json.dumps(missing_tag).encode(), another, b" " * 300 + raws[0]):
        assert codec.decode_all([raws[0], bad], XidEvent, max_bytes=300) is None
    assert codec.decode_all([], XidEvent) is None
