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
from collections.abc import Awaitable, Callable
from typing import Any

from streams.metrics import WorkerMetrics

log = logging.getLogger("fleetpulse.worker")
EXIT_UNSENDABLE = 70  # EX_SOFTWARE: restart me; my inputs are not committed

Ack = Callable[[], Awaitable[Any]]


class Settler:
    def __init__(self, metrics: WorkerMetrics, batch: int, exit_: Callable[[int], Any] = os._exit):
        self.metrics = metrics
        self.batch = batch
        self._exit = exit_
        self._acks: list[Ack] = []
        self._futures: list[Awaitable[Any]] = []
        self._since = time.monotonic()

    def pending(self) -> int:
        return len(self._acks)

    def add(self, ack: Ack | None, futures: list[Awaitable[Any]]) -> bool:
        """Queue one record's ack (None: nothing to ack, e.g. a timer's outputs) and futures;
        return True when the batch is full and the caller should settle."""
        if not self._acks and not self._futures:
            self._since = time.monotonic()
        if ack is not None:
            self._acks.append(ack)
        self._futures.extend(futures)
        return len(self._acks) >= self.batch

    async def settle(self) -> None:
        """Await the queued futures, then ack the queued records (oldest first)."""
        if not self._acks and not self._futures:
            return
        # swap first: records added while we wait belong to the next batch
        acks, futures = self._acks, self._futures
        self._acks, self._futures = [], []
        started = self._since
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
        self.metrics.settle.observe(time.monotonic() - started)
