"""Hostile and faulty inputs, built from a simulated fleet, and what the pipeline made of them.

Each scenario is a clean simulated recording with one kind of bad input mixed in (a host whose
clock is off, a monitoring outage, records naming the wrong pool, ghost nodes, a node name that
two clusters share). `run` feeds it through the embedded runtime, inventory first, the way
`fleetpulse replay --inventory` does, and counts what came out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from pipeline.config import Settings, SimSettings, load_settings
from pipeline.model import (
    Action,
    Alert,
    DeadLetter,
    Event,
    FabricSample,
    GpuSample,
    IciSample,
    Inventory,
    TpuSample,
    XidEvent,
)
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.sim.fleet import Fleet
from pipeline.sim.inventory import from_fleet
from pipeline.wire.codec import encode
from pipeline.wire.topics import TOPICS

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
SUFFIX = {spec.value: spec.suffix for spec in TOPICS}


def fleet_settings(gpu_nodes: int = 64, minutes: int = 40) -> SimSettings:
    return SimSettings(
        seed=5,
        gpu_nodes=gpu_nodes,
        tpu_slices=0,
        duration_s=minutes * 60,
        random_faults=False,
        diurnal=False,
    )


def simulate(sim_settings: SimSettings) -> tuple[Simulation, list[Event]]:
    sim = Simulation(sim_settings, [])
    return sim, list(sim.events())


def inventory_of(fleet: Fleet, ts: int) -> list[Inventory]:
    """Every GPU node and TPU slice of the simulated fleet, as its owner would list it (the
    same records `fleetpulse simulate` writes to inventory.jsonl)."""
    return from_fleet(fleet, ts)


@dataclass
class Outcome:
    """What one run produced, and the counts the Reliability table reports."""

    fed: int
    runtime: EmbeddedRuntime
    outputs: dict[str, list[Event]] = field(default_factory=dict)

    def of(self, suffix: str) -> list[Event]:
        return self.outputs.get(suffix, [])

    @property
    def removals(self) -> list[Action]:
        return [a for a in self.of("actions") if isinstance(a, Action) and a.kind == "cordon"]

    @property
    def dead_letters(self) -> list[DeadLetter]:
        return [d for d in self.of("dlq") if isinstance(d, DeadLetter)]

    held: dict[str, str] = field(default_factory=dict)  # proposal id -> why, the last time

    @property
    def withheld(self) -> Counter[str]:
        """Proposals withheld at some point of the run, by the rule that held them last."""
        return Counter(self.held.values())

    def note_withheld(self) -> None:
        for state in self.runtime.policy.values():
            for held in state.withheld.values():
                self.held[held.proposal.proposal_id] = held.reason
            for plan in state.maintenance.values():  # a maintenance cordon waiting, and why
                if plan.withheld:
                    self.held[f"maintenance:{plan.event_id}"] = plan.withheld

    @property
    def common_cause_alerts(self) -> list[Alert]:
        return [
            a
            for a in self.of("alerts")
            if isinstance(a, Alert)
            and a.labels.get("alertname") == "FleetPulseCommonCause"
            and a.status == "firing"
        ]

    @property
    def lost(self) -> int:
        """Records neither processed nor dead-lettered, plus samples a window dropped as late
        without a dead letter: what the pipeline lost silently. Inventory records count as
        fed and processed alike, whether loaded first or found in the recording."""
        processed = sum(n for k, n in self.runtime.counts.items() if k.startswith("in."))
        refused = sum(n for k, n in self.runtime.counts.items() if k.startswith("refused."))
        undecodable = len(self.dead_letters) - refused
        silently_late = sum(
            state.window.late for state in self.runtime.telemetry.values() if state.window
        )
        return self.fed - processed - undecodable + silently_late

    def figures(self, **extra: int | str) -> dict[str, int | float | str]:
        withheld = ", ".join(f"{n} {why}" for why, n in sorted(self.withheld.items())) or "0"
        return {
            "removals": len(self.removals),
            "withheld (rule)": withheld,
            "dead-lettered": len(self.dead_letters),
            "common-cause alerts": len(self.common_cause_alerts),
            "lost": self.lost,
            **extra,
        }


def run(
    events: Iterable[Event],
    inventory: list[Inventory] | None = None,
    settings: Settings | None = None,
    wall_ms: Callable[[], int] | None = None,
) -> Outcome:
    """Feed the inventory, then the recording (encoded and decoded as a consumer would)."""
    settings = settings or load_settings(environ={})
    if inventory is not None:
        settings = msgspec.structs.replace(
            settings,
            inventory=msgspec.structs.replace(settings.inventory, enforce=True),
        )
    outputs: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(
        settings, lambda s, e: outputs.setdefault(s, []).append(e), wall_ms=wall_ms
    )
    outcome = Outcome(fed=0, runtime=runtime, outputs=outputs)
    for record in inventory or []:
        outcome.fed += 1
        runtime.feed(record)
    for offset, event in enumerate(events):
        outcome.fed += 1
        runtime.feed_raw(SUFFIX[type(event)], encode(event), offset)
        outcome.note_withheld()
    runtime.finish()
    return outcome


# --- the hostile inputs -------------------------------------------------------------------


def without_inventory(events: list[Event]) -> list[Event]:
    """The recording less the inventory records the simulator puts at its start (a fleet
    whose owner publishes no inventory)."""
    return [e for e in events if not isinstance(e, Inventory)]


def skew_host(events: list[Event], node: str, from_ts: int, by_ms: int) -> list[Event]:
    """From `from_ts` on, every record of `node` carries its clock's time, off by `by_ms`."""
    out: list[Event] = []
    for event in events:
        own = isinstance(event, GpuSample | XidEvent | TpuSample | IciSample)
        if own and event.node == node and event.ts >= from_ts:
            event = msgspec.structs.replace(event, ts=event.ts + by_ms)
        out.append(event)
    return out


Scope = Callable[[Event], bool]


def everywhere(_: Event) -> bool:
    return True


def in_zone(zone: str) -> Scope:
    return lambda event: getattr(event, "zone", None) == zone


def in_pool(pool: str) -> Scope:
    return lambda event: getattr(event, "pool", None) == pool


def in_nodes(nodes: Iterable[tuple[str, str]]) -> Scope:
    """The records of these (cluster, node)s: the nodes behind one Prometheus server or scrape
    job, which share no pool or zone."""
    chosen = frozenset(nodes)
    return lambda event: (getattr(event, "cluster", None), getattr(event, "node", None)) in chosen


def outage(events: list[Event], start: int, end: int, scope: Scope = everywhere) -> list[Event]:
    """Every GPU node's telemetry (in `scope`) stops between `start` and `end` (a monitoring
    outage: the DCGM, kernel-log and node_exporter scrapes all go through the monitoring that
    is down)."""
    return [
        e
        for e in events
        if not (
            isinstance(e, GpuSample | XidEvent | FabricSample) and start <= e.ts < end and scope(e)
        )
    ]


def zeroed(events: list[Event], start: int, end: int, scope: Scope = everywhere) -> list[Event]:
    """Every GPU metric (in `scope`) reads 0 between `start` and `end` (an exporter or ingest
    bug)."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, GpuSample) and start <= event.ts < end and scope(event):
            gpus = [
                msgspec.structs.replace(g, metrics=dict.fromkeys(g.metrics, 0.0))
                for g in event.gpus
            ]
            event = msgspec.structs.replace(event, gpus=gpus)
        out.append(event)
    return out


def fatal_xid(sample: GpuSample, ts: int, pool: str | None = None, cluster: str | None = None) -> XidEvent:
    """An XID 79 (GPU fallen off the bus) on the sample's first GPU."""
    gpu = sample.gpus[0]
    assert gpu.pci_bus_id is not None, "the simulator names every GPU's PCI bus id"
    bus = gpu.pci_bus_id.lower()
    parts = bus.split(":")
    kernel_bus = f"{parts[-3][-4:]}:{parts[-2]}:{parts[-1].split('.')[0]}"
    return XidEvent(
        ts=ts,
        cluster=cluster or sample.cluster,
        node=sample.node,
        pool=pool or sample.pool,
        zone=sample.zone,
        pci_bus_id=kernel_bus,
        gpu_index=gpu.index,
        uuid=gpu.uuid,
        xid=79,
        message=f"NVRM: Xid (PCI:{kernel_bus}): 79, pid=0, GPU has fallen off the bus.",
        source="simulator",
    )


def first_samples(events: list[Event]) -> dict[tuple[str, str], GpuSample]:
    found: dict[tuple[str, str], GpuSample] = {}
    for event in events:
        if isinstance(event, GpuSample):
            found.setdefault((event.cluster, event.node), event)
    return found


def merge(events: list[Event], extra: list[Event]) -> list[Event]:
    """Insert `extra` in event-time order (stable: recorded events first at equal times)."""
    return sorted([*events, *extra], key=lambda e: getattr(e, "ts", 0))
