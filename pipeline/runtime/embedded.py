"""The embedded runtime: the whole pipeline in one process, no Kafka, deterministic.

Records flow exactly as they do through the Kafka topics (telemetry → findings → health →
proposals/node-state → policy → actions, fed back to health), through the same functions in
pipeline/runtime/route.py. Outputs go to an `emit(topic_suffix, event)` callback — the demo
writes them to the lake; tests collect them.
"""

from __future__ import annotations

import base64
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

from pipeline import health, policy
from pipeline.codec import decode
from pipeline.config import Settings
from pipeline.errors import DecodeError
from pipeline.model import (
    CapacityEvent,
    DeadLetter,
    Event,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    NodeState,
    Proposal,
    TpuSample,
    XidEvent,
)
from pipeline.runtime import route
from pipeline.runtime.topics import TOPICS

Emit = Callable[[str, Event], None]


class _Work(NamedTuple):
    stage: str  # "health" or "policy"
    event: Event
    pool: str  # the policy key; unused by the health stage


_TELEMETRY = (GpuSample, XidEvent, TpuSample, IciSample)
_VALUE_BY_SUFFIX = {spec.suffix: spec.value for spec in TOPICS}


class EmbeddedRuntime:
    """Feed events in event-time order; outputs are emitted as they are produced."""

    def __init__(self, settings: Settings, emit: Emit | None = None) -> None:
        self.settings = settings
        self._emit_to = emit
        self.telemetry: dict[str, route.TelemetryState] = {}
        self.health: dict[str, health.HealthState] = {}
        self.policy: dict[str, policy.PolicyState] = {}
        self.pools_by_zone: dict[str, set[str]] = {}
        self.counts: Counter[str] = Counter()
        self._tick_ms: int | None = None

    def feed(self, event: Event) -> None:
        self.counts[f"in.{type(event).__name__}"] += 1
        if isinstance(event, _TELEMETRY):
            self._advance_time(event.ts)
            self._on_telemetry(event)
        elif isinstance(event, NodeEvent):
            self._announce(event)
            self._cascade([_Work("health", event, event.pool)])
        elif isinstance(event, CapacityEvent):
            self._announce(event)
            pools = route.capacity_pools(event, self.pools_by_zone)
            self._cascade([_Work("policy", event, pool) for pool in pools])
        else:
            raise TypeError(f"the embedded runtime takes input events, got {type(event).__name__}")

    def feed_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.feed(event)
        self.finish()

    def feed_raw(self, topic_suffix: str, raw: bytes, offset: int, key: str | None = None) -> None:
        """Decode like a Kafka consumer would; bad records become dead letters, never errors."""
        try:
            event = decode(raw, _VALUE_BY_SUFFIX[topic_suffix])
        except DecodeError as exc:
            self._dead_letter(topic_suffix, raw, offset, key, str(exc))
            return
        self.feed(event)

    def finish(self) -> None:
        """End of input: close the utilization windows still open."""
        for key in sorted(self.telemetry):
            for row in route.flush_windows(self.telemetry[key]):
                self._emit("utilization", row)

    # --- stages ---------------------------------------------------------------------------

    def _advance_time(self, ts: int) -> None:
        boundary = route.tick_boundary(ts)
        if self._tick_ms is not None and boundary <= self._tick_ms:
            return
        self._tick_ms = boundary
        for key in sorted(self.telemetry):
            state, findings = route.on_time(self.telemetry[key], boundary, self.settings)
            self.telemetry[key], rows = route.close_silent_windows(state, boundary, self.settings)
            for row in rows:
                self._emit("utilization", row)
            self._cascade([_Work("health", finding, "") for finding in findings])

    def _announce(self, event: NodeEvent | CapacityEvent) -> None:
        key = route.announcement_key(event)
        if key is not None and key in self.telemetry:
            self.telemetry[key] = route.on_announcement(self.telemetry[key], event)

    def _on_telemetry(self, event: route.Telemetry) -> None:
        key = route.telemetry_key(event)
        state, findings, rows = route.on_telemetry(self.telemetry.get(key), event, self.settings)
        self.telemetry[key] = state
        for row in rows:
            self._emit("utilization", row)
        self._cascade([_Work("health", finding, "") for finding in findings])

    def _cascade(self, work: list[_Work]) -> None:
        # Breadth-first, like records travelling through topics: a stage's outputs are handled
        # after the inputs already queued, and actions flow back into the health machine.
        queue = deque(work)
        while queue:
            item = queue.popleft()
            if item.stage == "health":
                queue.extend(self._on_health(item.event))  # type: ignore[arg-type]
            else:
                queue.extend(self._on_policy(item.pool, item.event))  # type: ignore[arg-type]

    def _on_health(self, signal: route.HealthSignal) -> list[_Work]:
        if isinstance(signal, Finding):
            self._emit("findings", signal)
        key = route.health_key(signal)
        state, proposals, node_state = route.on_health(self.health.get(key), signal, self.settings)
        self.health[key] = state
        next_work = [_Work("policy", p, route.policy_key(p)) for p in proposals]
        if node_state is not None:
            self._emit("node-state", node_state)
            target = node_state.target
            self.pools_by_zone.setdefault(target.zone, set()).add(route.pool_key(target))
            next_work.append(_Work("policy", node_state, route.pool_key(target)))
        return next_work

    def _on_policy(self, pool: str, signal: Proposal | NodeState | CapacityEvent) -> list[_Work]:
        if isinstance(signal, Proposal):
            self._emit("proposals", signal)
        state, actions, alerts = route.on_policy(self.policy.get(pool), signal, self.settings)
        self.policy[pool] = state
        for alert in alerts:
            self._emit("alerts", alert)
        for action in actions:
            self._emit("actions", action)
        return [_Work("health", action, pool) for action in actions]

    def _dead_letter(
        self, suffix: str, raw: bytes, offset: int, key: str | None, error: str
    ) -> None:
        letter = DeadLetter(
            ts=self._tick_ms or 1_000_000_000_000,
            topic=suffix,
            partition=0,
            offset=offset,
            key=key,
            error=error,
            raw_b64=base64.b64encode(raw).decode(),
        )
        self._emit("dlq", letter)

    def _emit(self, suffix: str, event: Event) -> None:
        self.counts[f"out.{suffix}"] += 1
        if self._emit_to is not None:
            self._emit_to(suffix, event)


def collect(settings: Settings, events: Iterable[Event]) -> dict[str, list[Event]]:
    """Run events through the embedded pipeline and return every output by topic suffix."""
    outputs: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(
        settings, lambda suffix, event: outputs.setdefault(suffix, []).append(event)
    )
    runtime.feed_all(events)
    return outputs
