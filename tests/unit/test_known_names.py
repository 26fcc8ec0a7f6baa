"""Name fields (cluster, pool, zone, node, slice, job, ...) are checked against NAME_PATTERN by
each struct's __post_init__ (model.KnownNames), once per distinct name, not by the decoder for
every value: every Name field of every struct must still be checked, and the check must accept
and refuse exactly what the pattern does, whether or not the name was seen before."""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import model, schemas_tool
from pipeline.errors import DecodeError, InvalidNameError
from pipeline.model import NAME_PATTERN, TOPIC_VALUES, Name
from pipeline.wire import codec

_NAME_META = typing.get_args(Name)[1]


def _is_name(tp: Any) -> bool:
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        return any(a is _NAME_META for a in args[1:]) or _is_name(args[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_is_name(a) for a in typing.get_args(tp))
    return False


def _name_fields() -> list[tuple[type[msgspec.Struct], str]]:
    found = []
    for cls in vars(model).values():
        if inspect.isclass(cls) and issubclass(cls, msgspec.Struct):
            hints = typing.get_type_hints(cls, include_extras=True)
            found += [(cls, f) for f in cls.__struct_fields__ if _is_name(hints[f])]
    return found


NAME_FIELDS = _name_fields()


def test_the_structs_have_name_fields_to_check() -> None:
    # the introspection itself must find what we know is there
    assert (model.Utilization, "node") in NAME_FIELDS
    assert (model.Target, "name") in NAME_FIELDS
    assert (model.GpuReading, "job") in NAME_FIELDS
    assert len(NAME_FIELDS) > 40


@pytest.mark.parametrize(
    ("cls", "field"), NAME_FIELDS, ids=[f"{c.__name__}.{f}" for c, f in NAME_FIELDS]
)
def test_every_name_field_of_every_struct_is_checked(cls: type[msgspec.Struct], field: str) -> None:
    # the struct's own __post_init__ on an object whose only non-null field is a bad name
    bad = types.SimpleNamespace(**{**dict.fromkeys(cls.__struct_fields__), field: "../etc"})
    with pytest.raises(InvalidNameError, match=rf"^\$\.{field}: expected a name matching regex"):
        cls.__post_init__(bad)  # type: ignore[attr-defined]


def _sample(name: str) -> dict[str, Any]:
    path = schemas_tool.SCHEMA_DIR / "samples" / schemas_tool.file_name(TOPIC_VALUES[name])
    value: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    return value


NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,8}\n?", fullmatch=True),
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=NAMES, fmt=st.sampled_from(["msgpack", "json"]), again=st.booleans())
def test_a_name_is_accepted_exactly_when_it_matches_the_pattern(
    name: str, fmt: str, again: bool
) -> None:
    value = dict(_sample("utilization"), node=name)
    raw = msgspec.msgpack.encode(value) if fmt == "msgpack" else msgspec.json.encode(value)
    content_type = codec.MSGPACK if fmt == "msgpack" else None
    expected = re.search(NAME_PATTERN, name) is not None  # msgspec's `pattern` semantics
    for _ in range(2 if again else 1):  # the second time, from the set of known names
        try:
            row = codec.decode(raw, model.Utilization, content_type=content_type)
        except DecodeError as exc:
            assert not expected, str(exc)
            assert exc.field == "$.node", str(exc)
            assert exc.got == msgspec.json.encode(name).decode(), str(exc)
        else:
            assert expected and row.node == name


def test_a_bad_name_in_a_nested_struct_is_named_by_its_path() -> None:
    value = _sample("action")
    value["target"]["pool"] = "a/b"
    with pytest.raises(DecodeError) as caught:
        codec.decode(msgspec.json.encode(value), model.Action)
    assert caught.value.field == "$.target.pool"
    assert caught.value.expected == f"a name matching regex {NAME_PATTERN!r}"
    assert caught.value.got == '"a/b"'


@pytest.mark.parametrize(
    ("topic", "readings", "field", "bad", "what"),
    [
        ("gpu_sample", "gpus", "uuid", "GPU-xyz", "a GPU UUID"),
        ("gpu_sample", "gpus", "pci_bus_id", "PCI:18", "a PCI bus id"),
        ("fabric_sample", "ports", "device", "-mlx5_0", "an HCA or NIC name"),
        ("fabric_sample", "ports", "netdev", "ib 0", "a network interface name"),
    ],
)
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_reading_s_device_names_are_checked_once_known_or_not(
    topic: str, readings: str, field: str, bad: str, what: str, fmt: str
) -> None:
    value = _sample(topic)
    good = value[readings][0][field]
    value[readings][-1][field] = bad
    encode = msgspec.msgpack.encode if fmt == "msgpack" else msgspec.json.encode
    content_type = codec.MSGPACK if fmt == "msgpack" else None
    for _ in range(2):  # the good names are known the second time
        with pytest.raises(DecodeError) as caught:
            codec.decode(encode(value), TOPIC_VALUES[topic], content_type=content_type)
        assert caught.value.field == f"$.{readings}[{len(value[readings]) - 1}].{field}"
        assert caught.value.expected.startswith(f"{what} matching regex")
        assert caught.value.got == msgspec.json.encode(bad).decode()
    value[readings][-1][field] = good
    codec.decode(encode(value), TOPIC_VALUES[topic], content_type=content_type)


def test_a_struct_built_with_a_bad_name_is_a_decode_error_for_the_source_to_dead_letter() -> None:
    # sources build events from what an API said and dead-letter a DecodeError
    with pytest.raises(DecodeError) as caught:
        model.Target(cluster="c1", kind="node", name="gpu 7", pool="p", zone="z")
    assert (caught.value.field, caught.value.got) == ("$.name", '"gpu 7"')


def test_the_schema_still_states_the_name_pattern() -> None:
    node = schemas_tool.render(model.Utilization)["properties"]["node"]
    assert node["pattern"] == NAME_PATTERN
    assert (node["minLength"], node["maxLength"]) == (1, 253)


def test_known_names_stop_growing_at_their_bound() -> None:
    names = model.KnownNames(NAME_PATTERN, "a name")
    names.MAX_KNOWN = 3
    row = types.SimpleNamespace(node="")
    for i in range(10):
        row.node = f"n{i}"
        names.check(row, "node")
    assert len(names._known) == 3
    row.node = "../n9"
    with pytest.raises(ValueError, match="got"):
        names.check(row, "node")  # past the bound, still checked
