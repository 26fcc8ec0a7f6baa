"""node_exporter InfiniBand / netdev series from Prometheus → fabric_sample/2."""

from __future__ import annotations

from typing import Any

from pipeline.model import FabricSample
from pipeline.sources.prometheus_fabric import parse_fabric_series
from pipeline.sources.prometheus_series import Identity

IDENTITY = Identity("c1", "p1", "z1")
TS = 1_764_424_800.0


def series(name: str, value: str, ts: float = TS, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, "instance": "gpu-7:9100", **labels},
            "values": [[ts, value]]}  # fmt: skip


def test_infiniband_and_netdev_series_make_one_sample_per_node_and_scrape() -> None:
    parsed = parse_fabric_series(
        [
            series("node_infiniband_state_id", "4", device="mlx5_0", port="1"),
            series("node_infiniband_link_downed_total", "3", device="mlx5_0", port="1"),
            series("node_infiniband_symbol_error_total", "12", device="mlx5_1", port="1"),
            series("node_network_up", "1", device="ib0"),
            series("node_network_carrier_changes_total", "6", device="eth0"),
            series("node_network_up", "1", device="veth1a2b"),  # a container's: left out
            series("node_network_up", "1", device="lo"),
            series("node_network_info", "1", device="eth0", address="aa:bb"),
            series("node_infiniband_state_id", "1", ts=TS + 30, device="mlx5_0", port="1"),
        ],
        IDENTITY,
    )
    assert parsed.bad == []
    first, second = parsed.events
    assert isinstance(first, FabricSample) and isinstance(second, FabricSample)
    assert (first.node, first.cluster, first.ts) == ("gpu-7", "c1", 1_764_424_800_000)
    ports = {p.key: (p.link_layer, p.netdev, p.metrics) for p in first.ports}
    assert ports == {
        "eth0:1": ("ethernet", "eth0", {"node_network_carrier_changes_total": 6.0}),
        "ib0:1": ("infiniband", "ib0", {"node_network_up": 1.0}),
        # two HCAs, one IPoIB netdev: nothing says which HCA ib0 belongs to, nor what the
        # other one is (it may be RoCE)
        "mlx5_0:1": ("unknown", None, {"node_infiniband_link_downed_total": 3.0,
                                      "node_infiniband_state_id": 4.0}),
        "mlx5_1:1": ("unknown", None, {"node_infiniband_symbol_error_total": 12.0}),
    }  # fmt: skip
    assert [p.key for p in second.ports] == ["mlx5_0:1"]


def test_points_already_read_are_dropped() -> None:
    parsed = parse_fabric_series(
        [series("node_network_up", "1", device="ib0")], IDENTITY, after_ms=1_764_424_800_000
    )
    assert parsed.events == [] and parsed.bad == []


def test_a_bad_series_is_named_and_the_rest_still_count() -> None:
    parsed = parse_fabric_series(
        [
            series("node_infiniband_state_id", "4", device="mlx5_0"),  # no port label
            series("node_network_up", "not a number", device="ib0"),
            series("node_network_up", "1", device="ib1"),
        ],
        IDENTITY,
    )
    assert [str(b.error).split(":")[0] for b in parsed.bad] == [
        "node_infiniband_state_id labels", "node_network_up.values"]  # fmt: skip
    (sample,) = parsed.events
    assert [p.key for p in sample.ports] == ["ib1:1"]
