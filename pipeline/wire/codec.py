"""Encode and decode topic values; bad input becomes one typed error the runtime routes to the DLQ.

`decode` turns ANY bytes into a value or a DecodeError, never another exception: a consumer that
catches DecodeError can dead-letter the record and go on. The error's `reason` says what kind of
bad it is (see pipeline.errors: tombstone, too_large, too_deep, invalid), and its message says
which field was wrong, what was expected and what arrived, so whoever reads the dead-letter topic
can fix the producer without a debugger.

Two wire formats. JSON is accepted on every topic and is the format of what downstream
consumers read (actions, alerts, node states, findings). The high-volume telemetry values (GPU,
TPU and ICI samples) may be msgpack, smaller and cheaper to parse: such a record carries
the header `content-type: application/msgpack` (`record_headers`), and a consumer decodes by
that header (`decode(..., content_type=...)`; no header means JSON). The JSON Schemas describe
the value in either format: msgpack encodes the same fields with the same names.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

import msgspec
import msgspec.inspect as mi

from pipeline.errors import DecodeError
from pipeline.model import (
    TOPIC_VALUES,
    Action,
    DeadLetter,
    Event,
    FabricSample,
    FabricTick,
    Finding,
    GpuSample,
    GpuSampleV2,
    IciSample,
    NodeEvent,
    NodeState,
    PeerSample,
    Proposal,
    TpuSample,
    Utilization,
    XidEventV1,
)

E = TypeVar("E", bound=Event)
CONTENT_TYPE = "content-type"  # the record header naming the value's format
JSON = "application/json"
MSGPACK = "application/msgpack"
Format = Literal["msgpack", "json"]
# the values FleetPulse's producers may write as msgpack (KafkaSettings.telemetry_format)
FAST = (GpuSample, TpuSample, IciSample, FabricSample, PeerSample, FabricTick)


# --- earlier versions -----------------------------------------------------------------------
# A rolling upgrade leaves records of the previous version of each schema on the topics (and a
# writer not yet rolled keeps writing them), so each current schema's previous version is
# still read: a struct of the current fields under the old tag, upgraded to the current value
# on decode. Every previous version so far is the current one narrowed (fewer enum values, a
# field the current one adds with its default), none renamed a field: its values decode as
# they are, and the fields it lacks get the current schema's defaults (docs/upgrading.md).
# Each is a subclass of its current struct, so runtime/replay.py finds the old tags of a value.


class ActionV2(Action, frozen=True, kw_only=True, tag="action/2"):
    """action/2: no switch or link targets, no repair_link / repair_switch kinds (v3 adds
    them); every field as in action/3."""


class ProposalV2(Proposal, frozen=True, kw_only=True, tag="proposal/2"):
    """proposal/2: as proposal/3 without switch or link targets and their repair kinds."""


class FindingV1(Finding, frozen=True, kw_only=True, tag="finding/1"):
    """finding/1: as finding/2 without network entities (nic, fabric_port, switch, link),
    switch or link targets, or repair_link / repair_switch recommendations."""


class NodeEventV1(NodeEvent, frozen=True, kw_only=True, tag="node_event/1"):
    """node_event/1: the kinds cordoned, uncordoned, drained, deleted, repaired, created only
    (v2 adds held, blocked, skipped, repair_requested, ready, not_ready, refused)."""


class NodeStateV1(NodeState, frozen=True, kw_only=True, tag="node_state/1"):
    """node_state/1: as node_state/2, its target a node or slice only."""


class DeadLetterV1(DeadLetter, frozen=True, kw_only=True, tag="dead_letter/1"):
    """dead_letter/1: no `reason` (v2 adds it; an upgraded letter has the default "")."""


class FabricSampleV1(FabricSample, frozen=True, kw_only=True, tag="fabric_sample/1"):
    """fabric_sample/1: ports without `saturated` and no "unknown" link layer (v2 adds both)."""


class UtilizationV1(Utilization, frozen=True, kw_only=True, tag="utilization/1"):
    """utilization/1: no `step_compute_s` (v2 adds it; an upgraded row has null)."""


# earlier versions still read, each upgraded to the current value on decode (`upgraded`)
OLDER: tuple[type[Event], ...] = (
    GpuSampleV2, XidEventV1, ActionV2, ProposalV2, FindingV1, NodeEventV1, NodeStateV1,
    DeadLetterV1, FabricSampleV1, UtilizationV1,
)  # fmt: skip


def upgraded(event: Event) -> Event:
    """The current value of an earlier version's value (`OLDER`); any other value as it is.

    A version with its own `upgraded` (one that maps fields) uses it; the others are their
    current struct's fields under an older tag, handed on as that struct."""
    if not isinstance(event, OLDER):
        return event
    own = getattr(event, "upgraded", None)
    if own is not None:
        return own()  # type: ignore[no-any-return]
    current = next(c for c in type(event).__mro__[1:] if c in _CURRENT)
    return current(**msgspec.structs.asdict(event))  # type: ignore[no-any-return]

_ENCODER = msgspec.json.Encoder()
_GENERIC = msgspec.json.Decoder()
_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")
_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.S)
_MAX_SHOWN = 80
# The default size limit, for callers without settings (backtest): KafkaSettings.max_value_bytes.
MAX_VALUE_BYTES = 1 << 20


_CURRENT = frozenset(TOPIC_VALUES.values())


def _union() -> Any:
    # One decoder over the tagged union of every topic value: the `schema` tag is then
    # required, and a value sent to the wrong topic is named by what it really is.
    union = TOPIC_VALUES["gpu_sample"]
    for cls in [*list(TOPIC_VALUES.values())[1:], *OLDER]:
        union = union | cls  # type: ignore[assignment]
    return union


_DECODER = msgspec.json.Decoder(type=_union())
_PACKED = msgspec.msgpack.Decoder(type=_union())
_PACKER = msgspec.msgpack.Encoder()
_GENERIC_PACKED = msgspec.msgpack.Decoder()
_TYPE_OF = {JSON: JSON, MSGPACK: MSGPACK, "application/x-msgpack": MSGPACK}


def encode(event: Event) -> bytes:
    """JSON: what downstream consumers read, and the fallback every consumer accepts."""
    return _ENCODER.encode(event)


def encode_as(event: Event, fmt: Format) -> tuple[bytes, str]:
    """The value in `fmt` if the event may be written so (telemetry), else JSON; and its
    content type, for the record's `content-type` header."""
    if fmt == "msgpack" and isinstance(event, FAST):
        return _PACKER.encode(event), MSGPACK
    return _ENCODER.encode(event), JSON


def record_headers(content_type: str) -> list[tuple[str, bytes]]:
    """The Kafka headers that say how a value is encoded."""
    return [(CONTENT_TYPE, content_type.encode())]


def content_type_of(headers: Any) -> str | None:
    """The `content-type` header of a Kafka record; None when there is none."""
    return header_of(headers, CONTENT_TYPE)


def header_of(headers: Any, wanted: str) -> str | None:
    """A header of a Kafka record by its (lower-case) name, from a list of (name, value) pairs
    or a mapping, as the clients give them; None when there is none."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    for name, value in pairs:
        if name.lower() == wanted:
            text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
            return str(text)
    return None


def decode(
    raw: bytes | None,
    expected: type[E],
    max_bytes: int = MAX_VALUE_BYTES,
    content_type: str | None = None,
) -> E:
    """Decode one topic value of type `expected`, or raise DecodeError saying what is wrong.

    `content_type`: the record's `content-type` header (None: JSON). Whatever `raw` holds:
    None (a tombstone), more than `max_bytes`, nesting too deep for the parser, invalid UTF-8
    or plain garbage all end as a DecodeError with its `reason`."""
    if content_type is not None and _media_type(content_type) == MSGPACK:
        return _decode_packed(raw, expected, max_bytes)
    if content_type is not None and _media_type(content_type) != JSON:
        raise DecodeError(
            field=f"header {CONTENT_TYPE}",
            expected=f"{JSON!r} or {MSGPACK!r}",
            got=repr(content_type[:_MAX_SHOWN]),
        )
    _check_size(raw, max_bytes)
    assert raw is not None
    try:
        event = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise _validation_error(raw, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(
            field="$", expected="a JSON object", got=_near_error(raw, str(exc))
        ) from None
    except RecursionError:
        # msgspec guards its recursion with the interpreter's limit: a few kB of brackets
        # reach it. Our values nest a handful of levels, so this is never a real record.
        raise _too_deep(raw) from None
    return _expect(event, expected)


def decode_all(raws: list[bytes], expected: type[E], max_bytes: int = MAX_VALUE_BYTES
               ) -> list[E] | None:
    """Many JSON values that are all `expected` values, decoded with no Python of ours per
    value (a batch record's hundreds of utilization rows); None when any is not one (too
    large, invalid, another type): `decode` each then says what is wrong with which."""
    if not raws or max(map(len, raws)) > max_bytes:
        return None
    try:
        events = list(map(_DECODER.decode, raws))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if set(map(type, events)) != {expected}:
        return None
    return events  # type: ignore[return-value]  # every one is an `expected`, checked above


def _media_type(content_type: str) -> str:
    # "application/json; charset=utf-8" is JSON
    media = content_type.partition(";")[0].strip().lower()
    return _TYPE_OF.get(media, media)


def _decode_packed(raw: bytes | None, expected: type[E], max_bytes: int) -> E:
    _check_size(raw, max_bytes)
    assert raw is not None
    try:
        event = _PACKED.decode(raw)
    except msgspec.ValidationError as exc:
        # explained like a JSON value: the same fields, shown as JSON when they can be
        raise _validation_error(_as_json(raw), str(exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(
            field="$", expected="a msgpack map (content-type: application/msgpack)",
            got=f"{_shown(raw)} ({exc})",
        ) from None  # fmt: skip
    except RecursionError:
        raise _too_deep(raw) from None
    return _expect(event, expected)


def _as_json(raw: bytes) -> bytes:
    try:
        return _ENCODER.encode(_GENERIC_PACKED.decode(raw))
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError, RecursionError):
        return raw


def _expect(event: Event, expected: type[E]) -> E:
    event = upgraded(event)
    if not isinstance(event, expected):
        raise DecodeError(
            field="$.schema",
            expected=f"{expected.__struct_config__.tag!r}",
            got=repr(event.__struct_config__.tag),
        )
    return event


def _check_size(raw: bytes | None, max_bytes: int) -> None:
    if raw is None:
        raise DecodeError(
            field="$", expected="a JSON object", got="a null value (tombstone)", reason="tombstone"
        )
    if len(raw) > max_bytes:
        # refused before parsing: a huge value costs memory and time even when it is garbage
        raise DecodeError(
            field="$",
            expected=f"at most {max_bytes} bytes (kafka.max_value_bytes)",
            got=f"{len(raw)} bytes",
            reason="too_large",
        )


def _too_deep(raw: bytes) -> DecodeError:
    return DecodeError(
        field="$",
        expected="a JSON object nested a few levels deep",
        got=f"{_shown(raw)} (nesting beyond the parser's recursion limit)",
        reason="too_deep",
    )


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
    if what.startswith("Invalid enum value "):
        # "Invalid enum value 'zap'": say which values the field takes
        got = what.removeprefix("Invalid enum value ")
        return DecodeError(field=path, expected=_allowed_at(raw, path), got=got)
    if ": expected " in what:
        # raised by a model's __post_init__: "<where>: expected ..., got ...", where a where
        # of "$.<field>" is a field of the struct at `path` (InvalidNameError)
        where, _, rest = what.partition(": expected ")
        expected, _, got = rest.rpartition(", got ")
        field = f"{path}{where[1:]}" if where.startswith("$.") else f"{path} ({where})"
        return DecodeError(field=field, expected=expected, got=got)
    if what == "Number out of range":
        return DecodeError(
            field=path, expected="a finite number", got="a number beyond float range"
        )
    expected, _, got_type = what.removeprefix("Expected ").partition(", got ")
    try:
        got = _value_at(raw, path)
    except RecursionError:  # valid at the top, too deep further down: decoded generically here
        return _too_deep(raw)
    return DecodeError(field=path, expected=expected, got=f"{got_type} {got}" if got_type else got)


def _generic(raw: bytes) -> Any:
    """The value as plain JSON, or None when it is not JSON (RecursionError passes through)."""
    try:
        return _GENERIC.decode(raw)
    except (msgspec.DecodeError, ValueError):
        return None


def _value_at(raw: bytes, path: str) -> str:
    node: Any = _generic(raw)
    if node is None:
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


def _allowed_at(raw: bytes, path: str) -> str:
    """"one of 'a', 'b'": the values of the Literal field at `path` of the value's own type."""
    try:
        tag = _generic(raw).get("schema")
    except (AttributeError, RecursionError):
        tag = None
    cls = next((c for c in TOPIC_VALUES.values() if c.__struct_config__.tag == tag), None)
    if cls is None:
        return "a known value"
    node: Any = mi.type_info(cls)
    for name, index in (m.groups() for m in _PATH_PART.finditer(path[1:])):
        node = _inner(node)
        if name is not None and isinstance(node, mi.StructType):
            node = next((f.type for f in node.fields if f.encode_name == name), None)
        elif index is not None and isinstance(node, mi.ListType):
            node = node.item_type
        elif isinstance(node, mi.DictType):
            node = node.value_type
        else:
            return "a known value"
    node = _inner(node)
    if not isinstance(node, mi.LiteralType):
        return "a known value"
    return "one of " + ", ".join(repr(value) for value in node.values)


def _inner(node: Any) -> Any:
    # `X | None` and Annotated wrappers (Meta with a description): the part that is not None
    while isinstance(node, mi.Metadata):
        node = node.type
    if isinstance(node, mi.UnionType):
        node = next((t for t in node.types if not isinstance(t, mi.NoneType)), node)
    while isinstance(node, mi.Metadata):
        node = node.type
    return node


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
