"""Real node_exporter shapes of RDMA and netdev ports (infiniband and netdev collectors, rdma-core
udev names, IBA PortCounters widths) → link layer, virtual netdevs left out, saturated counters.
Written from the formats' documentation: the collectors' label sets, if_arp.h ARPHRD types,
rdma-core's 60-rdma-persistent-naming rules and the IBA PortCounters attribute widths."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.model import FabricSample
from pipeline.sources.prometheus_fabric import parse_fabric_series
from pipeline.sources.prometheus_series import Identity

IDENTITY = Identity("c1", "p1", "z1")
TS = 1_764_424_800.0
IB = "node_infiniband_"


def hca(device: str, port: str = "1", **extra: str) -> dict[str, Any]:
    return {"metric": {"__name__": "node_infiniband_state_id", "instance": "gpu-1:9100",
                       "device": device, "port": port, **extra}, "values": [[TS, "4"]]}  # fmt: skip


def net(device: str, name: str = "node_network_up", value: float = 1.0) -> dict[str, Any]:
    return {"metric": {"__name__": name, "instance": "gpu-1:9100", "device": device},
            "values": [[TS, str(value)]]}  # fmt: skip


def arphrd(device: str, kind: int) -> dict[str, Any]:
    return net(device, "node_network_protocol_type", kind)


def layers(series: list[dict[str, Any]], **settings: str) -> dict[str, tuple[str, str | None]]:
    parsed = parse_fabric_series(series, IDENTITY, link_layers=settings)
    assert parsed.bad == []
    (sample,) = parsed.events
    assert isinstance(sample, FabricSample)
    return {p.key: (p.link_layer, p.netdev) for p in sample.ports}


# fmt: off
SHAPES: list[tuple[str, list[dict[str, Any]], dict[str, str], dict[str, tuple[str, str | None]]]] = [
    ("rdma-core udev names: a RoCE port and its netdev, an IB port and its IPoIB netdev",
     [hca("rocep65s0f0"), net("enp65s0f0np0"), arphrd("enp65s0f0np0", 1),
      hca("ibp12s0"), net("ibp12s0"), arphrd("ibp12s0", 32)], {},
     # each netdev read as part of its HCA's port (one port, not two of the same name)
     {"rocep65s0f0:1": ("ethernet", "enp65s0f0np0"), "ibp12s0:1": ("infiniband", "ibp12s0")}),
    ("an IB node (mlx5_N, one IPoIB netdev each, an Ethernet management NIC)",
     [hca("mlx5_0"), hca("mlx5_1"), net("ib0"), net("ib1"), arphrd("ib0", 32),
      arphrd("ib1", 32), net("eno1"), arphrd("eno1", 1)], {},
     {"mlx5_0:1": ("infiniband", None), "mlx5_1:1": ("infiniband", None),
      "ib0:1": ("infiniband", "ib0"), "ib1:1": ("infiniband", "ib1"), "eno1:1": ("ethernet", "eno1")}),
    ("a RoCE node with legacy HCA names: nothing says what mlx5_0 is",
     [hca("mlx5_0"), hca("mlx5_1"), net("ens1f0np0"), net("ens1f1np1"), arphrd("ens1f0np0", 1)], {},
     {"mlx5_0:1": ("unknown", None), "mlx5_1:1": ("unknown", None),
      "ens1f0np0:1": ("ethernet", "ens1f0np0"), "ens1f1np1:1": ("ethernet", "ens1f1np1")}),
    ("eight IB HCAs and two storage NICs in Ethernet mode: the count does not pair",
     [*(hca(f"mlx5_{i}") for i in range(5)), *(net(f"ib{i}") for i in range(4))], {},
     {**{f"mlx5_{i}:1": ("unknown", None) for i in range(5)},
      **{f"ib{i}:1": ("infiniband", f"ib{i}") for i in range(4)}}),
    ("the same node with the setting naming the storage HCA: the rest pair with IPoIB",
     [*(hca(f"mlx5_{i}") for i in range(5)), *(net(f"ib{i}") for i in range(4))],
     {"mlx5_4": "ethernet"},
     {**{f"mlx5_{i}:1": ("infiniband", None) for i in range(4)}, "mlx5_4:1": ("ethernet", None),
      **{f"ib{i}:1": ("infiniband", f"ib{i}") for i in range(4)}}),
    ("Ethernet-only RDMA drivers (Broadcom, Intel, Marvell, Alibaba, soft RoCE / iWARP)",
     [hca("bnxt_re0"), hca("irdma0"), hca("qedr0"), hca("erdma_0"), hca("rxe0"), hca("siw0"),
      hca("iwp3s0")], {},
     {k: ("ethernet", None) for k in ("bnxt_re0:1", "irdma0:1", "qedr0:1", "erdma_0:1",
                                      "rxe0:1", "siw0:1", "iwp3s0:1")}),
    ("Omni-Path and QLogic HFIs are InfiniBand-like fabrics",
     [hca("hfi1_0"), hca("qib0")], {},
     {"hfi1_0:1": ("infiniband", None), "qib0:1": ("infiniband", None)}),
    ("a link_layer label on the info series (an exporter that adds it) wins over the setting",
     [hca("mlx5_0"), {"metric": {"__name__": "node_infiniband_info", "instance": "gpu-1:9100",
                                 "device": "mlx5_0", "link_layer": "Ethernet", "hca_type": "MT4129"},
                      "values": [[TS, "1"]]}], {"mlx5_*": "infiniband"},
     {"mlx5_0:1": ("ethernet", None)}),
    ("the setting's patterns, first match first",
     [hca("mlx5_0"), hca("mlx5_9")], {"mlx5_[0-7]": "infiniband", "mlx5_*": "ethernet"},
     {"mlx5_0:1": ("infiniband", None), "mlx5_9:1": ("ethernet", None)}),
    ("VLAN and IPoIB children, macvlan (stacked: iflink != ifindex), a bond kept",
     [net("eth0"), net("eth0.100"), net("ib0.8001"), net("bond0"), arphrd("bond0", 1),
      net("enp1s0v0"), net("enp1s0v0", "node_network_iface_id", 7),
      net("enp1s0v0", "node_network_iface_link", 3),
      net("enp1s0", "node_network_iface_id", 3), net("enp1s0", "node_network_iface_link", 3)], {},
     {"eth0:1": ("ethernet", "eth0"), "bond0:1": ("ethernet", "bond0"),
      "enp1s0:1": ("ethernet", "enp1s0")}),
    ("a bond that does not say its ARPHRD type is of either layer",
     [net("bond0")], {}, {"bond0:1": ("unknown", "bond0")}),
]
# fmt: on


@pytest.mark.parametrize(("series", "settings", "want"), [s[1:] for s in SHAPES],
                         ids=[s[0] for s in SHAPES])  # fmt: skip
def test_link_layers_and_virtual_devices(
    series: list[dict[str, Any]], settings: dict[str, str], want: dict[str, Any]
) -> None:
    assert layers(series, **settings) == want


def counter(name: str, value: float) -> dict[str, Any]:
    where = {"device": "mlx5_0", "port": "1"} if name.startswith(IB) else {"device": "eth0"}
    return {"metric": {"__name__": name, "instance": "gpu-1:9100", **where},
            "values": [[TS, repr(value)]]}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "stuck"),
    [
        (IB + "link_downed_total", 255, True),  # 8-bit LinkDownedCounter
        (IB + "link_downed_total", 254, False),
        (IB + "link_error_recovery_total", 255, True),
        (IB + "port_discards_transmitted_total", 65535, True),  # 16-bit PortXmitDiscards
        (IB + "symbol_error_total", 65535, True),
        (IB + "port_errors_received_total", 65535, True),
        (IB + "local_link_integrity_errors_total", 15, True),  # 4-bit
        (IB + "port_transmit_wait_total", 2**32 - 1, True),
        (IB + "port_data_transmitted_bytes_total", 4 * (2**32 - 1), True),  # 32-bit, x4
        (IB + "port_data_transmitted_bytes_total", 4 * (2**32 - 1) + 4096, False),  # 64-bit
        (IB + "unicast_packets_received_total", 2**32 - 1, False),  # 64-bit only
        ("node_network_carrier_changes_total", 65535, False),  # netdev counters wrap at 64 bits
    ],
)
def test_saturated_counters_are_named(name: str, value: float, stuck: bool) -> None:
    parsed = parse_fabric_series([counter(name, value)], IDENTITY)
    (sample,) = parsed.events
    assert isinstance(sample, FabricSample)
    assert sample.ports[0].saturated == ([name] if stuck else [])


def test_a_netdev_twin_is_read_as_part_of_its_hca_port() -> None:
    parsed = parse_fabric_series(
        [hca("rocep65s0f0"), net("enp65s0f0np0", "node_network_carrier_changes_total", 4)],
        IDENTITY,
    )
    (sample,) = parsed.events
    assert isinstance(sample, FabricSample)
    (port,) = sample.ports
    assert port.metrics == {"node_infiniband_state_id": 4.0,
                            "node_network_carrier_changes_total": 4.0}  # fmt: skip
