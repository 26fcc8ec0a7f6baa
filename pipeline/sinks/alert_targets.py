"""fleet.alerts to every alert target, each on its own queue and thread (`fleetpulse alerts`).

`AlertDelivery` is the edge's sink (pipeline/wire/edge.py): `add` decodes a record and puts its
alert on the queue of every target (`TargetQueue`); each target's thread delivers its queue in
batches, with its own retries, so a target that drips, hangs or answers 5xx delays nobody else.

What the commit waits for. A record is settled once every target has either delivered its
alert (2xx) or given it up: refused for good (4xx, 3xx: a dead letter with the answer) or
pushed out of a full queue (more than `alerts.target_queue_max` waiting: a dead letter with
reason `target_stalled`). The edge commits each partition up to its oldest unsettled record
(`unsettled`), and a given-up record counts as settled only once its dead letter is handed
to the edge, which has the broker acknowledge it before it commits. So delivery is at least
once per target: a crash or rebalance replays from the oldest record some target still
holds, and the targets that had delivered past it get those alerts again (same fingerprints
and webhook-id: receivers drop them). While one target is stalled, the others keep
delivering new alerts and the commit waits at that target's oldest alert; its queue bounds
both the memory and how far the commit can fall behind. A full queue at a target that is not
stalled yet (a burst larger than the queue) holds reading until it has room, at most until
the target counts as stalled; a stalled target's full queue gives its oldest alerts up.

A target is stalled once its oldest waiting alert has waited `alerts.stalled_after_s`:
/readyz is then not ready, naming it, and `fleetpulse_alerts_target_stalled{target}` is 1.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pipeline.config import AlertSettings
from pipeline.errors import DecodeError
from pipeline.model import Alert
from pipeline.redact import redact
from pipeline.retry import Backoff
from pipeline.sinks.webhook import Delivered, DeliveryError
from pipeline.wire.codec import decode
from pipeline.wire.edge import Positions, Rejected

log = logging.getLogger(__name__)

BATCH_MAX = 500  # alerts in one POST
IDLE_WAIT_S = 0.5  # a target's thread looks at its stop flag this often when idle


class AlertSink(Protocol):
    name: str

    def deliver(self, alerts: Sequence[Alert]) -> Delivered: ...


@dataclass
class AlertStats:
    """The alert sink's own counters (the edge counts records, dead letters, flushes)."""

    alerts: int = 0  # records settled at every target (delivered or given up)
    tombstones: int = 0  # null values: nothing to deliver, not an error
    # per target ("webhook http://…", "alertmanager http://…"), on /metrics as
    # fleetpulse_alerts_target_<name>{target="…"}
    target_delivered: dict[str, int] = field(default_factory=dict, metadata={"label": "target"})
    target_failures: dict[str, int] = field(default_factory=dict, metadata={"label": "target"})
    target_given_up: dict[str, int] = field(default_factory=dict, metadata={"label": "target"})
    target_waiting: dict[str, int] = field(default_factory=dict,
                                           metadata={"label": "target", "gauge": True})
    target_stalled: dict[str, int] = field(default_factory=dict,
                                           metadata={"label": "target", "gauge": True})


def unique_alerts(alerts: Sequence[Alert]) -> list[Alert]:
    """Drop repeats (a replayed record), keeping the first of each in order."""
    seen: set[tuple[str, str, str, str | None]] = set()
    out = []
    for alert in alerts:
        key = (alert.fingerprint, alert.status, alert.startsAt, alert.endsAt)
        if key not in seen:
            seen.add(key)
            out.append(alert)
    return out


class _Item(NamedTuple):
    seq: int  # the record's place in AlertDelivery
    alert: Alert
    at: float  # monotonic time it was queued


# what a target reports: (seqs, None) delivered, (seqs, error) given up for good
Settle = Callable[["TargetQueue", list[int], str | None], None]


class TargetQueue:
    """One target's queue and the thread that delivers it, retrying a failed batch forever
    (with backoff) until it is delivered or refused. At most `capacity` alerts wait here (in
    flight or queued); see `put` for what happens to one more."""

    def __init__(self, sink: AlertSink, settle: Settle, settings: AlertSettings,
                 stats: AlertStats) -> None:
        self.sink, self.name, self.capacity = sink, sink.name, settings.target_queue_max
        self.stalled_after_s = settings.stalled_after_s
        self._settle, self._stats = settle, stats
        self._backoff = Backoff(settings.backoff_initial_s, min(settings.backoff_max_s, 5.0))
        self._cond = threading.Condition()  # an RLock underneath: methods may nest
        self._queue: deque[_Item] = deque()
        self._inflight: list[_Item] = []
        self._generation = 0  # bumped by discard: results of older batches are ignored
        self._failing_since: float | None = None  # the first failed delivery since a success
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"alerts {self.name}",
                                        daemon=True)
        for counts in (stats.target_delivered, stats.target_failures, stats.target_given_up,
                       stats.target_waiting, stats.target_stalled):
            counts.setdefault(self.name, 0)

    def start(self) -> None:
        self._thread.start()

    def put(self, seq: int, alert: Alert) -> list[int]:
        """Queue one alert; returns the seqs pushed out (to be given up).

        A full target that is not stalled waits for room (a burst larger than the queue, at a
        target that delivers, loses nothing); a stalled one gives up its oldest alerts, in
        flight or queued, so the commit can move past them. On the way out nothing is pushed
        out: what is not delivered is replayed."""
        with self._cond:
            while (self._count() >= self.capacity and not self._stop.is_set()
                   and self.stalled_for(time.monotonic()) is None):
                self._cond.wait(0.1)
            self._queue.append(_Item(seq, alert, time.monotonic()))
            over = []
            while self._count() > self.capacity and not self._stop.is_set():
                oldest = self._inflight.pop(0) if self._inflight else self._queue.popleft()
                over.append(oldest.seq)
            self._cond.notify_all()
        return over

    @property
    def failing(self) -> bool:
        """Its last delivery failed (and is being retried)."""
        return self._failing_since is not None

    def _count(self) -> int:
        return len(self._inflight) + len(self._queue)

    def waiting(self) -> tuple[int, float | None]:
        """How many alerts wait here, and since when (monotonic) the oldest has."""
        with self._cond:
            items = self._inflight + list(self._queue)
        return len(items), min((item.at for item in items), default=None)

    def stalled_for(self, now: float) -> float | None:
        """How long alerts have waited here (the oldest), or deliveries failed while some
        wait, once that is stalled_after_s or more; else None."""
        with self._cond:
            count, oldest = self.waiting()
            failing = self._failing_since
        if not count or oldest is None:
            return None
        waited = now - min(oldest, failing if failing is not None else oldest)
        return waited if waited >= self.stalled_after_s else None

    def discard(self) -> None:
        """Drop everything queued or in flight (it is replayed from the last commit)."""
        with self._cond:
            self._queue.clear()
            self._inflight = []
            self._generation += 1

    def close(self, timeout_s: float) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            batch, generation = self._next()
            if not batch:
                continue
            started = time.monotonic()
            error = self._deliver(batch)
            if error == "retry":
                self._failing_since = self._failing_since or started
                self._stop.wait(self._backoff.next_delay())  # then what is left of the batch
                continue
            self._failing_since = None  # it answers (a refusal is an answer)
            self._backoff.reset()
            # settled before it leaves the queue, so `waiting` never misses it; seqs discarded
            # meanwhile are ignored there
            self._settle(self, [item.seq for item in batch], error)
            with self._cond:
                if generation == self._generation:
                    self._inflight = []
                self._cond.notify_all()  # room for a put waiting on a full queue

    def _next(self) -> tuple[list[_Item], int]:
        """The batch in flight (a retry: what `put` left of it), or the next from the queue."""
        with self._cond:
            if not self._inflight:
                if not self._queue:
                    self._cond.wait(IDLE_WAIT_S)
                take = min(len(self._queue), BATCH_MAX)
                self._inflight = [self._queue.popleft() for _ in range(take)]
                self._cond.notify_all()  # room for a put waiting on a full queue
            return list(self._inflight), self._generation

    def _deliver(self, batch: list[_Item]) -> str | None:
        """None: delivered; "retry": may succeed later; else the refusal, for a dead letter."""
        alerts = unique_alerts([item.alert for item in batch])
        try:
            self.sink.deliver(alerts)
        except DeliveryError as exc:
            self.last_error = redact(str(exc))
            if exc.permanent:
                log.error("%s refused %d alerts: %s", self.name, len(alerts), self.last_error)
                return self.last_error
            self._stats.target_failures[self.name] += 1
            log.warning("%s: %d alerts not delivered yet (%s); retrying", self.name,
                        len(alerts), self.last_error)
            return "retry"
        except Exception as exc:  # a bug must not end the thread: retried, and on /readyz
            self.last_error = redact(f"{type(exc).__name__}: {exc}")
            self._stats.target_failures[self.name] += 1
            log.exception("%s: delivery failed; retrying", self.name)
            return "retry"
        self.last_error = ""
        self._stats.target_delivered[self.name] += len(alerts)
        return None


@dataclass
class _Record:
    record: Any
    alert: Alert
    targets: set[str]  # the targets that have not settled it yet


class AlertDelivery:
    """fleet.alerts as an EdgeSink that also `Settles` (pipeline/wire/edge.py): `add` queues each
    alert at every target, `flush` hands over the dead letters of what targets gave up, and
    `unsettled` says where each partition's commit must stop."""

    def __init__(self, settings: AlertSettings, max_value_bytes: int,
                 sinks: Sequence[AlertSink], stats: AlertStats) -> None:
        self.stats, self.limit, self.timeout_s = stats, max_value_bytes, settings.timeout_s
        self._lock = threading.Lock()
        self._records: dict[int, _Record] = {}  # by seq, in the order read
        self._given_up: list[tuple[int, str, str, str]] = []  # seq, target, reason, error
        self._seq = 0
        self.targets = [TargetQueue(sink, self._settle, settings, stats) for sink in sinks]
        names = [target.name for target in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"two alert targets have the same URL: {sorted(names)}")
        for target in self.targets:
            target.start()

    # --- the edge's side ------------------------------------------------------------------

    def add(self, record: Any) -> None:
        try:
            alert = decode(record.value, Alert, self.limit)
        except DecodeError as exc:
            if exc.reason != "tombstone":
                raise
            self.stats.tombstones += 1
            return
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._records[seq] = _Record(record, alert, {t.name for t in self.targets})
        for target in self.targets:
            pushed_out = target.put(seq, alert)
            if pushed_out:
                why = (f"{target.name}: not delivered, more than {target.capacity} alerts "
                       f"waiting (alerts.target_queue_max); last error: "
                       f"{target.last_error or 'none yet'}")
                self._settle(target, pushed_out, why, reason="target_stalled")

    def flush(self) -> list[Rejected]:
        """The records targets gave up since the last flush, as dead letters; from now on
        they count as settled there. Never waits for a delivery."""
        with self._lock:
            given_up, self._given_up = self._given_up, []
            rejected = []
            for seq, name, reason, error in given_up:
                entry = self._records.get(seq)
                if entry is None:
                    continue  # discarded meanwhile
                rejected.append(Rejected(entry.record, reason, error))
                self._done_at(seq, entry, name)
        self.refresh()
        return rejected

    def unsettled(self) -> Positions:
        """Per partition, the offset of the oldest record some target has not settled."""
        oldest: Positions = {}
        with self._lock:
            for entry in self._records.values():  # in the order read: offsets ascend
                oldest.setdefault((entry.record.topic, entry.record.partition),
                                  entry.record.offset)
        return oldest

    def wait_settled(self) -> None:
        """On the way out: give the targets that deliver one delivery deadline to settle
        what they hold (what they do not is replayed by the next owner)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            # each delivered or given up (handed over by the last flush), or failing: not
            # worth waiting for
            if all(target.waiting()[0] == 0 or target.failing for target in self.targets):
                return
            time.sleep(0.05)

    def discard(self) -> None:
        with self._lock:
            self._records.clear()
            self._given_up = []
            for target in self.targets:
                target.discard()
        self.refresh()

    # --- the targets' side ----------------------------------------------------------------

    def _settle(self, target: TargetQueue, seqs: list[int], error: str | None,
                reason: str = "refused") -> None:
        with self._lock:
            for seq in seqs:
                entry = self._records.get(seq)
                if entry is None:
                    continue  # discarded meanwhile
                if error is None:
                    self._done_at(seq, entry, target.name)
                else:  # settled once its dead letter is handed over (flush)
                    self.stats.target_given_up[target.name] += 1
                    self._given_up.append((seq, target.name, reason, error))
        self.refresh()

    def _done_at(self, seq: int, entry: _Record, name: str) -> None:
        entry.targets.discard(name)
        if not entry.targets:
            del self._records[seq]
            self.stats.alerts += 1

    # --- health ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """The per-target gauges, as of now."""
        now = time.monotonic()
        for target in self.targets:
            count, _ = target.waiting()
            self.stats.target_waiting[target.name] = count
            self.stats.target_stalled[target.name] = int(target.stalled_for(now) is not None)

    def readiness(self) -> tuple[bool, str]:
        """Not ready while a target is stalled, naming it (the others still deliver)."""
        self.refresh()
        now, stalled = time.monotonic(), []
        for target in self.targets:
            waited = target.stalled_for(now)
            if waited is not None:
                count, _ = target.waiting()
                stalled.append(f"{target.name} stalled: {count} alerts waiting, the oldest "
                               f"for {waited:.0f} s (last error: {target.last_error or 'none'})")
        if stalled:
            return False, "; ".join(stalled)
        return True, "every alert target delivers"

    def close(self) -> None:
        for target in self.targets:
            target.close(timeout_s=1.0)
