"""The clock_skew finding: a host whose event time is off the partition's clock.

The telemetry stage's door measures the offset (stages/clock.py) and keeps whether an episode
is open; this builds the finding from the catalog's spec (`clock_skew`: severity and action
while off, a healthy finding when it agrees again), as the episode engine does for the checks
of the detectors. Episodes are named by the reference time they opened at.
"""

from __future__ import annotations

from pipeline.detect.catalog import CLOCK_SKEW, spec_of
from pipeline.ids import stable_id
from pipeline.model import Entity, Evidence, Finding, Target


def skew_finding(
    target: Target, since: int, reference: int, off_ms: int | None, is_off: bool
) -> Finding:
    """The finding that opens (`is_off`) or closes the clock_skew episode of `target` that
    opened at `since` (reference time), found at `reference` with the offset `off_ms`
    (+ ahead, - behind; None when unknown)."""
    spec = spec_of(CLOCK_SKEW)
    phase = "open" if is_off else "close"
    off_s = abs(off_ms or 0) / 1000
    side = "ahead of" if (off_ms or 0) > 0 else "behind"
    message = (
        f"event time of {target.name} is {off_s:.0f} s {side} the partition's clock"
        if is_off
        else f"event time of {target.name} agrees with the partition's clock again"
    )
    return Finding(
        finding_id=stable_id("fnd", CLOCK_SKEW, target.cluster, target.name, str(since), phase),
        ts=reference,
        entity=Entity(kind=target.kind, target=target),
        check=CLOCK_SKEW,
        severity=spec.severity if is_off else "info",
        healthy=not is_off,
        recommended_action=spec.action if is_off else "none",
        evidence=Evidence(
            metric="event_time_skew_s",
            value=None if off_ms is None else off_ms / 1000,
            baseline=0.0,
            score=None,
            window_s=0,
        ),
        message=message,
    )
