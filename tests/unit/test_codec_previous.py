"""A rolling upgrade loses no record: every current schema whose version is above 1 still reads
its previous version's sample (tests/data/previous/, from the schemas' git history), upgraded
to the current value: each field the old record had kept, each one it lacked at its default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.errors import DecodeError
from pipeline.model import TOPIC_VALUES, Event
from pipeline.wire import codec

PREVIOUS = Path(__file__).resolve().parents[1] / "data" / "previous"


def _version(cls: type[Event]) -> tuple[str, int]:
    name, _, version = str(cls.__struct_config__.tag).partition("/")
    return name, int(version)


UPGRADED = sorted(
    (name, version) for name, version in map(_version, TOPIC_VALUES.values()) if version > 1
)


def _previous(name: str, version: int) -> Path:
    return PREVIOUS / f"{name}.v{version - 1}.json"


def _changed(old: Any, new: Any, path: str) -> list[str]:
    """Where a value of the old record is not the same in the upgraded one (the fields the
    upgraded one adds are not looked at here)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k, v in old.items() for d in _changed(v, new.get(k, "<absent>"),
                                                             f"{path}.{k}")]  # fmt: skip
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (o, n) in enumerate(zip(old, new, strict=True))
                for d in _changed(o, n, f"{path}[{i}]")]  # fmt: skip
    return [] if old == new else [f"{path}: {old!r} became {new!r}"]


def test_every_upgraded_schema_has_its_previous_sample() -> None:
    missing = [str(_previous(n, v).name) for n, v in UPGRADED if not _previous(n, v).exists()]
    assert not missing, f"previous-version samples missing from {PREVIOUS}: {missing}"
    assert {"gpu_sample", "xid_event", "action", "dead_letter"} <= {n for n, _ in UPGRADED}


@pytest.mark.parametrize(("name", "version"), UPGRADED, ids=[n for n, _ in UPGRADED])
def test_previous_version_decodes_as_the_current_one(name: str, version: int) -> None:
    current = TOPIC_VALUES[name]
    raw = _previous(name, version).read_bytes()
    old = json.loads(raw)
    assert old["schema"] == f"{name}/{version - 1}", f"{_previous(name, version)}: {old['schema']}"

    event = codec.decode(raw, current)

    assert type(event) is current, f"{name}/{version - 1}: expected {current}, got {type(event)}"
    now = msgspec.to_builtins(event)
    assert now["schema"] == f"{name}/{version}"  # re-encoded, it is a current record
    changed = _changed({**old, "schema": now["schema"]}, now, "$")
    assert not changed, f"{name}/{version - 1} fields changed on upgrade: {changed}"
    # the fields the old record lacks, at the current schema's defaults: the old record read
    # as the current struct by msgspec itself, which fills them so
    as_current = msgspec.json.decode(json.dumps({**old, "schema": now["schema"]}), type=current)
    assert event == as_current


def test_previous_telemetry_decodes_from_msgpack_too() -> None:
    # a producer not yet upgraded may write its telemetry as msgpack (KafkaSettings)
    for path, cls in ((PREVIOUS / "gpu_sample.v2.json", TOPIC_VALUES["gpu_sample"]),):
        packed = msgspec.msgpack.encode(json.loads(path.read_bytes()))
        event = codec.decode(packed, cls, content_type=codec.MSGPACK)
        assert type(event) is cls
        assert event == codec.decode(path.read_bytes(), cls)


def test_previous_version_on_the_wrong_topic_is_still_refused() -> None:
    # upgrading does not make a value of another schema acceptable: named by its old tag's
    # current name
    raw = (PREVIOUS / "node_event.v1.json").read_bytes()
    with pytest.raises(DecodeError) as refused:
        codec.decode(raw, TOPIC_VALUES["action"])
    assert "node_event/2" in str(refused.value) and "action/3" in str(refused.value)


def test_every_older_struct_is_a_previous_version_of_a_current_one() -> None:
    # pipeline.runtime.replay routes an old tag to its current topic by subclass; no stray version
    tags = {str(cls.__struct_config__.tag) for cls in codec.OLDER}
    expected = {f"{n}/{v - 1}" for n, v in UPGRADED}
    assert tags == expected, f"OLDER: expected {sorted(expected)}, got {sorted(tags)}"
    for cls in codec.OLDER:
        assert any(issubclass(cls, current) for current in TOPIC_VALUES.values()), cls
