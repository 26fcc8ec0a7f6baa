"""Simulated node_exporter network ports of GPU nodes → FabricSample per node and scrape.

Every GPU node has `PORTS` InfiniBand HCAs (mlx5_0..3, port 1, IPoIB netdev ib0..3), one per
GPU pair on its PCIe switch (N1 names them nic0..3). In most pools all four are cabled to the
rack's top-of-rack leaf switch; the pools of every second cluster are rail-optimised: HCA k of
each node of a scalable unit (`RACKS_PER_SU` racks) goes to that unit's rail switch k, so a
rail switch failing takes one port of many nodes, across racks. Faults act through effects and
changes (effects.py):
  offline      the node reports nothing (no node_exporter either)
  fab_down     port (device; -1 every port) down: state DOWN, physical Polling, netdev down
  fab_missing  port gone from the scrape (the NIC fell off the bus)
  fab_errors   symbol / receive / link-recovery errors at `value` per second, link up
  fabric_add   (change) a port counter steps: a flap's link_downed and carrier changes
  reset        (change) a reboot: the HCA counters start again from zero
"""

from __future__ import annotations

import numpy as np

from pipeline.model import FabricPort, FabricSample
from pipeline.sim.effects import Change, Effect
from pipeline.sim.fleet import Fleet, GpuNode

PORTS = 4
LINK_BYTES_PER_S = 2.0e9  # data bytes each way on a busy 400 Gb/s port, roughly [G]
COUNTERS = (
    "node_infiniband_link_downed_total",
    "node_infiniband_link_error_recovery_total",
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_port_discards_transmitted_total",
    "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_network_carrier_changes_total",
    "node_network_receive_errs_total",
    "node_network_transmit_errs_total",
)
ERROR_SPLIT = (
    ("node_infiniband_symbol_error_total", 0.6),
    ("node_infiniband_port_errors_received_total", 0.3),
    ("node_infiniband_link_error_recovery_total", 0.1),
)
FABRIC_EFFECTS = frozenset({"fab_down", "fab_missing", "fab_errors"})
NOISE_P = 2e-3  # a healthy port logs a stray symbol error now and then


def leaf_switch(node: GpuNode) -> str | None:
    """The rack's leaf switch the node's HCAs are cabled to (None: a rail-optimised pool)."""
    return None if node.rail_group else f"{node.cluster}-leaf-{node.rack:03d}"


def rail_switch(node: GpuNode, port: int) -> str:
    """The rail switch HCA `port` of a rail-optimised node is cabled to: its scalable unit's
    rail, as fabric localisation names it (`<inventory rail>.<hca>`)."""
    return f"{node.rail_group}.mlx5_{port}"


class FabricTelemetry:
    """Holds the port counters between scrapes and produces one FabricSample per node."""

    def __init__(self, fleet: Fleet, effects: list[Effect], changes: list[Change], seed: int):
        self.fleet = fleet
        self.rng = np.random.default_rng([seed, 12])
        self._effects = sorted(
            (e for e in effects if e.kind in FABRIC_EFFECTS or e.kind == "offline"),
            key=lambda e: e.start_ms,
        )
        self._changes = [c for c in changes if c.kind in ("fabric_add", "reset")]
        self._next_effect = self._next_change = 0
        self._active: list[Effect] = []
        n = len(fleet.gpu_nodes)
        self.counters = {name: np.zeros((n, PORTS)) for name in COUNTERS}
        self._last_ms: int | None = None

    def tick(self, t_ms: int) -> list[FabricSample]:
        dt = 0.0 if self._last_ms is None else (t_ms - self._last_ms) / 1000
        self._last_ms = t_ms
        self._apply_changes(t_ms)
        while (
            self._next_effect < len(self._effects)
            and self._effects[self._next_effect].start_ms <= t_ms
        ):
            self._active.append(self._effects[self._next_effect])
            self._next_effect += 1
        self._active = [e for e in self._active if e.end_ms > t_ms]
        n = len(self.fleet.gpu_nodes)
        offline = np.zeros(n, dtype=bool)
        down = np.zeros((n, PORTS), dtype=bool)
        missing = np.zeros((n, PORTS), dtype=bool)
        errors = np.zeros((n, PORTS))
        for e in self._active:
            where = (e.node, slice(None) if e.device < 0 else e.device)
            if e.kind == "offline":
                offline[e.node] = True
            elif e.kind == "fab_down":
                down[where] = True
            elif e.kind == "fab_missing":
                missing[where] = True
            else:
                errors[where] += e.level(t_ms)
        self._advance(dt, down, errors)
        return self._samples(t_ms, offline, down, missing)

    def _apply_changes(self, t_ms: int) -> None:
        while (
            self._next_change < len(self._changes)
            and self._changes[self._next_change].ts <= t_ms
        ):
            change = self._changes[self._next_change]
            self._next_change += 1
            where = (change.node, slice(None) if change.device < 0 else change.device)
            if change.kind == "reset":
                for values in self.counters.values():
                    values[change.node, :] = 0.0
            else:
                self.counters[change.field][where] += change.value

    def _advance(self, dt: float, down: np.ndarray, errors: np.ndarray) -> None:
        if dt <= 0:
            return
        up = ~down
        for name in (
            "node_infiniband_port_data_received_bytes_total",
            "node_infiniband_port_data_transmitted_bytes_total",
        ):
            noise = self.rng.uniform(0.5, 1.0, up.shape)
            self.counters[name] += np.floor(LINK_BYTES_PER_S * dt * noise) * up
        total = np.floor(errors * dt + self.rng.random(errors.shape))  # whole errors
        total += (self.rng.random(errors.shape) < NOISE_P) * up
        for name, share in ERROR_SPLIT:
            self.counters[name] += np.ceil(total * share) * up
        self.counters["node_network_receive_errs_total"] += np.floor(total * 0.3) * up

    def _samples(
        self, t_ms: int, offline: np.ndarray, down: np.ndarray, missing: np.ndarray
    ) -> list[FabricSample]:
        table = {name: values.tolist() for name, values in self.counters.items()}
        down_list, missing_list = down.tolist(), missing.tolist()
        out = []
        for i, node in enumerate(self.fleet.gpu_nodes):
            if offline[i]:
                continue
            ports = []
            for p in range(PORTS):
                if missing_list[i][p]:
                    continue
                metrics = {name: table[name][i][p] for name in COUNTERS}
                is_down = down_list[i][p]
                metrics["node_infiniband_state_id"] = 1.0 if is_down else 4.0
                metrics["node_infiniband_physical_state_id"] = 2.0 if is_down else 5.0
                metrics["node_infiniband_rate_bytes_per_second"] = 5.0e10
                metrics["node_network_up"] = 0.0 if is_down else 1.0
                ports.append(
                    FabricPort(device=f"mlx5_{p}", port=1, netdev=f"ib{p}", metrics=metrics)
                )
            out.append(
                FabricSample(
                    ts=t_ms,
                    cluster=node.cluster,
                    node=node.name,
                    pool=node.pool,
                    zone=node.zone,
                    ports=ports,
                )
            )
        return out
