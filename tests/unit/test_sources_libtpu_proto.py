"""The runtime-built libtpu descriptors agree with protoc's reading of the same .proto file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from pipeline.sources.libtpu_proto import (
    PROTO_FILE,
    PROTO_PACKAGE,
    ProtoSyntaxError,
    file_descriptor,
    runtime_protocol,
)


def _protoc_descriptor(proto: Path, out: Path) -> descriptor_pb2.FileDescriptorProto:
    includes = resources.files("grpc_tools") / "_proto"
    code = protoc.main(
        ["protoc", f"-I{proto.parent}", f"-I{includes}", f"--descriptor_set_out={out}", proto.name]
    )
    assert code == 0, "protoc rejected the .proto file"
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


def test_descriptor_matches_protoc(tmp_path: Path) -> None:
    proto = Path(str(resources.files(PROTO_PACKAGE).joinpath(PROTO_FILE)))
    ours = file_descriptor(proto.read_text(encoding="utf-8"), name=proto.name)
    theirs = _protoc_descriptor(proto, tmp_path / "set.pb")
    assert ours == theirs


def test_messages_round_trip_on_the_wire() -> None:
    protocol = runtime_protocol()
    metric_class = protocol.messages["Metric"]
    metric = metric_class()
    metric.attribute.key = "device-id"
    metric.attribute.value.int_attr = 3
    metric.gauge.as_double = 97.5
    metric.timestamp.seconds = 1_764_424_800
    wire = metric.SerializeToString()
    # field 3 (gauge) holds field 1 (as_double) as a fixed64: the layout libtpu's clients read
    assert b"\x1a\x09\x09" in wire
    assert metric_class.FromString(wire) == metric
    assert protocol.method("GetRuntimeMetric") == (
        "/tpu.monitoring.runtime.RuntimeMetricService/GetRuntimeMetric"
    )


@pytest.mark.parametrize(
    "text",
    [
        "syntax = 'proto3'; message A { string a = 1; }",  # no package
        "package p; message A { message B { int32 x = 1; } }",  # nested message
        "package p; message A { map<string, string> labels = 1; }",
    ],
)
def test_unsupported_proto_is_refused(text: str) -> None:
    with pytest.raises(ProtoSyntaxError):
        file_descriptor(text)
