"""node_exporter's network ports from a Prometheus server → FabricSample, one per node per scrape.

Read through the same Prometheus (and the same connection, node label and position) as the DCGM
series (prometheus.py), with the selector `{__name__=~"node_(infiniband|network)_.+"}`:
- the infiniband collector's series (`node_infiniband_*`, labels `device` = HCA, `port`) make
  one InfiniBand port each;
- the netdev collector's series (`node_network_*`, label `device` = interface) make one port
  per interface that looks like a fabric or uplink NIC (`ib*`, `en*`, `eth*`, `bond*`), port 1;
  virtual interfaces (lo, veth*, cali*, docker*, flannel*, bridges, VLAN and other stacked
  devices) are left out.
A port's link layer (InfiniBand, Ethernet for RoCE / iWARP / plain NICs, or unknown) and its
saturated counters: prometheus_ports.py. node_network_info carries no number and is skipped;
node_infiniband_info only lends a `link_layer` label when an exporter adds one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pipeline.config import selector_matchers
from pipeline.errors import DecodeError
from pipeline.model import FabricPort, FabricSample
from pipeline.sources import prometheus_ports as ports
from pipeline.sources.base import BadRecord, Parsed, validated
from pipeline.sources.prometheus_series import (
    Identity,
    matrix_series,
    node_name,
    points,
    raw_json,
    shown,
)

FABRIC_QUERY = '{__name__=~"node_(infiniband|network)_.+"}'
NIC_NETDEV = re.compile(r"^(ib|en|eth|bond)[A-Za-z0-9_.@-]*$")
_SKIPPED = frozenset({"node_network_info", "node_infiniband_info"})


def fabric_selector(selector: str = "") -> str:
    """The fabric series selector with the configured matchers (sources.prometheus_selector)."""
    matchers = selector_matchers(selector)
    return f"{FABRIC_QUERY[:-1]},{matchers}}}" if matchers else FABRIC_QUERY


@dataclass
class _Scrape:
    cluster: str
    pool: str
    zone: str
    hcas: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    netdevs: dict[str, dict[str, float]] = field(default_factory=dict)
    labelled: dict[str, str] = field(default_factory=dict)  # HCA -> its link_layer label

    def sample(self, node: str, ts: int, link_layers: Mapping[str, str]) -> FabricSample:
        netdevs = {n: m for n, m in self.netdevs.items() if not ports.is_stacked(m, n)}
        hcas = ports.hca_layers(self.hcas, self.labelled, netdevs, link_layers)
        found = [
            FabricPort(
                device=device,
                port=port,
                netdev=hcas[(device, port)][1],
                link_layer=hcas[(device, port)][0],  # type: ignore[arg-type]
                # a netdev known to be this port's (rdma-core names) is read as part of it
                metrics=dict(sorted({**metrics, **netdevs.get(twin or "", {})}.items())),
                saturated=ports.saturated(metrics),
            )
            for (device, port), metrics in self.hcas.items()
            for twin in [hcas[(device, port)][1]]
        ]
        twins = {twin for _, twin in hcas.values()}
        netdevs = {n: m for n, m in netdevs.items() if n not in twins}
        found += [
            FabricPort(
                device=name,
                port=1,
                netdev=name,
                link_layer=ports.netdev_layer(name, metrics),  # type: ignore[arg-type]
                metrics=dict(sorted(metrics.items())),
            )
            for name, metrics in netdevs.items()
        ]
        return FabricSample(
            ts=ts, cluster=self.cluster, node=node, pool=self.pool, zone=self.zone,
            ports=sorted(found, key=lambda p: (p.device, p.port)),
        )  # fmt: skip


def parse_fabric_series(
    results: Iterable[Mapping[str, Any]],
    identity: Identity,
    *,
    after_ms: int = 0,
    link_layers: Mapping[str, str] | None = None,
) -> Parsed:
    """Matrix results of the fabric selector → FabricSamples (points after `after_ms`); a
    malformed series becomes a BadRecord and the rest still count. `link_layers`: HCA name
    pattern -> link layer (sources.prometheus_fabric_link_layers)."""
    parsed = Parsed()
    nodes: dict[tuple[str, int], _Scrape] = {}
    for result in results:
        try:
            _add(nodes, result, identity, after_ms)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(raw_json(result), exc))
    for (node, ts), scrape in sorted(nodes.items(), key=lambda item: (item[0][1], item[0][0])):
        try:
            parsed.events.append(validated(scrape.sample(node, ts, link_layers or {})))
        except (DecodeError, ValueError, msgspec.ValidationError) as exc:
            error = (
                exc
                if isinstance(exc, DecodeError)
                else DecodeError(
                    field=f"node {node!r}",
                    expected="values valid for fabric_sample/2",
                    got=str(exc),
                )
            )
            parsed.bad.append(BadRecord(raw_json({"node": node, "ts": ts}), error))
    return parsed


def _add(
    nodes: dict[tuple[str, int], _Scrape],
    result: Mapping[str, Any],
    identity: Identity,
    after_ms: int,
) -> None:
    labels, values = matrix_series(result)
    name = str(labels.get("__name__", ""))
    if name in _SKIPPED:
        _add_label(nodes, labels, identity, values, after_ms)
        return
    where = _port_of(name, labels)
    if where is None:
        return  # a virtual interface
    node = node_name(labels, identity.node_label)
    for ts_ms, value in points(values, name):
        if ts_ms <= after_ms or value is None:
            continue
        scrape = _scrape(nodes, node, ts_ms, labels, identity)
        if isinstance(where, str):
            scrape.netdevs.setdefault(where, {})[name] = value
            continue
        scrape.hcas.setdefault(where, {})[name] = value
        if labels.get("link_layer"):
            scrape.labelled[where[0]] = str(labels["link_layer"])


def _scrape(
    nodes: dict[tuple[str, int], _Scrape],
    node: str,
    ts_ms: int,
    labels: Mapping[str, Any],
    identity: Identity,
) -> _Scrape:
    scrape = nodes.get((node, ts_ms))
    if scrape is None:
        scrape = nodes[(node, ts_ms)] = _Scrape(
            cluster=str(labels.get("cluster", identity.cluster)),
            pool=str(labels.get("pool", identity.pool)),
            zone=str(labels.get("zone", identity.zone)),
        )
    return scrape


def _add_label(
    nodes: dict[tuple[str, int], _Scrape],
    labels: Mapping[str, Any],
    identity: Identity,
    values: Any,
    after_ms: int,
) -> None:
    """An info series lends its `link_layer` label (when it has one) to its HCA's ports."""
    device, layer = str(labels.get("device", "")), str(labels.get("link_layer", ""))
    if not (device and layer and str(labels.get("__name__")) == "node_infiniband_info"):
        return
    node = node_name(labels, identity.node_label)
    for ts_ms, _ in points(values, "node_infiniband_info"):
        if ts_ms > after_ms:
            _scrape(nodes, node, ts_ms, labels, identity).labelled[device] = layer


def _port_of(name: str, labels: Mapping[str, Any]) -> tuple[str, int] | str | None:
    """(HCA, port) for an infiniband series, the netdev's name for a netdev series, None for a
    virtual interface."""
    device = str(labels.get("device", ""))
    if name.startswith("node_infiniband_"):
        port = str(labels.get("port", ""))
        if not device or not port.isdigit():
            raise DecodeError(
                field=f"{name} labels",
                expected='device (an HCA like "mlx5_0") and port (a number)',
                got=shown(labels),
            )
        return device, int(port)
    if not name.startswith("node_network_"):
        raise DecodeError(
            field="__name__", expected="a node_infiniband_* or node_network_* metric", got=name
        )
    return device if NIC_NETDEV.match(device) else None
