"""The tpu_runtime parser: libtpu MetricResponses → TpuSample/IciSample; bad shapes named."""

from __future__ import annotations

from typing import Any

from pipeline.model import IciSample, TpuSample
from pipeline.sources.libtpu_proto import runtime_protocol
from pipeline.sources.tpu_hosts import TpuHost
from pipeline.sources.tpu_runtime import parse_runtime_metrics

HOST = TpuHost(
    cluster="gke-tpu",
    node="tpu-w0",
    pool="p",
    zone="us-east5-a",
    slice="v5e-a",
    accelerator_type="v5litepod-16",
    topology="4x4",
    worker_id=0,
)
MESSAGES = runtime_protocol().messages
T0 = 1_764_424_800


def _response(name: str, points: list[dict[str, Any]]) -> Any:
    response = MESSAGES["MetricResponse"]()
    response.metric.name = name
    for point in points:
        metric = response.metric.metrics.add()
        metric.timestamp.seconds = point.get("ts", T0)
        if "ordinal" in point:
            metric.attribute.key = "device-id"
            metric.attribute.value.int_attr = point["ordinal"]
        if "link" in point:
            metric.attribute.key = "link"
            for key, value in point["link"].items():
                attr = metric.attribute.value.kvlist_attr.attributes.add(key=key)
                if isinstance(value, str):
                    attr.value.string_attr = value
                else:
                    attr.value.int_attr = value
        if "double" in point:
            metric.gauge.as_double = point["double"]
        if "int" in point:
            metric.gauge.as_int = point["int"]
        if "count" in point:
            metric.counter.as_int = point["count"]
    return response


def test_chip_and_link_metrics_make_one_sample_each() -> None:
    responses = {
        "tpu.runtime.tensorcore.dutycycle.percent": _response(
            "d", [{"ordinal": 1, "double": 88.5}, {"ordinal": 0, "double": 12.5, "ts": T0 + 1}]
        ),
        "tpu.runtime.hbm.memory.usage.bytes": _response("u", [{"ordinal": 0, "int": 2**33}]),
        "tpu.runtime.chip.tpu_throttle_score": _response("t", [{"ordinal": 0, "double": 1.0}]),
        "tpu.runtime.ici.link.health": _response(
            "h", [{"link": {"device_ordinal": "1", "port": 2}, "int": 10}]
        ),
        "tpu.runtime.ici.flits.tx.count": _response(
            "f", [{"link": {"device_ordinal": "1", "port": 2}, "count": 123}]
        ),
    }
    parsed = parse_runtime_metrics(responses, HOST)
    assert parsed.bad == []
    chips, links = parsed.events
    assert isinstance(chips, TpuSample) and isinstance(links, IciSample)
    assert chips.ts == (T0 + 1) * 1000  # the newest reading
    assert [c.chip_id for c in chips.chips] == [0, 1]
    assert chips.chips[0].metrics == {
        "duty_cycle_pct": 12.5,
        "hbm_used_bytes": float(2**33),
        "tpu_throttle_score": 1.0,
    }
    [link] = links.links
    # host 0 of a v5e 4x4 holds the 2x4 block of chips 0-7: ordinal 1 is chip 1 at (0, 1)
    assert (link.chip_id, link.port, link.health, link.flits_tx) == (1, 2, 10, 123)
    assert link.peer_chip_id == 0  # no peer attribute: looked up in the ICI topology


def test_bad_shapes_are_bad_records_and_the_rest_still_counts() -> None:
    responses = {
        "tpu.runtime.tensorcore.dutycycle.percent": _response("d", [{"ordinal": 0, "double": 5.0}]),
        # chip metric without a device-id attribute
        "tpu.runtime.hbm.memory.usage.bytes": _response("u", [{"int": 1}]),
        # link metric without its port
        "tpu.runtime.ici.link.health": _response(
            "h", [{"link": {"device_ordinal": "0"}, "int": 0}]
        ),
        # a point with no value at all
        "tpu.runtime.hbm.memory.total.bytes": _response("t", [{"ordinal": 0}]),
    }
    parsed = parse_runtime_metrics(responses, HOST)
    [chips] = parsed.events
    assert isinstance(chips, TpuSample) and chips.chips[0].metrics == {"duty_cycle_pct": 5.0}
    fields = sorted(bad.error.field for bad in parsed.bad)
    assert fields == [
        "tpu.runtime.hbm.memory.total.bytes.measure",
        "tpu.runtime.hbm.memory.usage.bytes.attribute",
        "tpu.runtime.ici.link.health.attribute",
    ]


def test_an_ordinal_beyond_the_host_is_refused() -> None:
    responses = {
        "tpu.runtime.tensorcore.dutycycle.percent": _response("d", [{"ordinal": 8, "double": 5.0}])
    }
    parsed = parse_runtime_metrics(responses, HOST)
    assert parsed.events == []
    [bad] = parsed.bad
    assert "ordinal 8" in bad.error.got
