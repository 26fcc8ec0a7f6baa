"""The demo: simulate a mixed fleet, run the whole pipeline in-process, write lake and report.

Everything runs in one process on the embedded runtime (no Kafka). The result is scored
against the simulator's ground truth so the summary can say what was found and what was missed.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pipeline.backtest.score import POLICY_OUTPUTS, HeldLog, Score, score
from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.lake.tables import TABLES
from pipeline.lake.writer import LakeWriter
from pipeline.model import Action, Alert, CapacityEvent, Event, Finding, Proposal, XidEvent
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import ForcedFault, InjectedFault
from pipeline.sim.inventory import from_fleet
from pipeline.wire import codec

# lake table by the topic suffix its rows travel on
_TABLE_BY_SUFFIX = {spec.topic_suffix: name for name, spec in TABLES.items()}
# what a demo run leaves in its folder; the marker says a folder's lake is the demo's to clear
_MARKER = ".fleetpulse-demo"
_OUTPUTS = ("lake", "actions.jsonl", "report.html")
Progress = Callable[[int, "DemoResult"], None]


@dataclass
class DemoResult:
    out_dir: Path
    lake_dir: Path
    actions_file: Path
    ground_truth: list[InjectedFault]
    node_days: float
    events_in: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    actions: list[Action] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    alerts_firing: Counter[str] = field(default_factory=Counter)
    score: Score | None = None
    report_file: Path | None = None

    def withheld(self) -> list[Proposal]:
        """Proposals the policy did not turn into an action (budget, rate, capacity, dedupe)."""
        acted = {action.proposal_id for action in self.actions}
        return [p for p in self.proposals if p.proposal_id not in acted]


def run_demo(
    settings: Settings,
    out_dir: Path,
    progress: Progress | None = None,
    every: int = 5000,
    faults: Sequence[ForcedFault] = (),
    inventory: bool = False,
) -> DemoResult:
    """With `inventory`, the simulated fleet's inventory is fed first and enforced, as
    `fleetpulse inventory load` and `[inventory] enforce` do on Kafka."""
    sim = Simulation(settings.sim, faults)
    if inventory:
        membership = msgspec.structs.replace(settings.inventory, enforce=True)
        settings = msgspec.structs.replace(settings, inventory=membership)
    lake_dir = out_dir / "lake"
    result = DemoResult(
        out_dir, lake_dir, out_dir / "actions.jsonl", sim.ground_truth, sim.node_days
    )
    clear_previous_run(out_dir)
    writer = LakeWriter(lake_dir, settings.lake)
    sequence = Counter[str]()
    with result.actions_file.open("wb") as actions_out:

        def to_lake(suffix: str, event: Event) -> None:
            table = _TABLE_BY_SUFFIX.get(suffix)
            if table is not None:
                writer.add(table, event, (f"fleet.{suffix}", 0, sequence[suffix]))
                sequence[suffix] += 1

        held = HeldLog()
        dirty = [False]

        def emit(suffix: str, event: Event) -> None:
            dirty[0] = dirty[0] or suffix in POLICY_OUTPUTS
            _remember(result, event)
            if isinstance(event, Action):
                actions_out.write(codec.encode(event) + b"\n")
            to_lake(suffix, event)

        runtime = EmbeddedRuntime(settings, emit)
        for record in from_fleet(sim.fleet, sim.start_ms) if inventory else []:
            runtime.feed(record)
        for event in sim.events():
            if isinstance(event, XidEvent | CapacityEvent):
                to_lake("events.xid" if isinstance(event, XidEvent) else "events.capacity", event)
            runtime.feed(event)
            if dirty[0]:
                held.note_policy(runtime.policy.values())
                dirty[0] = False
            result.events_in += 1
            if writer.pending_rows >= settings.lake.flush_rows:
                writer.checkpoint()
            if progress is not None and result.events_in % every == 0:
                progress(getattr(event, "ts", sim.start_ms) - sim.start_ms, result)
        runtime.finish()
    writer.checkpoint()
    result.counts = runtime.counts
    result.score = score(
        sim.ground_truth, result.actions, result.findings, sim.node_days, held=held.held()
    )
    return result


def clear_previous_run(out_dir: Path) -> None:
    """Remove what an earlier demo left in `out_dir`, so that its lake and report hold this
    run alone (a shorter run wrote fewer files and kept the rest of the old one). A folder
    whose lake a demo did not write (no marker, no actions.jsonl beside it) is refused."""
    lake = out_dir / "lake"
    ours = (out_dir / _MARKER).exists() or (out_dir / "actions.jsonl").exists()
    if lake.exists() and not ours:
        raise ConfigError(
            f"{out_dir} holds a lake that `fleetpulse demo` did not write; give the demo "
            "another --out folder"
        )
    for name in _OUTPUTS:
        path = out_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / _MARKER).write_text("written by `fleetpulse demo`; cleared by the next run\n")


def _remember(result: DemoResult, event: Event) -> None:
    if isinstance(event, Action):
        result.actions.append(event)
    elif isinstance(event, Finding):
        if not event.healthy:
            result.findings.append(event)
    elif isinstance(event, Proposal):
        result.proposals.append(event)
    elif isinstance(event, Alert) and event.status == "firing":
        result.alerts_firing[event.labels.get("alertname", "?")] += 1
