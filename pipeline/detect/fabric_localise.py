"""Fabric localisation: which network element failed, from the port findings of many nodes.

The node detector (fabric.py) reports what one node sees of its ports. A port's trouble is
usually its cable/optic (one port) or the switch behind it (every port behind one leaf switch,
or one rail, at once), and neither is fixed by cordoning a node. So, as the ICI detector does
with both ends of a link, troubles are grouped across nodes:

  fabric.switch.down (switch)  ports of `fabric_switch_min_nodes` nodes behind one leaf switch
                               (inventory `leaf_switch`), or on one rail (inventory `rail`, same
                               NIC), in trouble within `fabric_group_window_s`   repair_switch
  fabric.link.down / .flapping / .errors (link)  one port's trouble that no switch explains
                               after `fabric_group_window_s` (so a switch pattern can form
                               first): its cable or optic, named <node>:<hca>:<port>  repair_link

Each element verdict is one finding (target kind switch or link) and one action for the
network team's actuator; no node is cordoned for it (a vanished NIC is the node detector's,
and cordons its node). A link has a verdict per check: a cable that flapped and then went
dark is news twice. A verdict clears when every port trouble behind it has cleared. A switch
verdict also clears when the troubles left behind it have been those of fewer than
`fabric_switch_min_nodes` nodes for `fabric_group_window_s`: a switch that failed brings its
ports back together, so a port still in trouble then is its own cable's (two independent
faults side by side look like a switch for as long as both last); those ports are judged
again, as links. Nodes without inventory placement get link verdicts only.

Pure: no I/O, no clock. `localise` takes one port finding, `advance` the event time.
"""

from __future__ import annotations

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect.catalog import FABRIC_SWITCH_DOWN, LINK_OF_PORT, SWITCH_SHORT, spec_of
from pipeline.detect.episodes import OPEN, Rule, Run, step, timer
from pipeline.detect.fabric import ELEMENT_CHECKS
from pipeline.detect.findings import evidence
from pipeline.ids import stable_id
from pipeline.model import (
    Action,
    ActionKind,
    ActionTargetKind,
    Entity,
    Finding,
    Reason,
    Target,
)

SWITCH_DOWN = FABRIC_SWITCH_DOWN
LINK_CHECKS = LINK_OF_PORT  # the link verdict of each port check
SHORT = "short"  # the run of a switch's troubles being of too few nodes


class Trouble(msgspec.Struct, kw_only=True, gc=False):
    """One open port finding of one node."""

    cluster: str
    node: str
    pool: str
    zone: str
    port: str  # "mlx5_0:1"
    check: str
    ts: int
    finding_id: str
    leaf: str | None = None
    rail: str | None = None
    element: str | None = None  # the element verdict that explains it


class Element(msgspec.Struct, kw_only=True, gc=False):
    """An open verdict on a switch or link."""

    kind: str  # "switch" or "link"
    name: str
    check: str
    start_ts: int
    cluster: str
    pool: str
    zone: str
    members: list[str] = []  # trouble keys it explains
    # a switch's: the run of its troubles being those of fewer than `fabric_switch_min_nodes`
    # nodes (catalog.SWITCH_SHORT)
    runs: dict[str, Run] = {}


class FabricFleetState(msgspec.Struct, kw_only=True):
    clock: int = 0
    troubles: dict[str, Trouble] = {}  # by "cluster/node|port|check"
    elements: dict[str, Element] = {}  # by "switch|cluster/name", "link|cluster/name|check"


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a node hangs in the fabric, from the inventory."""

    leaf: str | None = None
    rail: str | None = None


Output = tuple[FabricFleetState, list[Finding], list[Action]]


def localise(
    state: FabricFleetState | None,
    finding: Finding,
    placement: Placement,
    settings: DetectSettings,
    dry_run: bool = False,
) -> Output:
    """Take one fabric port finding (opening or clearing) of a node."""
    state = state or FabricFleetState()
    if finding.check not in ELEMENT_CHECKS or finding.entity.device is None:
        return state, [], []
    target = finding.entity.target
    key = f"{target.cluster}/{target.name}|{finding.entity.device}|{finding.check}"
    state.clock = max(state.clock, finding.ts)
    if finding.healthy:
        return _cleared(state, key, finding.ts)
    if key not in state.troubles:
        state.troubles[key] = Trouble(
            cluster=target.cluster,
            node=target.name,
            pool=target.pool,
            zone=target.zone,
            port=finding.entity.device,
            check=finding.check,
            ts=finding.ts,
            finding_id=finding.finding_id,
            leaf=placement.leaf,
            rail=placement.rail,
        )
    return _judge(state, finding.ts, settings, dry_run)


def advance(
    state: FabricFleetState | None, now_ms: int, settings: DetectSettings, dry_run: bool = False
) -> Output:
    """Event time moved on: troubles no switch explained within the window become link
    verdicts."""
    state = state or FabricFleetState()
    state.clock = max(state.clock, now_ms)
    min_nodes = settings.tuned(SWITCH_DOWN).fabric_switch_min_nodes
    if not any(t.element is None for t in state.troubles.values()) and not any(
        _short(state, e, min_nodes) for e in state.elements.values()
    ):
        return state, [], []
    return _judge(state, now_ms, settings, dry_run)


def _judge(state: FabricFleetState, now: int, settings: DetectSettings, dry_run: bool) -> Output:
    findings: list[Finding] = []
    actions: list[Action] = []
    window_ms = settings.fabric_group_window_s * 1000
    min_nodes = settings.tuned(SWITCH_DOWN).fabric_switch_min_nodes
    for group, name in _switch_groups(state, window_ms, min_nodes):
        group = [k for k in group if state.troubles[k].element is None]  # leaf before rail
        if not group:
            continue
        f, a = _open_element(state, "switch", name, SWITCH_DOWN, group, now, dry_run)
        findings += f
        actions += a
    # after the troubles that joined an open switch did (they may give it its quorum back)
    short_for = timer(settings, SWITCH_SHORT, SWITCH_DOWN)
    findings += _unsupported_switches(state, now, short_for, min_nodes)
    for key, trouble in sorted(state.troubles.items()):
        if trouble.element is None and now - trouble.ts >= window_ms:
            name = f"{trouble.node}:{trouble.port}"
            check = LINK_CHECKS[trouble.check]
            f, a = _open_element(state, "link", name, check, [key], now, dry_run)
            findings += f
            actions += a
    return state, findings, actions


def _unsupported_switches(
    state: FabricFleetState, now: int, short_for: Rule, min_nodes: int
) -> list[Finding]:
    """Clear the switch verdicts whose troubles have been those of fewer than `min_nodes`
    nodes for `short_for` (catalog.SWITCH_SHORT), and free those troubles to be judged again
    (as links, unless a switch pattern forms anew)."""
    findings = []
    for key, element in sorted(state.elements.items()):
        short = _short(state, element, min_nodes)
        if step(element.runs, SHORT, now, short, short_for) != OPEN:
            continue
        del state.elements[key]
        for member in element.members:
            state.troubles[member].element = None
        left = ", ".join(sorted({state.troubles[m].node for m in element.members}))
        findings.append(_finding(
            element, now, [], [], healthy=True,
            message=f"switch {element.name}: the ports behind it are back but for those of "
            f"{left}, too few for a switch; they are judged on their own",
        ))
    return findings


def _short(state: FabricFleetState, element: Element, min_nodes: int) -> bool:
    """A switch verdict whose troubles are now those of too few nodes to be a switch's."""
    if element.kind != "switch":
        return False
    return len({state.troubles[m].node for m in element.members}) < min_nodes


def _switch_groups(
    state: FabricFleetState, window_ms: int, min_nodes: int
) -> list[tuple[list[str], str]]:
    """Trouble keys grouped by leaf switch (any port) and by rail (same HCA port), where
    `min_nodes` nodes are in trouble within the window. A switch already open takes every
    later trouble behind it too."""
    leaves: dict[str, list[str]] = {}
    rails: dict[str, list[str]] = {}
    for key, t in sorted(state.troubles.items()):
        if t.leaf:
            leaves.setdefault(f"{t.cluster}/{t.leaf}", []).append(key)
        if t.rail:
            hca = t.port.partition(":")[0]
            rails.setdefault(f"{t.cluster}/{t.rail}.{hca}", []).append(key)
    out = []
    for scoped_name, keys in [*sorted(leaves.items()), *sorted(rails.items())]:
        open_switch = f"switch|{scoped_name}" in state.elements
        fresh = [k for k in keys if state.troubles[k].element is None]
        if not fresh:
            continue
        if not open_switch:
            latest = max(state.troubles[k].ts for k in fresh)
            recent = [k for k in fresh if latest - state.troubles[k].ts <= window_ms]
            if len({state.troubles[k].node for k in recent}) < min_nodes:
                continue
            fresh = recent
        out.append((fresh, scoped_name.partition("/")[2]))
    return out


def _open_element(
    state: FabricFleetState,
    kind: ActionTargetKind,
    name: str,
    check: str,
    members: list[str],
    now: int,
    dry_run: bool,
) -> tuple[list[Finding], list[Action]]:
    first = state.troubles[members[0]]
    key = f"{kind}|{first.cluster}/{name}" + (f"|{check}" if kind == "link" else "")
    element = state.elements.get(key)
    for member in members:
        state.troubles[member].element = key
    if element is not None:  # a later trouble behind an open switch: explained, nothing new
        element.members = sorted(set(element.members) | set(members))
        return [], []
    start = min(state.troubles[m].ts for m in members)
    element = state.elements[key] = Element(
        kind=kind,
        name=name,
        check=check,
        start_ts=start,
        cluster=first.cluster,
        pool=first.pool,
        zone=first.zone,
        members=sorted(members),
    )
    nodes = sorted({state.troubles[m].node for m in members})
    ports = sorted({f"{state.troubles[m].node}:{state.troubles[m].port}" for m in members})
    finding = _finding(element, now, nodes, ports, healthy=False)
    return [finding], [_action(element, finding, now, nodes, members, state, dry_run)]


def _target(element: Element) -> Target:
    kind: ActionTargetKind = "switch" if element.kind == "switch" else "link"
    return Target(
        cluster=element.cluster, kind=kind, name=element.name, pool=element.pool, zone=element.zone
    )


def _finding(
    element: Element, now: int, nodes: list[str], ports: list[str], healthy: bool,
    message: str = "",
) -> Finding:
    switch = element.kind == "switch"
    what = (
        f"switch {element.name}: ports of {len(nodes)} nodes behind it failed together "
        f"({', '.join(ports[:8])}{' ...' if len(ports) > 8 else ''}); no node is cordoned"
        if switch
        else f"link {element.name} ({element.check}): one port's cable or optic; the node "
        "stays in service"
    )
    spec = spec_of(element.check)
    return Finding(
        finding_id=stable_id(
            "fnd", element.cluster, element.kind, element.name, element.check, element.start_ts,
            *(("clear",) if healthy else ()),
        ),
        ts=now,
        entity=Entity(kind=spec.entity, target=_target(element)),
        check=element.check,
        severity="info" if healthy else spec.severity,
        healthy=healthy,
        recommended_action="none" if healthy else spec.action,
        evidence=None
        if healthy
        else evidence("nodes_affected" if switch else "ports_affected", len(nodes), 0.0, None, 0),
        message=message or (f"{element.kind} {element.name} recovered" if healthy else what),
    )


def _action(
    element: Element,
    finding: Finding,
    now: int,
    nodes: list[str],
    members: list[str],
    state: FabricFleetState,
    dry_run: bool,
) -> Action:
    kind: ActionKind = "repair_switch" if element.kind == "switch" else "repair_link"
    episode = stable_id("prp", element.cluster, element.kind, element.name, element.start_ts)
    finding_ids = [finding.finding_id, *[state.troubles[m].finding_id for m in members][:15]]
    return Action(
        action_id=stable_id("act", episode, kind),
        ts=now,
        kind=kind,
        target=_target(element),
        reason=Reason(
            checks=sorted({element.check} | {state.troubles[m].check for m in members}),
            finding_ids=finding_ids,
            summary=finding.message[:4000],
        ),
        dry_run=dry_run,
        proposal_id=episode,
    )


def _cleared(state: FabricFleetState, key: str, now: int) -> Output:
    trouble = state.troubles.pop(key, None)
    if trouble is None or trouble.element is None:
        return state, [], []
    element = state.elements.get(trouble.element)
    if element is None:
        return state, [], []
    element.members = [m for m in element.members if m != key]
    if element.members:
        return state, [], []
    del state.elements[trouble.element]
    return state, [_finding(element, now, [], [], healthy=True)], []
