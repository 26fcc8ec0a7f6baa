"""The embedded runtime: the whole pipeline in one process, no Kafka, deterministic.

Records flow exactly as they do through the Kafka topics (telemetry → findings → health →
proposals/node-state → policy → actions, fed back to health), through the same functions in
pipeline/runtime/route.py. Outputs go to an `emit(topic_suffix, event)` callback — the demo
writes them to the lake; tests collect them.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

from pipeline import guard, health, policy
from pipeline.codec import decode, encode
from pipeline.config import Settings
from pipeline.deadletter import dead_letter
from pipeline.errors import DecodeError
from pipeline.model import (
    CapacityEvent,
    Event,
    Finding,
    GpuSample,
    IciSample,
    Inventory,
    NodeEvent,
    PolicyRelease,
    Proposal,
    TpuSample,
    XidEvent,
)
from pipeline.runtime import route
from pipeline.runtime.clock import RobustClock
from pipeline.runtime.topics import TOPICS, record_key

Emit = Callable[[str, Event], None]


class _Work(NamedTuple):
    stage: str  # "health" or "policy"
    event: Event
    pool: str  # the policy key; unused by the health stage


_TELEMETRY = (GpuSample, XidEvent, TpuSample, IciSample)
_VALUE_BY_SUFFIX = {spec.suffix: spec.value for spec in TOPICS}
_SUFFIX_BY_VALUE = {spec.value: spec.suffix for spec in TOPICS}


def _family_of(state: route.TelemetryState) -> route.Family | None:
    if state.gpu is not None or state.xid is not None:
        return "gpu"
    if state.tpu is not None or state.ici is not None:
        return "tpu"
    return None


class EmbeddedRuntime:
    """Feed events in event-time order; outputs are emitted as they are produced.

    The whole fleet is one stream: one robust clock per source family (clock.py), as a Kafka
    partition has. `wall_ms` (a callable) bounds how far ahead of the receiving process an
    event may be, where that makes sense (not for a replay of history)."""

    def __init__(
        self,
        settings: Settings,
        emit: Emit | None = None,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        self._emit_to = emit
        self._wall_ms = wall_ms
        self.telemetry: dict[str, route.TelemetryState] = {}
        self.health: dict[str, health.HealthState] = {}
        self.policy: dict[str, policy.PolicyState] = {}
        self.guard: guard.GuardState | None = None
        self.pools_by_zone: dict[str, set[str]] = {}
        self.counts: Counter[str] = Counter()
        self.clocks = {family: RobustClock(settings.clock) for family in route.FAMILIES}
        self._offset = 0  # pseudo offsets for dead letters of events fed as objects

    def feed(self, event: Event) -> None:
        self.counts[f"in.{type(event).__name__}"] += 1
        if isinstance(event, _TELEMETRY):
            self._on_telemetry(event)
        elif isinstance(event, Inventory):
            key = record_key(event)
            self.telemetry[key] = route.on_inventory(self.telemetry.get(key), event)
            self._cascade([_Work("policy", event, route.GUARD_KEY)])
        elif isinstance(event, PolicyRelease):
            self._cascade([_Work("policy", event, route.GUARD_KEY)])
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

    def feed_raw(
        self, topic_suffix: str, raw: bytes | None, offset: int, key: str | None = None
    ) -> None:
        """Decode like a Kafka consumer would; bad records become dead letters, never errors.
        A tombstone on the compacted inventory topic is a target leaving it, as in the worker."""
        limit = self.settings.kafka.max_value_bytes
        try:
            event = decode(raw, _VALUE_BY_SUFFIX[topic_suffix], limit)
        except DecodeError as exc:
            if exc.reason == "tombstone" and topic_suffix == "inventory" and key is not None:
                self.counts["tombstones"] += 1
                self.telemetry[key] = route.on_inventory(self.telemetry.get(key), None)
                return
            self.counts[f"dead.{exc.reason}"] += 1
            self._dead_letter(topic_suffix, raw, offset, key, str(exc), exc.reason)
            return
        self._offset = offset
        self.feed(event)

    def reject(self, topic: str, raw: bytes, offset: int, error: str) -> None:
        """A record that never reached a topic (a bad line of a recording): a dead letter."""
        self._dead_letter(topic, raw, offset, None, error, "invalid")

    def finish(self) -> None:
        """End of input: close the utilization windows still open."""
        for key in sorted(self.telemetry):
            for row in route.flush_windows(self.telemetry[key]):
                self._emit("utilization", row)

    # --- stages ---------------------------------------------------------------------------

    def _tick(self, family: route.Family, boundaries: list[int]) -> None:
        """The family's clock crossed `boundaries`: check that family's keys for silence."""
        for boundary in boundaries:
            for key in sorted(self.telemetry):
                state = self.telemetry[key]
                if _family_of(state) != family:
                    continue
                resumed = self.clocks[family].resumed
                state, findings = route.on_time(state, boundary, self.settings, resumed)
                self.telemetry[key], rows = route.close_silent_windows(
                    state, boundary, self.settings
                )
                for row in rows:
                    self._emit("utilization", row)
                self._cascade([_Work("health", finding, "") for finding in findings])

    def _announce(self, event: NodeEvent | CapacityEvent) -> None:
        key = route.announcement_key(event)
        if key is not None and key in self.telemetry:
            self.telemetry[key] = route.on_announcement(self.telemetry[key], event)

    def _on_telemetry(self, event: route.Telemetry) -> None:
        key = route.telemetry_key(event)
        family = route.FAMILY_OF[type(event)]
        clock = self.clocks[family]
        wall = self._wall_ms() if self._wall_ms is not None else None
        state, admitted, refusal, skew = route.door(
            self.telemetry.get(key), event, clock, self.settings, wall
        )
        self.telemetry[key] = state
        self._cascade([_Work("health", finding, "") for finding in skew])
        if refusal is not None or admitted is None:
            self.counts[f"refused.{refusal.reason if refusal else 'unknown'}"] += 1
            suffix = _SUFFIX_BY_VALUE[type(event)]
            message = refusal.message if refusal else "refused"
            reason = refusal.reason if refusal else "refused"
            self._dead_letter(suffix, encode(event), self._offset, key, message, reason)
            return
        if self.settings.inventory.enforce and state.inventory is None:
            self.counts["unknown_target"] += 1  # processed; never removed (guard.py)
        if isinstance(admitted, route.CLOCK_MOVERS):
            self._tick(family, clock.observe(key, admitted.ts))
        state, findings, rows = route.on_telemetry(
            self.telemetry.get(key), admitted, self.settings
        )
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

    def _on_policy(self, pool: str, signal: route.PolicySignal) -> list[_Work]:
        if isinstance(signal, Proposal):
            self._emit("proposals", signal)
        state, self.guard, actions, alerts = route.on_policy(
            self.policy.get(pool), self.guard, signal, self.settings, pool
        )
        if state is not None:
            self.policy[pool] = state
        for alert in alerts:
            self._emit("alerts", alert)
        for action in actions:
            self._emit("actions", action)
        return [_Work("health", action, pool) for action in actions]

    def _dead_letter(
        self, suffix: str, raw: bytes | None, offset: int, key: str | None, error: str, reason: str
    ) -> None:
        ticked = [clock.ticked for clock in self.clocks.values() if clock.ticked is not None]
        letter = dead_letter(
            ts_ms=max(ticked, default=0),
            topic=suffix,
            partition=0,
            offset=offset,
            key=key,
            raw=raw,
            error=error,
            reason=reason,
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
