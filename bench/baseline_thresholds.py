"""The baseline FleetPulse is compared with: static thresholds, as most fleets run them.

No history, no peers, no persistence beyond a fixed duration, no catalog: each rule fires on a
single sample (or a fixed quiet time) and takes the target out of service at once. The rules
follow what public health checkers ship (reference/remediation-anchors.md):

- xid: an XID from a fixed list cordons the node (Azure NHC's `check_gpu_xid` list; NVIDIA's
  device plugin similarly marks a GPU unhealthy on any XID outside a short skip list);
- gpu_count: fewer GPUs in a scrape than the node had (Azure NHC `check_gpu_count`);
- temperature: GPU temperature above 85 °C;
- ecc: any volatile double-bit ECC error, a pending row remap or a row-remap failure (Azure
  NHC's ECC check);
- idle: GPU (or TPU chip duty cycle) below 5 % while a job holds it, for 10 minutes;
- silent: a node or TPU host that has not reported for 300 s (the usual NotReady timeout);
- ici_down: a TPU ICI link reported down (health 10) repairs the slice.

A GPU node gets `cordon`, a TPU slice `repair_slice`. While a rule keeps firing the target gets
at most one action per `refire_ms` (the scorer folds them into one removal episode). Nodes that
someone else cordoned or deleted are not judged silent until they are back: even a static
checker knows a node in maintenance is not news.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pipeline.ids import stable_id
from pipeline.model import (
    Action,
    Entity,
    Event,
    Evidence,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    Reason,
    Target,
    TpuSample,
    XidEvent,
)

# Azure NHC customTests/azure_gpu_xid.nhc
FIXED_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})
TEMP = "DCGM_FI_DEV_GPU_TEMP"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DUTY = "duty_cycle_pct"
ICI_DOWN = 10


@dataclass(frozen=True)
class Thresholds:
    xids: frozenset[int] = FIXED_XIDS
    temp_c: float = 85.0
    idle_pct: float = 5.0
    idle_ms: int = 10 * 60_000
    silent_ms: int = 300_000
    refire_ms: int = 10 * 60_000
    check_every_ms: int = 10_000  # how often event time is swept for silent targets


@dataclass
class _Target:
    target: Target
    last_seen: int
    gpus: int = 0
    idle_since: dict[str, int] = field(default_factory=dict)  # device -> first idle ts
    last_fired: int | None = None
    held: bool = False  # cordoned or deleted by someone else


class ThresholdDetector:
    """Feed input events in event-time order; `outputs` collects findings and actions."""

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        self.t = thresholds
        self.targets: dict[tuple[str, str], _Target] = {}
        self.findings: list[Finding] = []
        self.actions: list[Action] = []
        self._swept = 0

    def feed_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.feed(event)

    def feed(self, event: Event) -> None:
        if isinstance(event, GpuSample):
            self._sweep(event.ts)
            self._gpu(event)
        elif isinstance(event, TpuSample):
            self._sweep(event.ts)
            self._tpu(event)
        elif isinstance(event, IciSample):
            self._ici(event)
        elif isinstance(event, XidEvent):
            state = self._node(event.cluster, event.node, event.pool, event.zone, event.ts)
            if event.xid in self.t.xids:
                self._fire(state, event.ts, "xid", float(event.xid), str(event.gpu_index))
        elif isinstance(event, NodeEvent):
            self._node_event(event)

    # --- rules ------------------------------------------------------------------------------

    def _gpu(self, sample: GpuSample) -> None:
        state = self._node(sample.cluster, sample.node, sample.pool, sample.zone, sample.ts)
        if len(sample.gpus) < state.gpus:
            self._fire(state, sample.ts, "gpu_count", float(len(sample.gpus)), None)
        state.gpus = max(state.gpus, len(sample.gpus))
        for gpu in sample.gpus:
            m, device = gpu.metrics, str(gpu.index)
            if m.get(TEMP, 0.0) > self.t.temp_c:
                self._fire(state, sample.ts, "temperature", m[TEMP], device)
            for name in (DBE, REMAP_PENDING, REMAP_FAILURE):
                if m.get(name, 0.0) > 0:
                    self._fire(state, sample.ts, "ecc", m[name], device)
            self._idle(state, sample.ts, device, gpu.job is not None, m.get(UTIL))

    def _tpu(self, sample: TpuSample) -> None:
        state = self._slice(sample.cluster, sample.slice, sample.pool, sample.zone, sample.ts)
        host = self._host(sample, state)
        for chip in sample.chips:
            device = f"{host.target.name}/{chip.chip_id}"
            self._idle(state, sample.ts, device, chip.job is not None, chip.metrics.get(DUTY))

    def _ici(self, sample: IciSample) -> None:
        state = self._slice(sample.cluster, sample.slice, sample.pool, sample.zone, sample.ts)
        for link in sample.links:
            if link.health >= ICI_DOWN:
                self._fire(state, sample.ts, "ici_down", float(link.health),
                           f"{link.chip_id}:{link.port}")
                return

    def _idle(self, state: _Target, ts: int, device: str, allocated: bool,
              util: float | None) -> None:
        if not allocated or util is None or util >= self.t.idle_pct:
            state.idle_since.pop(device, None)
            return
        since = state.idle_since.setdefault(device, ts)
        if ts - since >= self.t.idle_ms:
            self._fire(state, ts, "idle", util, device)

    def _sweep(self, now: int) -> None:
        """Targets (GPU nodes, TPU hosts) silent for longer than the timeout."""
        if now - self._swept < self.t.check_every_ms:
            return
        self._swept = now
        for key, state in self.targets.items():
            if key[0] == "slice":
                continue
            owner = self._owner(state)
            if state.held or owner.held:
                continue
            if now - state.last_seen >= self.t.silent_ms:
                self._fire(owner, now, "silent", (now - state.last_seen) / 1000, None)

    def _node_event(self, event: NodeEvent) -> None:
        kind = "node" if event.target_kind == "node" else "slice"
        state = self.targets.get((kind, event.target))
        if state is None:
            return
        if event.kind in ("cordoned", "deleted"):
            state.held = True
        elif event.kind in ("uncordoned", "created", "repaired"):
            state.held = False
            state.last_seen = max(state.last_seen, event.ts)

    # --- targets and outputs ----------------------------------------------------------------

    def _node(self, cluster: str, node: str, pool: str, zone: str, ts: int) -> _Target:
        state = self.targets.get(("node", node))
        if state is None:
            target = Target(cluster=cluster, kind="node", name=node, pool=pool, zone=zone)
            state = self.targets[("node", node)] = _Target(target, ts)
        state.last_seen = max(state.last_seen, ts)
        return state

    def _slice(self, cluster: str, name: str, pool: str, zone: str, ts: int) -> _Target:
        state = self.targets.get(("slice", name))
        if state is None:
            target = Target(cluster=cluster, kind="slice", name=name, pool=pool, zone=zone)
            state = self.targets[("slice", name)] = _Target(target, ts)
        return state

    def _host(self, sample: TpuSample, owner: _Target) -> _Target:
        # a TPU host is tracked for silence only; its actions go to its slice
        key = ("host", sample.node)
        state = self.targets.get(key)
        if state is None:
            state = self.targets[key] = _Target(
                Target(cluster=sample.cluster, kind="slice", name=sample.slice,
                       pool=sample.pool, zone=sample.zone), sample.ts)
        state.last_seen = max(state.last_seen, sample.ts)
        return state

    def _owner(self, state: _Target) -> _Target:
        if state.target.kind == "slice":
            return self.targets[("slice", state.target.name)]
        return state

    def _fire(self, state: _Target, ts: int, check: str, value: float, device: str | None,
              ) -> None:
        if state.last_fired is not None and ts - state.last_fired < self.t.refire_ms:
            return
        state.last_fired = ts
        target = state.target
        kind: Literal["repair_slice", "cordon"] = (
            "repair_slice" if target.kind == "slice" else "cordon")
        finding = Finding(
            finding_id=stable_id("baseline-finding", target.name, check, ts), ts=ts,
            entity=Entity(kind=target.kind, target=target, device=device), check=check,
            severity="critical", healthy=False, recommended_action=kind,
            evidence=Evidence(metric=check, value=value, baseline=None, score=None, window_s=0),
            message=f"static threshold {check} fired ({value:g})",
        )
        self.findings.append(finding)
        self.actions.append(Action(
            action_id=stable_id("baseline-action", finding.finding_id), ts=ts, kind=kind,
            target=target, reason=Reason(checks=[check], finding_ids=[finding.finding_id],
                                         summary=finding.message),
            dry_run=False, proposal_id=stable_id("baseline-proposal", finding.finding_id),
        ))
