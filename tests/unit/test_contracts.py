"""The contracts: schemas agree with the model, samples are valid, bad input is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import schemas_tool
from pipeline.errors import DecodeError
from pipeline.model import TOPIC_VALUES, Event
from pipeline.wire import codec
from tests.schema_strategies import from_schema

SCHEMAS = schemas_tool.SCHEMA_DIR
NAMES = sorted(TOPIC_VALUES)


def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / schemas_tool.file_name(TOPIC_VALUES[name])).read_text())


def _sample(name: str) -> dict[str, Any]:
    path = SCHEMAS / "samples" / schemas_tool.file_name(TOPIC_VALUES[name])
    return json.loads(path.read_text())


def test_committed_schemas_match_the_model() -> None:
    stale = [
        name
        for name, text in schemas_tool.rendered_files().items()
        if not (SCHEMAS / name).exists() or (SCHEMAS / name).read_text() != text
    ]
    assert stale == [], f"run `python -m pipeline.schemas_tool`; stale: {stale}"


def test_every_topic_value_has_a_schema_and_a_sample() -> None:
    files = {p.name for p in SCHEMAS.glob("*.v*.json")}
    samples = {p.name for p in (SCHEMAS / "samples").glob("*.json")}
    expected = {schemas_tool.file_name(TOPIC_VALUES[name]) for name in NAMES}
    assert files == expected
    assert samples == expected


@pytest.mark.parametrize("name", NAMES)
def test_sample_validates_and_decodes(name: str) -> None:
    sample = _sample(name)
    jsonschema.Draft202012Validator(_schema(name)).validate(sample)
    event = codec.decode(json.dumps(sample).encode(), TOPIC_VALUES[name])
    assert json.loads(codec.encode(event)) == sample


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_valid_2020_12(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(_schema(name))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_round_trip_of_schema_generated_values(name: str, data: st.DataObject) -> None:
    value = data.draw(from_schema(_schema(name)))
    event: Event = codec.decode(json.dumps(value).encode(), TOPIC_VALUES[name])
    assert codec.decode(codec.encode(event), TOPIC_VALUES[name]) == event


def _mutated(name: str, path: list[str | int], value: Any) -> bytes:
    sample = _sample(name)
    node = sample
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(sample).encode()


_DELETE = object()
MUTATIONS = [
    # (topic value, path, new value, field named in the message, words in the message)
    ("gpu_sample", ["ts"], "yesterday", "$.ts", "`int`"),
    ("gpu_sample", ["ts"], 1764424800, "$.ts", ">= 1000000000000"),
    ("gpu_sample", ["node"], _DELETE, "$.node", "required"),
    ("gpu_sample", ["node"], "../../etc", "$.node", '"../../etc"'),
    ("gpu_sample", ["node"], "node\x07bell", "$.node", "regex"),
    ("gpu_sample", ["pool"], "p" * 300, "$.pool", "length <= 253"),
    (
        "gpu_sample",
        ["gpus", 0, "metrics", "DCGM_FI_DEV_GPU_TEMP"],
        "hot",
        "$.gpus[0].metrics",
        "`float`",
    ),
    ("gpu_sample", ["gpus", 1, "index"], -1, "$.gpus[1].index", ">= 0"),
    ("tpu_sample", ["slice"], "a/b", "$.slice", '"a/b"'),
    ("tpu_sample", ["accelerator_type"], "v5p", "$.accelerator_type", "regex"),
    ("xid_event", ["xid"], _DELETE, "$.xid", "required"),
    ("xid_event", ["pci_bus_id"], "PCI:53", "$.pci_bus_id", "regex"),
    ("action", ["kind"], "explode", "$.kind", "'explode'"),
    ("action", ["target", "name"], "", "$.target.name", "length >= 1"),
    ("finding", ["severity"], "meh", "$.severity", "'meh'"),
    ("dead_letter", ["partition"], 1.5, "$.partition", "`int`"),
    ("alert", ["fingerprint"], "not-hex", "$.fingerprint", "regex"),
]


@pytest.mark.parametrize(("name", "path", "value", "field", "words"), MUTATIONS)
def test_mutated_samples_are_rejected_naming_the_field(
    name: str, path: list[str | int], value: Any, field: str, words: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode(_mutated(name, path, value), TOPIC_VALUES[name])
    assert caught.value.field.startswith(field), str(caught.value)
    assert words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_rejected(token: bytes) -> None:
    raw = json.dumps(_sample("gpu_sample")).encode().replace(b"61,", token + b",", 1)
    with pytest.raises(DecodeError) as caught:
        codec.decode(raw, TOPIC_VALUES["gpu_sample"])
    message = str(caught.value)
    assert "finite number" in message or "JSON is malformed" in message, message
    assert token.decode() in message or "float range" in message, message


def test_value_of_another_topic_is_named() -> None:
    raw = json.dumps(_sample("tpu_sample")).encode()
    with pytest.raises(DecodeError, match="expected 'gpu_sample/3', got 'tpu_sample/1'"):
        codec.decode(raw, TOPIC_VALUES["gpu_sample"])


def test_a_gpu_sample_of_the_previous_version_is_read_as_the_current_one() -> None:
    # producers not yet upgraded keep writing gpu_sample/2; v3 only added step_compute_s
    sample = _sample("gpu_sample") | {"schema": "gpu_sample/2"}
    for gpu in sample["gpus"]:
        gpu.pop("step_compute_s", None)
    raw = json.dumps(sample).encode()
    for value, content_type in ((raw, None), (msgspec.msgpack.encode(sample), codec.MSGPACK)):
        event = codec.decode(value, TOPIC_VALUES["gpu_sample"], content_type=content_type)
        assert type(event) is TOPIC_VALUES["gpu_sample"]
        assert json.loads(codec.encode(event))["schema"] == "gpu_sample/3"
        assert all(gpu.step_compute_s is None for gpu in event.gpus)  # type: ignore[attr-defined]
        assert [g.uuid for g in event.gpus] == [g["uuid"] for g in sample["gpus"]]  # type: ignore[attr-defined]


def test_missing_schema_tag_is_rejected() -> None:
    sample = _sample("action")
    del sample["schema"]
    with pytest.raises(DecodeError, match=r"\$\.schema"):
        codec.decode(json.dumps(sample).encode(), TOPIC_VALUES["action"])


def test_unknown_schema_version_is_rejected() -> None:
    sample = _sample("action") | {"schema": "action/9"}
    with pytest.raises(DecodeError, match="action/9"):
        codec.decode(json.dumps(sample).encode(), TOPIC_VALUES["action"])


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:53:00.0", "0000:53:00"),
        ("0000:53:00", "0000:53:00"),
        ("0000:B5:00", "0000:b5:00"),
        ("00000008:01:00.0", "0008:01:00"),
        ("53:00.0", "0000:53:00"),
    ],
)
def test_pci_ids_normalise_to_the_kernel_form(raw: str, normal: str) -> None:
    assert codec.normalize_pci(raw) == normal


@pytest.mark.parametrize("bad", ["", "PCI:53", "0000:53", "zz:00:00"])
def test_bad_pci_ids_are_rejected(bad: str) -> None:
    with pytest.raises(DecodeError, match="PCI id"):
        codec.normalize_pci(bad)


def test_schema_files_ship_inside_the_package() -> None:
    import importlib.resources

    shipped = importlib.resources.files("pipeline.schemas")
    assert shipped.joinpath("gpu_sample.v3.json").is_file()
    assert Path(str(shipped.joinpath("samples"))).is_dir()


def _properties(node: Any, where: str = "$") -> list[tuple[str, str, Any]]:
    """Every (place, property name, property schema) in a schema, $defs included."""
    found: list[tuple[str, str, Any]] = []
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            found.append((where, name, prop))
        for key, child in node.items():
            found += _properties(child, f"{where}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _properties(child, f"{where}[{i}]")
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_property_of_every_schema_is_described(name: str) -> None:
    # consumers in other languages read the schema files, not pipeline/model.py
    schema = schemas_tool.render(TOPIC_VALUES[name])
    bare = [f"{where}.{prop}" for where, prop, body in _properties(schema)
            if not str(body.get("description", "")).strip()]
    assert bare == [], f"{name}: properties without a description: {bare}"


@pytest.mark.parametrize("name", NAMES)
def test_schema_ids_are_uris_that_name_the_version(name: str) -> None:
    from urllib.parse import urlparse

    cls = TOPIC_VALUES[name]
    schema_id = _schema(name)["$id"]
    parsed = urlparse(schema_id)
    assert parsed.scheme == "https" and parsed.netloc, schema_id
    tag_name, version = schemas_tool.schema_tag(cls).split("/")
    assert parsed.path == f"/schemas/{tag_name}/v{version}.json", schema_id


def test_what_an_actuator_needs_is_in_the_action_schema() -> None:
    props = _schema("action")["properties"]
    for word in ("dedupe", "fleet.events.node"):  # lowercased
        assert word in props["action_id"]["description"].lower()
    assert "must not be started" in props["expires_at"]["description"]
    assert "do not touch" in props["dry_run"]["description"]
    kinds = props["kind"]["description"]
    for kind in props["kind"]["enum"]:
        assert f"{kind}:" in kinds, f"action kind {kind} is not explained"
    assert "reset_gpu" in props["device"]["description"]


def _ce_expected(name: str, sample: dict[str, Any]) -> tuple[str, str]:
    """(ce_type, ce_subject) a consumer routes on, from the sample's own fields."""
    if name == "alert":
        labels = sample["labels"]
        where = labels.get("node") or labels.get("slice") or labels["pool"]
        return f"io.fleetpulse.alert.{sample['status']}", f"{labels['cluster']}/{where}"
    target = sample["target"]
    kind = sample["kind"] if name == "action" else sample["state"]
    return f"io.fleetpulse.{name}.{kind}", f"{target['cluster']}/{target['name']}"


@pytest.mark.parametrize("name", ["action", "alert", "node_state"])
def test_cloudevents_headers_round_trip_through_the_sdk_with_the_value_unchanged(
    name: str,
) -> None:
    from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
    from cloudevents.core.formats.json import JSONFormat

    from pipeline.wire import headers as cloudevents_headers

    event = codec.decode(json.dumps(_sample(name)).encode(), TOPIC_VALUES[name])
    value = codec.encode(event)
    headers = dict(cloudevents_headers.headers(event, value))
    assert set(headers) == {
        "ce_specversion", "ce_id", "ce_source", "ce_type", "ce_subject", "ce_time",
        "ce_dataschema", "content-type",
    }  # fmt: skip
    assert headers["content-type"] == b"application/json"
    assert headers["ce_dataschema"] == _schema(name)["$id"].encode()
    ce = from_binary(KafkaMessage(headers=headers, key=None, value=value), JSONFormat())
    assert ce.get_specversion() == "1.0"
    assert ce.get_data() == json.loads(value)  # the value is the schema's JSON, unchanged
    assert int(ce.get_time().timestamp() * 1000) == event.ts  # type: ignore[union-attr]
    # content-derived: the same event gives the same id; the action's is its action_id
    assert dict(cloudevents_headers.headers(event, value))["ce_id"] == headers["ce_id"]
    assert (ce.get_type(), ce.get_subject()) == _ce_expected(name, _sample(name))
    if name == "action":
        assert ce.get_id() == event.action_id  # type: ignore[attr-defined]


def test_only_actions_alerts_and_node_states_carry_cloudevents_headers() -> None:
    from pipeline.wire import headers as cloudevents_headers

    finding = codec.decode(json.dumps(_sample("finding")).encode(), TOPIC_VALUES["finding"])
    assert cloudevents_headers.headers(finding, codec.encode(finding)) == []
