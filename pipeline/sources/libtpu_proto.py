"""Message classes and method paths of the libtpu runtime metrics service, built at import.

The service is defined once, in pipeline/sim/endpoints/proto/tpu_metric_service.proto. No
generated `_pb2` code is committed: a small reader turns that file's subset of proto3
(top-level messages, scalar and message fields, `repeated`, `oneof`, `reserved`, one service)
into a FileDescriptorProto, which a private descriptor pool turns into message classes. That
keeps the build free of protoc and of the generated-code/runtime version pairing; a test
compiles the same file with grpcio-tools' protoc and checks the two descriptors agree.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

PROTO_PACKAGE = "pipeline.sim.endpoints"
PROTO_FILE = "proto/tpu_metric_service.proto"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE,
    "float": _F.TYPE_FLOAT,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32,
    "uint32": _F.TYPE_UINT32,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_COMMENT = re.compile(r"//[^\n]*")
_BLOCK = re.compile(r"\b(message|service)\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", re.S)
_ONEOF = re.compile(r"\boneof\s+(\w+)\s*\{([^{}]*)\}", re.S)
_FIELD = re.compile(r"^\s*(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;", re.M)
_RPC = re.compile(r"\brpc\s+(\w+)\s*\(\s*([\w.]+)\s*\)\s*returns\s*\(\s*([\w.]+)\s*\)")


class ProtoSyntaxError(ValueError):
    """The .proto file uses something outside the subset this reader knows."""


@dataclass(frozen=True)
class Protocol:
    """The service: its full name and message classes by short name."""

    package: str
    service: str
    messages: dict[str, type[Any]]

    def method(self, name: str) -> str:
        return f"/{self.package}.{self.service}/{name}"


def file_descriptor(
    text: str, name: str = "tpu_metric_service.proto"
) -> descriptor_pb2.FileDescriptorProto:
    """Read the supported proto3 subset into a FileDescriptorProto."""
    text = _COMMENT.sub("", text)
    package = re.search(r"\bpackage\s+([\w.]+)\s*;", text)
    if package is None:
        raise ProtoSyntaxError("no `package` statement")
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package[1], syntax="proto3")
    proto.dependency.extend(re.findall(r'\bimport\s+"([^"]+)"\s*;', text))
    for kind, block_name, body in _BLOCK.findall(text):
        if kind == "message":
            _message(proto.message_type.add(name=block_name), body, package[1])
        else:
            _service(proto.service.add(name=block_name), body, package[1])
    return proto


def _message(message: descriptor_pb2.DescriptorProto, body: str, package: str) -> None:
    if re.search(r"\b(message|enum|map)\b|\boptional\b", body):
        raise ProtoSyntaxError(
            f"message {message.name}: nested types, maps and optional unsupported"
        )
    # Fields in declaration order (as protoc keeps them), each tagged with its oneof if any.
    oneofs = list(_ONEOF.finditer(body))
    for oneof in oneofs:
        message.oneof_decl.add(name=oneof[1])
    for found in _FIELD.finditer(body):
        repeated, type_name, field_name, number = found.groups()
        field = message.field.add(name=field_name, number=int(number), json_name=_camel(field_name))
        field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
        if type_name in _SCALARS:
            field.type = _SCALARS[type_name]
        else:
            field.type = _F.TYPE_MESSAGE
            field.type_name = _qualified(type_name, package)
        inside = [i for i, o in enumerate(oneofs) if o.start() < found.start() < o.end()]
        if inside:
            field.oneof_index = inside[0]
    outside = _ONEOF.sub("", body)
    for reserved in re.findall(r"\breserved\s+([\d,\s]+);", outside):
        for number in reserved.replace(" ", "").split(","):
            message.reserved_range.add(start=int(number), end=int(number) + 1)


def _service(service: descriptor_pb2.ServiceDescriptorProto, body: str, package: str) -> None:
    for method, request, response in _RPC.findall(body):
        service.method.add(
            name=method,
            input_type=_qualified(request, package),
            output_type=_qualified(response, package),
        )


def _qualified(type_name: str, package: str) -> str:
    return f".{type_name}" if "." in type_name else f".{package}.{type_name}"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@functools.cache
def runtime_protocol() -> Protocol:
    """The RuntimeMetricService messages, from the packaged .proto (read once)."""
    text = resources.files(PROTO_PACKAGE).joinpath(PROTO_FILE).read_text(encoding="utf-8")
    proto = file_descriptor(text)
    # A private pool: a process that also loads tpu-info's generated code must not clash.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(proto)
    messages = {
        message.name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{proto.package}.{message.name}")
        )
        for message in proto.message_type
    }
    return Protocol(package=proto.package, service=proto.service[0].name, messages=messages)
