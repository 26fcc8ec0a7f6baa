"""What node_exporter does not say about a network port: its link layer, whether a netdev is a
real port, and which hardware counters are stuck at their maximum. Pure functions.

Link layer. The infiniband collector exports every RDMA device under /sys/class/infiniband,
and RoCE and iWARP devices (Ethernet link layer) are among them, but `node_infiniband_info`
carries only board_id, firmware_version and hca_type: no series says `link_layer`. An HCA
port's layer is taken from, in order:
1. a `link_layer` label on any of its series (an exporter or textfile collector that adds it);
2. `sources.prometheus_fabric_link_layers` (HCA name pattern -> layer);
3. the device's name: rdma-core's udev names (`rocep…` RoCE, `iwp…` iWARP, `ibp…` InfiniBand)
   and the drivers that only speak Ethernet (bnxt_re, qedr, irdma, i40iw, erdma, hns, ionic,
   mana, cxgb4, ocrdma, vmw_pvrdma, and the software rxe / siw);
4. the netdev with the same predictable name (`rocep65s0f0` ↔ `enp65s0f0` or `enp65s0f0np0`),
   by its ARPHRD type (`node_network_protocol_type`: 1 Ethernet, 32 InfiniBand) or its name;
5. a node whose HCA ports left are as many as its IPoIB netdevs that no HCA claimed: they are
   those ports (an IB fabric's node: mlx5_0..7 with ib0..7);
else "unknown". mlx5_N names say nothing: a ConnectX port is either.

Virtual netdevs are left out: besides the name rule of prometheus_fabric.py (lo, veth,
bridges, ...), a VLAN or IPoIB child (`eth0.100`, `ib0.8001`) and any netdev stacked on
another (`node_network_iface_link` != `node_network_iface_id`: VLAN, macvlan, ipvlan).

Saturation. IB port counters (IBA PortCounters) stop at their maximum instead of wrapping:
`link_downed` at 255, `port_xmit_discards` at 65535, the 32-bit data counters when the HCA has
no extended counters (node_exporter multiplies the data octets by 4). A counter at its maximum
is named in the port's `saturated`: its delta is unknown, neither a reset nor a burst.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

LinkLayer = str  # "infiniband" | "ethernet" | "unknown"
IB, ETH, UNKNOWN = "infiniband", "ethernet", "unknown"
ARPHRD = {1.0: ETH, 32.0: IB}  # node_network_protocol_type: if_arp.h ARPHRD_ETHER, _INFINIBAND

_ETHERNET_ONLY = re.compile(
    r"^(rocep|roce|iwp|bnxt_re|qedr|irdma|i40iw|erdma|hns|ionic|mana|cxgb4|iw_cxgb|ocrdma"
    r"|vmw_pvrdma|rxe|siw)"
)
_INFINIBAND_ONLY = re.compile(r"^(ibp|qib|hfi1)")  # udev IB names; QLogic / Omni-Path HFIs
_PREDICTABLE_HCA = re.compile(r"^(?:rocep|ibp|iwp)(?P<path>[0-9a-z]+)$")
_PREDICTABLE_NETDEV = re.compile(r"^(?:en|ib)(?P<path>p[0-9a-z]+?)(?:np[0-9]+|d[0-9]+)?$")

_M8, _M16, _M32 = 2**8 - 1, 2**16 - 1, 2**32 - 1
_M4 = 2**4 - 1
# node_exporter name (node_infiniband_…_total) -> the IBA PortCounters maximum
SATURATES_AT: dict[str, float] = {
    "node_infiniband_link_downed_total": _M8,
    "node_infiniband_link_error_recovery_total": _M8,
    "node_infiniband_port_constraint_errors_received_total": _M8,
    "node_infiniband_port_constraint_errors_transmitted_total": _M8,
    "node_infiniband_local_link_integrity_errors_total": _M4,
    "node_infiniband_excessive_buffer_overrun_errors_total": _M4,
    "node_infiniband_symbol_error_total": _M16,
    "node_infiniband_port_errors_received_total": _M16,
    "node_infiniband_port_receive_errors_total": _M16,  # the simulator's spelling
    "node_infiniband_port_receive_remote_physical_errors_total": _M16,
    "node_infiniband_port_receive_switch_relay_errors_total": _M16,
    "node_infiniband_port_discards_received_total": _M16,
    "node_infiniband_port_discards_transmitted_total": _M16,
    "node_infiniband_port_transmit_discards_total": _M16,  # the simulator's spelling
    "node_infiniband_vl15_dropped_total": _M16,
    "node_infiniband_port_transmit_wait_total": _M32,
    # 32-bit PortXmitData/PortRcvData (no extended counters), times 4 as node_exporter reports
    "node_infiniband_port_data_received_bytes_total": 4 * _M32,
    "node_infiniband_port_data_transmitted_bytes_total": 4 * _M32,
    "node_infiniband_legacy_data_received_bytes_total": 4 * _M32,
    "node_infiniband_legacy_data_transmitted_bytes_total": 4 * _M32,
    "node_infiniband_port_packets_received_total": _M32,
    "node_infiniband_port_packets_transmitted_total": _M32,
    "node_infiniband_legacy_packets_received_total": _M32,
    "node_infiniband_legacy_packets_transmitted_total": _M32,
}


def saturated(metrics: Mapping[str, float]) -> list[str]:
    """The counters of `metrics` at their hardware maximum, sorted. Exactly at it: a counter
    read through 64-bit extended counters (data, packets) goes past a 32-bit maximum."""
    return sorted(n for n, v in metrics.items() if v == SATURATES_AT.get(n))


def is_stacked(metrics: Mapping[str, float], name: str) -> bool:
    """A VLAN / IPoIB child (by name) or a netdev on top of another one (iflink != ifindex)."""
    link, own = metrics.get("node_network_iface_link"), metrics.get("node_network_iface_id")
    return "." in name or (link is not None and own is not None and link != own)


def netdev_layer(name: str, metrics: Mapping[str, float]) -> LinkLayer:
    """A netdev's link layer: its ARPHRD type, else its name (en*/eth* Ethernet, ib* IPoIB)."""
    known = ARPHRD.get(metrics.get("node_network_protocol_type", -1.0))
    if known is not None:
        return known
    if name.startswith("ib"):
        return IB
    if name.startswith(("en", "eth")):
        return ETH
    return UNKNOWN  # a bond may be of either


def configured(device: str, patterns: Mapping[str, str]) -> LinkLayer | None:
    return next((layer for p, layer in patterns.items() if fnmatch.fnmatchcase(device, p)), None)


def named(device: str) -> LinkLayer | None:
    if _ETHERNET_ONLY.match(device):
        return ETH
    if _INFINIBAND_ONLY.match(device):
        return IB
    return None


def twin_netdev(device: str, netdevs: Iterable[str]) -> str | None:
    """The netdev of an HCA named by rdma-core's udev rules (same PCI path), if there is one."""
    hca = _PREDICTABLE_HCA.match(device)
    if hca is None:
        return None
    for netdev in sorted(netdevs):
        match = _PREDICTABLE_NETDEV.match(netdev)
        if match is not None and match.group("path") == "p" + hca.group("path"):
            return netdev
    return None


def hca_layers(
    hca_ports: Iterable[tuple[str, int]],
    labelled: Mapping[str, str],
    netdevs: Mapping[str, Mapping[str, float]],
    patterns: Mapping[str, str],
) -> dict[tuple[str, int], tuple[LinkLayer, str | None]]:
    """Each HCA port's (link layer, netdev) by the rules of the module docstring. `labelled`:
    device -> a `link_layer` label seen on its series; `netdevs`: the node's real netdevs."""
    found: dict[tuple[str, int], tuple[LinkLayer, str | None]] = {}
    for device, port in hca_ports:
        twin = twin_netdev(device, netdevs)
        layer = (
            _label(labelled.get(device, ""))
            or configured(device, patterns)
            or named(device)
            or (netdev_layer(twin, netdevs[twin]) if twin is not None else None)
        )
        found[(device, port)] = (layer if layer and layer != UNKNOWN else UNKNOWN, twin)
    _pair_with_ipoib(found, netdevs)
    return found


def _label(value: str) -> LinkLayer | None:
    lowered = value.strip().lower()
    return lowered if lowered in (IB, ETH) else None


def _pair_with_ipoib(
    found: dict[tuple[str, int], tuple[LinkLayer, str | None]],
    netdevs: Mapping[str, Mapping[str, float]],
) -> None:
    claimed = {twin for _, twin in found.values() if twin is not None}
    ipoib = [n for n in netdevs if n not in claimed and netdev_layer(n, netdevs[n]) == IB]
    left = [key for key, (layer, _) in found.items() if layer == UNKNOWN]
    if left and len(left) == len(ipoib):
        for key in left:
            found[key] = (IB, None)
