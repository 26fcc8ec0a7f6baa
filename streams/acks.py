"""Acknowledge a record only after the broker has acknowledged everything it produced.

Agents read with manual acks (`stream.noack()`). For each record they queue its outputs and
table changelog writes (faust returns a future per send) and hand the record and the futures
to the Settler. The Settler awaits the futures of a batch together — every `ack_batch` records
or `ack_interval_ms`, whichever comes first — and only then acks the records, in order. faust
commits an offset only when every record up to it is acked, so a committed offset never passes
a record whose outputs might be lost. Waiting per batch instead of per record keeps one broker
round trip from costing one round trip per record.

If the broker never acknowledges (faust's producer gives up after `send_give_up_s`), the worker
exits at once without acking: its records are processed again by whoever takes the partitions
over, which is what at-least-once means. Deterministic ids make the repeats harmless.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from streams.metrics import WorkerMetrics

log = logging.getLogger("fleetpulse.worker")
EXIT_UNSENDABLE = 70  # EX_SOFTWARE: restart me; my inputs are not committed

Ack = Callable[[], Awaitable[Any]]
MAX_IN_FLIGHT = 4  # batches being settled while the agents go on with the next ones


class Settler:
    """Batches of (record acks, output futures); a batch is acked once its futures are done.

    Batches settle in the background, up to MAX_IN_FLIGHT at a time, so an agent keeps
    processing while the broker acknowledges the previous batch; `add` says when the current
    batch is full and `settle` then waits only if too many batches are already in flight.
    """

    def __init__(
        self, metrics: WorkerMetrics, batch: int, exit_: Callable[[int], Any] = os._exit
    ) -> None:
        self.metrics = metrics
        self.batch = batch
        self._exit = exit_
        self._acks: list[Ack] = []
        self._futures: list[Awaitable[Any]] = []
        self._since = time.monotonic()
        self._in_flight: deque[asyncio.Task[None]] = deque()
        # called as a batch closes: the writes it returns belong to the batch (context.flush)
        self.flush: Callable[[], list[Awaitable[Any]]] = list
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self, interval_s: float, before: Callable[[], None] = lambda: None) -> None:
        """Settle every `interval_s` from a task of our own (calling `before` first): faust
        stops its timers when a shutdown begins, then waits for every record to be acked."""
        self._closing = False
        self._task = asyncio.ensure_future(self._every(interval_s, before))

    async def close(self) -> None:
        """Settle everything queued and stop the loop (the consumer has stopped by then)."""
        self._closing = True
        await self.settle()
        await self.drain()
        if self._task is not None:
            self._task.cancel()

    async def _every(self, interval_s: float, before: Callable[[], None]) -> None:
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                before()
            except Exception:  # the loop that acks must outlive any bug in what it calls
                log.exception("periodic release failed")
            await self.settle()

    def add(self, ack: Ack | None, futures: list[Awaitable[Any]]) -> None:
        """Queue one record's ack (None: nothing to ack, e.g. a timer's outputs) and futures."""
        if not self._acks and not self._futures:
            self._since = time.monotonic()
        if ack is not None:
            self._acks.append(ack)
        self._futures.extend(futures)

    def unsettled(self) -> int:
        """Batches queued or being settled (for /metrics)."""
        return sum(not task.done() for task in self._in_flight) + bool(self._acks or self._futures)

    def full(self) -> bool:
        """The batch is full: the caller should `settle` before taking more records."""
        return len(self._acks) >= self.batch

    async def settle(self) -> None:
        """Start settling the queued batch; wait while too many batches are in flight."""
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft()
        self._futures.extend(self.flush())
        if self._acks or self._futures:
            # swap first: records added from now on belong to the next batch
            acks, futures = self._acks, self._futures
            self._acks, self._futures = [], []
            task = asyncio.ensure_future(self._settle(acks, futures, self._since))
            self._in_flight.append(task)
        while len(self._in_flight) > MAX_IN_FLIGHT:
            await self._in_flight.popleft()

    async def drain(self) -> None:
        while self._in_flight:
            await self._in_flight.popleft()

    async def _settle(self, acks: list[Ack], futures: list[Awaitable[Any]], since: float) -> None:
        try:
            await asyncio.gather(*futures)
        except Exception as exc:  # any send failure means the same: do not ack
            log.critical(
                "the broker did not acknowledge %d outputs (%s: %s); exiting without "
                "committing %d records, which will be processed again",
                len(futures),
                type(exc).__name__,
                exc,
                len(acks),
            )
            logging.shutdown()
            self._exit(EXIT_UNSENDABLE)
            return
        for ack in acks:
            await ack()
        self.metrics.settle.observe(time.monotonic() - since)
