"""Metric names are checked against their pattern once per distinct name (model.MetricNames),
not by the decoder for every key: the check must still accept and refuse exactly what the
pattern does, in both wire formats, whether or not the name was seen before."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import schemas_tool
from pipeline.errors import DecodeError
from pipeline.model import DCGM_NAMES, LIBTPU_NAMES, TOPIC_VALUES, GpuSample, TpuSample
from pipeline.wire import codec

SCHEMAS = schemas_tool.SCHEMA_DIR
NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.from_regex(r"DCGM_[A-Z0-9_]{1,8}\n?", fullmatch=True),
    st.from_regex(r"[a-z0-9_]{1,8}\n?", fullmatch=True),
)


def _value(name: str) -> dict[str, Any]:
    path = SCHEMAS / "samples" / schemas_tool.file_name(TOPIC_VALUES[name])
    value: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    return value


def _with_name(value: dict[str, Any], readings: str, metric: str) -> dict[str, Any]:
    readings_list = [dict(r, metrics=dict(r["metrics"])) for r in value[readings]]
    readings_list[-1]["metrics"][metric] = 1.0
    return dict(value, **{readings: readings_list})


def _accepted(value: dict[str, Any], cls: type[Any], fmt: str) -> bool:
    raw = msgspec.msgpack.encode(value) if fmt == "msgpack" else msgspec.json.encode(value)
    content_type = codec.MSGPACK if fmt == "msgpack" else None
    try:
        codec.decode(raw, cls, content_type=content_type)
    except DecodeError as exc:
        assert ".metrics): expected" in str(exc) and repr(metric_of(value)) in str(exc)
        return False
    return True


def metric_of(value: dict[str, Any]) -> str:
    readings = value.get("gpus") or value["chips"]
    return str(list(readings[-1]["metrics"])[-1])


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=NAMES, fmt=st.sampled_from(["msgpack", "json"]), again=st.booleans())
def test_a_metric_name_is_accepted_exactly_when_it_matches_the_pattern(
    name: str, fmt: str, again: bool
) -> None:
    for sample, readings, cls, names in (
        ("gpu_sample", "gpus", GpuSample, DCGM_NAMES),
        ("tpu_sample", "chips", TpuSample, LIBTPU_NAMES),
    ):
        value = _with_name(_value(sample), readings, name)
        expected = re.search(names.pattern, name) is not None  # msgspec's `pattern` semantics
        assert _accepted(value, cls, fmt) is expected, (name, sample)
        if again:  # the second time, from the set of known names
            assert _accepted(value, cls, fmt) is expected, (name, sample)


def test_a_bad_name_is_a_dead_letter_naming_the_reading_pattern_and_name() -> None:
    value = _with_name(_value("gpu_sample"), "gpus", "dcgm_fi_dev_gpu_temp")
    raw = msgspec.msgpack.encode(value)
    try:
        codec.decode(raw, GpuSample, content_type=codec.MSGPACK)
    except DecodeError as exc:
        assert exc.reason == "invalid"
        assert exc.field.startswith(f"$.gpus[{len(value['gpus']) - 1}] (gpu ")
        assert exc.expected == "a dcgm-exporter field name matching '^DCGM_[A-Z0-9_]+$'"
        assert exc.got == "'dcgm_fi_dev_gpu_temp'"
    else:
        raise AssertionError("a lower-case DCGM name was accepted")


def test_the_schema_still_states_the_name_pattern() -> None:
    for cls, reading, names in (
        (GpuSample, "GpuReading", DCGM_NAMES),
        (TpuSample, "TpuChipReading", LIBTPU_NAMES),
    ):
        metrics = schemas_tool.render(cls)["$defs"][reading]["properties"]["metrics"]
        assert metrics["propertyNames"] == {"pattern": names.pattern}
