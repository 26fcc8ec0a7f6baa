"""What a check is, as data: its signal, threshold, persistence, severity, action and evidence.

The catalog (catalog.py) declares one `CheckSpec` per check; the detectors compute signals and
verdicts, and the episode engine (episodes.py) takes the severity, action, entity kind and
persistence from the spec, so no rule repeats them. The docs' check table is generated from the
same specs (check_docs.py).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from pipeline.model import EntityKind, RecommendedAction, Severity

Unit = Literal["samples", "seconds"]
Detector = Literal[
    "gpu", "xid", "fabric", "fabric_localise", "job_peers", "tpu", "ici", "gpu, tpu", "clock"
]


class Persistence(msgspec.Struct, frozen=True, kw_only=True):
    """How long a condition must hold before its episode opens, and be gone before it clears.

    `open_after` / `clear_after` are a count or the name of the DetectSettings field holding
    it, in `samples` (consecutive scrapes) or `seconds` (event time). Counted by the episode
    engine unless `window` says how the check opens and clears itself (a count within a
    window, a quiet spell, a decaying rate): such checks open at the first bad verdict.
    """

    open_after: int | str = 1
    open_unit: Unit = "samples"
    clear_after: int | str = "clear_persist_samples"
    clear_unit: Unit = "samples"
    window: str = ""


class CheckSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One check: what it reads and compares, when it opens, and what it asks for."""

    name: str
    detector: Detector
    entity: EntityKind
    signal: str  # what is measured
    baseline: str  # what it is compared with
    threshold: str  # when it is bad, naming the settings
    settings: tuple[str, ...]  # the DetectSettings fields the check reads (docs, overrides)
    persistence: Persistence
    severity: Severity
    action: RecommendedAction
    evidence: str  # what the finding's evidence carries
    fatal: bool = False
    # The target was announced as going away (deleted, drained, maintained): its silence is
    # this (severity, action) instead.
    when_announced: tuple[Severity, RecommendedAction] | None = None
    # The action comes from the data the check reads (an NVML recovery action, the XID
    # catalog), not from the spec: where from.
    action_from: str = ""
    severity_from: str = ""  # likewise for severity and fatality

    @property
    def engine_counted(self) -> bool:
        """Whether the episode engine counts this check's persistence."""
        return not self.persistence.window
