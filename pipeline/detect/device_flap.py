"""Device flapping: a GPU or TPU chip that leaves its host's scrape and comes back.

A device gone for `missing_samples` scrapes is already `gpu.missing` / `tpu.chip.missing`
(acted on at once). A shorter absence, or one that ends, says something too: a device that
drops out and returns is a loose riser, a failing PCIe retimer or a driver that keeps losing
it, and it kills whatever runs on it each time. So, as for fabric ports:

  <prefix>.flap             a return after an absence of at most `device_flap_window_s`: the
                            first up/down episode, watched
  <prefix>.flap.persistent  `device_flap_persist` returns within `device_flap_window_s`:
                            acted on (the node or slice comes out for repair)

Both clear after `device_flap_window_s` without a return. A flap happens while its host keeps
reporting: a device back after its host was itself silent (rebooted, repaired), or after an
absence longer than the window, is a return, not a flap.
"""

from __future__ import annotations

from pipeline.config import DetectSettings
from pipeline.detect.catalog import FLAP_PREFIXES, GPU_FLAP, flap_checks
from pipeline.detect.emit import Judgement, emit, said
from pipeline.detect.findings import Book, evidence
from pipeline.model import Finding

PREFIXES = FLAP_PREFIXES
__all__ = ["PREFIXES", "came_back", "flap_checks", "settled"]


def came_back(
    book: Book,
    returns: list[int],
    ts: int,
    away_ms: int,
    *,
    scrapes_away: int,
    interval_ms: float,
    prefix: str,
    device: str,
    settings: DetectSettings,
) -> tuple[list[int], list[Finding]]:
    """A device reports again after `away_ms` and `scrapes_away` scrapes of its host without
    it: the returns kept, and findings."""
    window_ms = settings.device_flap_window_s * 1000
    host_silent_too = away_ms > (scrapes_away + 2) * interval_ms
    if away_ms > window_ms or host_silent_too:
        return returns, []
    returns = [t for t in returns if ts - t <= window_ms] + [ts]
    flap, persistent = flap_checks(prefix)
    away_s = round(away_ms / 1000)
    found: list[Finding] = []
    first = said(
        f"{_name(prefix)} {device} of {book.name} left the scrape for {away_s} s and came "
        "back: first up/down episode, watched",
        evidence("seconds_away", away_s, 0.0, None, settings.device_flap_window_s),
    )
    emit(book, {}, ts, Judgement(flap, device, True, first), settings, found)
    persist = settings.tuned(persistent).device_flap_persist
    if len(returns) >= persist:
        again = said(
            f"{_name(prefix)} {device} of {book.name} keeps dropping out: {len(returns)} "
            f"returns within {settings.device_flap_window_s} s",
            evidence("returns", len(returns), persist, None, settings.device_flap_window_s),
        )
        emit(book, {}, ts, Judgement(persistent, device, True, again), settings, found)
    return returns, found


def settled(
    book: Book, returns: list[int], ts: int, *, prefix: str, device: str, settings: DetectSettings
) -> tuple[list[int], list[Finding]]:
    """No return for a whole window: the flapping episode is over."""
    if not returns or ts - returns[-1] <= settings.device_flap_window_s * 1000:
        return returns, []
    quiet = said(f"{_name(prefix)} {device}: no drop-out for {settings.device_flap_window_s} s")
    flap, persistent = flap_checks(prefix)
    found: list[Finding] = []
    for check in (persistent, flap):
        emit(book, {}, ts, Judgement(check, device, False, quiet), settings, found)
    return [], found


def _name(prefix: str) -> str:
    return "GPU" if prefix == GPU_FLAP else "chip"
