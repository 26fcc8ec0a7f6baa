"""Encode and decode topic values; bad input becomes one typed error the runtime routes to the DLQ.

The error message always says which field was wrong, what was expected and what arrived, so
whoever reads the dead-letter topic can fix the producer without a debugger.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from pipeline.errors import DecodeError
from pipeline.model import TOPIC_VALUES, Event

E = TypeVar("E", bound=Event)

_ENCODER = msgspec.json.Encoder()
_GENERIC = msgspec.json.Decoder()
_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")
_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.S)
_MAX_SHOWN = 80


def _union_decoder() -> msgspec.json.Decoder[Any]:
    # One decoder over the tagged union of every topic value: the `schema` tag is then
    # required, and a value sent to the wrong topic is named by what it really is.
    union = TOPIC_VALUES["gpu_sample"]
    for cls in list(TOPIC_VALUES.values())[1:]:
        union = union | cls  # type: ignore[assignment]
    return msgspec.json.Decoder(type=union)


_DECODER = _union_decoder()


def encode(event: Event) -> bytes:
    return _ENCODER.encode(event)


def decode(raw: bytes, expected: type[E]) -> E:
    """Decode one topic value of type `expected`, or raise DecodeError saying what is wrong."""
    try:
        event = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise _validation_error(raw, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(
            field="$", expected="a JSON object", got=_near_error(raw, str(exc))
        ) from None
    if not isinstance(event, expected):
        raise DecodeError(
            field="$.schema",
            expected=f"{expected.__struct_config__.tag!r}",
            got=repr(event.__struct_config__.tag),
        )
    return event


def _validation_error(raw: bytes, message: str) -> DecodeError:
    match = _MSGSPEC_ERROR.match(message)
    assert match is not None  # the pattern matches any string
    what, path = match["what"], match["path"] or "$"
    if what.startswith("Object missing required field"):
        missing = what.split("`")[1]
        field = f"{path}.{missing}" if path != "$" else f"$.{missing}"
        return DecodeError(field=field, expected="a value (required field)", got="nothing")
    if what.startswith("Invalid value") and path == "$.schema":
        return DecodeError(field=path, expected="a known '<name>/<version>' schema", got=what[14:])
    if ": expected " in what:
        # raised by a model's __post_init__: "<where>: expected ..., got ..."
        where, _, rest = what.partition(": expected ")
        expected, _, got = rest.rpartition(", got ")
        return DecodeError(field=f"{path} ({where})", expected=expected, got=got)
    if what == "Number out of range":
        return DecodeError(
            field=path, expected="a finite number", got="a number beyond float range"
        )
    expected, _, got_type = what.removeprefix("Expected ").partition(", got ")
    got = _value_at(raw, path)
    return DecodeError(field=path, expected=expected, got=f"{got_type} {got}" if got_type else got)


def _value_at(raw: bytes, path: str) -> str:
    try:
        node: Any = _GENERIC.decode(raw)
    except (msgspec.DecodeError, ValueError):
        return _shown(raw)
    for name, index in (m.groups() for m in _PATH_PART.finditer(path[1:])):
        if name is not None and isinstance(node, dict):
            node = node.get(name)
        elif index is not None and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        elif isinstance(node, dict):  # [...]: a dict key or value; show the whole mapping
            break
        else:
            return "nothing"
    return _shown(_ENCODER.encode(node))


def _near_error(raw: bytes, message: str) -> str:
    # "JSON is malformed: invalid character (byte 245)": show the bytes around the culprit
    found = re.search(r"\(byte (\d+)\)", message)
    if found is None:
        return f"{_shown(raw)} ({message})"
    at = int(found.group(1))
    window = raw[max(0, at - 20) : at + 20].decode("utf-8", errors="replace")
    return f"{window!r} at byte {at} ({message})"


def _shown(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + f"… ({len(text)} chars)"


_PCI = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.[0-7])?$"
)


def normalize_pci(bus_id: str) -> str:
    """'00000000:53:00.0' (DCGM) and '0000:53:00' (kernel log) → '0000:53:00'."""
    match = _PCI.match(bus_id.strip())
    if match is None:
        raise DecodeError(field="pci_bus_id", expected="a PCI id like 0000:53:00", got=repr(bus_id))
    domain = (match["domain"] or "0000")[-4:]
    return f"{domain}:{match['bus']}:{match['dev']}".lower()
