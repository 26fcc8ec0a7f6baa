"""node_exporter's network ports from a Prometheus server → FabricSample, one per node per scrape.

Read through the same Prometheus (and the same connection, node label and position) as the DCGM
series (prometheus.py), with the selector `{__name__=~"node_(infiniband|network)_.+"}`:
- the infiniband collector's series (`node_infiniband_*`, labels `device` = HCA, `port`) make
  one InfiniBand port each;
- the netdev collector's series (`node_network_*`, label `device` = interface) make one port
  per interface that looks like a fabric or uplink NIC (`ib*`, `en*`, `eth*`, `bond*`), port 1,
  InfiniBand for `ib*` (IPoIB), Ethernet otherwise; virtual interfaces (lo, veth*, cali*,
  docker*, flannel*, ...) are left out.
Label-valued series (node_network_info, node_infiniband_info) carry no number and are skipped.
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
    ports: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    layers: dict[tuple[str, int], str] = field(default_factory=dict)

    def sample(self, node: str, ts: int) -> FabricSample:
        return FabricSample(
            ts=ts,
            cluster=self.cluster,
            node=node,
            pool=self.pool,
            zone=self.zone,
            ports=[
                FabricPort(
                    device=device,
                    port=port,
                    netdev=device if self.layers[(device, port)] != "hca" else None,
                    link_layer="ethernet" if self.layers[(device, port)] == "eth" else "infiniband",
                    metrics=dict(sorted(metrics.items())),
                )
                for (device, port), metrics in sorted(self.ports.items())
            ],
        )


def parse_fabric_series(
    results: Iterable[Mapping[str, Any]], identity: Identity, *, after_ms: int = 0
) -> Parsed:
    """Matrix results of the fabric selector → FabricSamples (points after `after_ms`); a
    malformed series becomes a BadRecord and the rest still count."""
    parsed = Parsed()
    nodes: dict[tuple[str, int], _Scrape] = {}
    for result in results:
        try:
            _add(nodes, result, identity, after_ms)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(raw_json(result), exc))
    for (node, ts), scrape in sorted(nodes.items(), key=lambda item: (item[0][1], item[0][0])):
        try:
            parsed.events.append(validated(scrape.sample(node, ts)))
        except (DecodeError, ValueError, msgspec.ValidationError) as exc:
            error = (
                exc
                if isinstance(exc, DecodeError)
                else DecodeError(
                    field=f"node {node!r}",
                    expected="values valid for fabric_sample/1",
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
        return
    port_key, layer = _port_of(name, labels)
    if port_key is None:
        return  # a virtual interface
    node = node_name(labels, identity.node_label)
    for ts_ms, value in points(values, name):
        if ts_ms <= after_ms or value is None:
            continue
        scrape = nodes.get((node, ts_ms))
        if scrape is None:
            scrape = nodes[(node, ts_ms)] = _Scrape(
                cluster=str(labels.get("cluster", identity.cluster)),
                pool=str(labels.get("pool", identity.pool)),
                zone=str(labels.get("zone", identity.zone)),
            )
        scrape.ports.setdefault(port_key, {})[name] = value
        scrape.layers[port_key] = layer


def _port_of(name: str, labels: Mapping[str, Any]) -> tuple[tuple[str, int] | None, str]:
    device = str(labels.get("device", ""))
    if name.startswith("node_infiniband_"):
        port = str(labels.get("port", ""))
        if not device or not port.isdigit():
            raise DecodeError(
                field=f"{name} labels",
                expected='device (an HCA like "mlx5_0") and port (a number)',
                got=shown(labels),
            )
        return (device, int(port)), "hca"
    if not name.startswith("node_network_"):
        raise DecodeError(
            field="__name__", expected="a node_infiniband_* or node_network_* metric", got=name
        )
    if not NIC_NETDEV.match(device):
        return None, ""
    return (device, 1), "ib" if device.startswith("ib") else "eth"
