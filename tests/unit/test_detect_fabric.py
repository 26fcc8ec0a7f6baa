"""GPU fabric: the node detector (port down, flapping, gray errors, vanished NIC) and the
localisation of port troubles to their switch, rail or link across nodes.

Nodes have four IB ports mlx5_0..3 (port 1); nodes n0 and n1 hang off leaf-a, n2 off leaf-b.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.detect import FabricNodeState, detect_fabric
from pipeline.detect.fabric_localise import FabricFleetState, Placement, advance, localise
from pipeline.model import Action, FabricPort, FabricSample, Finding
from pipeline.runtime.embedded import EmbeddedRuntime
from tests.detect_fixture import SETTINGS, T0

STEP = 30_000
PORTS = 4
PLACES = {
    "n0": Placement(leaf="leaf-a", rail="rails-1"),
    "n1": Placement(leaf="leaf-a", rail="rails-1"),
    "n2": Placement(leaf="leaf-b", rail="rails-1"),
}
# (node, port, step) -> metric overrides of that port at that scrape; None: the port is absent
Port = Callable[[str, int, int], dict[str, float] | None]


def healthy(node: str, port: int, step: int) -> dict[str, float]:
    return {}


def down(metrics: dict[str, float]) -> dict[str, float]:
    return {"node_infiniband_state_id": 1.0, "node_infiniband_physical_state_id": 2.0,
            "node_network_up": 0.0, **metrics}  # fmt: skip


def sample(node: str, step: int, port: Port) -> FabricSample:
    ports = []
    for p in range(PORTS):
        extra = port(node, p, step)
        if extra is None:
            continue
        metrics = {
            "node_infiniband_state_id": 4.0, "node_infiniband_physical_state_id": 5.0,
            "node_network_up": 1.0, "node_infiniband_link_downed_total": 2.0,
            "node_network_carrier_changes_total": 4.0, "node_infiniband_symbol_error_total": 7.0,
            "node_infiniband_port_data_received_bytes_total": 1e9 * step, **extra,
        }  # fmt: skip
        ports.append(FabricPort(device=f"mlx5_{p}", port=1, netdev=f"ib{p}", metrics=metrics))
    return FabricSample(ts=T0 + step * STEP, cluster="c1", node=node, pool="p1", zone="z1",
                        ports=ports)  # fmt: skip


def run_nodes(steps: int, port: Port, nodes: tuple[str, ...] = ("n0", "n1", "n2")) -> tuple[
    list[Finding], list[Finding], list[Action]
]:
    """Every node scraped every step through the detector and the localiser: node findings,
    element findings, actions."""
    states: dict[str, FabricNodeState | None] = dict.fromkeys(nodes)
    fleet: FabricFleetState | None = None
    node_out: list[Finding] = []
    elem_out: list[Finding] = []
    acts: list[Action] = []
    for step in range(steps):
        for node in nodes:
            s = sample(node, step, port)
            states[node], found = detect_fabric(states[node], s, SETTINGS)
            node_out += found
            for finding in found:
                fleet, f, a = localise(fleet, finding, PLACES[node], SETTINGS)
                elem_out += f
                acts += a
            fleet, f, a = advance(fleet, s.ts, SETTINGS)
            elem_out += f
            acts += a
    return node_out, elem_out, acts


def opened(findings: list[Finding]) -> list[tuple[str, str, str | None]]:
    return [(f.check, f.entity.target.name, f.entity.device) for f in findings if not f.healthy]


def test_healthy_ports_say_nothing() -> None:
    node_out, elem_out, acts = run_nodes(20, healthy)
    assert node_out == [] and elem_out == [] and acts == []


def test_one_cable_down_is_a_link_repair_and_no_node_action() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        return down({"node_infiniband_link_downed_total": 3.0}) if (
            node == "n0" and p == 2 and step >= 5) else {}  # fmt: skip

    node_out, elem_out, acts = run_nodes(12, port)
    assert opened(node_out) == [("fabric.port.down", "n0", "mlx5_2:1")]
    assert all(f.recommended_action == "watch" for f in node_out)
    assert opened(elem_out) == [("fabric.link.down", "n0:mlx5_2:1", None)]
    (action,) = acts
    assert (action.kind, action.target.kind, action.target.name) == (
        "repair_link", "link", "n0:mlx5_2:1")  # fmt: skip
    # not before the grouping window has passed: a switch pattern could still have formed
    assert action.ts - (T0 + 5 * STEP) >= SETTINGS.fabric_group_window_s * 1000


def test_ports_behind_one_leaf_failing_together_name_the_switch() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        return down({}) if node in ("n0", "n1") and step >= 4 else {}

    node_out, elem_out, acts = run_nodes(12, port)
    assert {(c, n) for c, n, _ in opened(node_out)} == {
        ("fabric.port.down", "n0"), ("fabric.port.down", "n1")}  # fmt: skip
    assert opened(elem_out) == [("fabric.switch.down", "leaf-a", None)]
    (action,) = acts
    assert (action.kind, action.target.kind, action.target.name) == (
        "repair_switch", "switch", "leaf-a")  # fmt: skip
    assert action.ts == T0 + 4 * STEP  # as soon as the second node's ports are seen


def test_one_rail_failing_across_leaves_names_the_rail() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        return down({}) if node in ("n0", "n2") and p == 1 and step >= 3 else {}

    _, elem_out, acts = run_nodes(10, port)
    assert opened(elem_out) == [("fabric.switch.down", "rails-1.mlx5_1", None)]
    assert [a.kind for a in acts] == ["repair_switch"]


def test_switch_recovery_clears_the_element() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        return down({}) if node in ("n0", "n1") and 4 <= step < 8 else {}

    _, elem_out, _ = run_nodes(12, port)
    assert [(f.check, f.healthy) for f in elem_out] == [
        ("fabric.switch.down", False), ("fabric.switch.down", True)]  # fmt: skip


def flapping_then(node: str, p: int, step: int, flaps: tuple[int, ...]) -> dict[str, float]:
    """A port whose link went down and up between the scrapes before each of `flaps`."""
    count = 2.0 + sum(1.0 for s in flaps if s <= step)
    return {"node_infiniband_link_downed_total": count,
            "node_network_carrier_changes_total": 4.0 + 2 * (count - 2.0)}  # fmt: skip


def element_changes(findings: list[Finding]) -> list[tuple[str, bool, str]]:
    return [(f.check, f.healthy, f.entity.target.name) for f in findings]


def test_a_dead_cable_beside_a_flapping_one_is_named_once_the_flapping_stops() -> None:
    # two independent faults behind leaf-a: n0's port 1 flaps twice, n1's port 1 goes dark at
    # the same time; together they look like the switch, until n0 is quiet again
    def port(node: str, p: int, step: int) -> dict[str, float]:
        if node == "n0" and p == 1:
            return flapping_then(node, p, step, (3, 4))
        return down({}) if node == "n1" and p == 1 and step >= 4 else {}

    _, elem_out, acts = run_nodes(30, port)
    assert element_changes(elem_out) == [
        ("fabric.switch.down", False, "leaf-a"),
        ("fabric.switch.down", True, "leaf-a"),
        ("fabric.link.down", False, "n1:mlx5_1:1"),
    ]
    assert "n1" in elem_out[1].message
    assert [(a.kind, a.target.name) for a in acts] == [
        ("repair_switch", "leaf-a"), ("repair_link", "n1:mlx5_1:1")]  # fmt: skip
    # not before n0's flap episode ended and a grouping window went by with n1 alone
    flap_quiet = T0 + (4 * STEP) + SETTINGS.fabric_flap_window_s * 1000
    assert acts[1].ts >= flap_quiet + SETTINGS.fabric_group_window_s * 1000


def test_a_switch_whose_ports_come_back_a_scrape_apart_names_no_link() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        last = {"n0": 8, "n1": 9}.get(node, -1)  # n1's ports come back one scrape later
        return down({}) if 4 <= step <= last else {}

    _, elem_out, acts = run_nodes(20, port)
    assert element_changes(elem_out) == [
        ("fabric.switch.down", False, "leaf-a"), ("fabric.switch.down", True, "leaf-a")]
    assert [a.kind for a in acts] == ["repair_switch"]


def test_a_cable_that_flapped_and_then_went_dark_is_news_twice() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        if node != "n0" or p != 2:
            return {}
        return down({}) if step >= 7 else flapping_then(node, p, step, (3, 4))

    _, elem_out, acts = run_nodes(14, port)
    assert element_changes(elem_out) == [
        ("fabric.link.flapping", False, "n0:mlx5_2:1"), ("fabric.link.down", False, "n0:mlx5_2:1")]
    assert [a.kind for a in acts] == ["repair_link", "repair_link"]
    assert len({a.action_id for a in acts}) == 2


def test_vanished_nic_cordons_its_node() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float] | None:
        return None if node == "n2" and p == 3 and step >= 5 else {}

    node_out, elem_out, acts = run_nodes(10, port)
    (finding,) = [f for f in node_out if not f.healthy]
    assert (finding.check, finding.entity.kind, finding.entity.device) == (
        "fabric.nic.missing", "nic", "mlx5_3")  # fmt: skip
    assert finding.recommended_action == "cordon" and finding.fatal
    assert elem_out == [] and acts == []


def test_flapping_is_flagged_first_and_repaired_when_it_persists() -> None:
    flaps = {3: 1.0, 4: 2.0, 9: 3.0}  # link_downed steps at these scrapes (down and up between)

    def port(node: str, p: int, step: int) -> dict[str, float]:
        if node != "n1" or p != 0:
            return {}
        count = 2.0 + sum(v and 1.0 for s, v in flaps.items() if s <= step)
        return {"node_infiniband_link_downed_total": count,
                "node_network_carrier_changes_total": 4.0 + 2 * (count - 2.0)}  # fmt: skip

    node_out, _, acts = run_nodes(8, port)
    first = [f for f in node_out if not f.healthy]
    assert [(f.check, f.ts) for f in first] == [
        ("fabric.port.flap", T0 + 3 * STEP), ("fabric.port.flap.persistent", T0 + 4 * STEP)]
    assert [(a.kind, a.target.name) for a in acts] == [("repair_link", "n1:mlx5_0:1")]
    assert acts[0].reason.checks == ["fabric.link.flapping", "fabric.port.flap.persistent"]


def test_a_single_flap_is_only_watched() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        bumped = node == "n1" and p == 0 and step >= 3
        return {"node_infiniband_link_downed_total": 3.0} if bumped else {}

    node_out, _, acts = run_nodes(30, port)
    assert [(f.check, f.healthy) for f in node_out] == [
        ("fabric.port.flap", False), ("fabric.port.flap", True)]  # fmt: skip
    assert acts == []


def test_errors_with_the_link_up_are_gray_loss_on_the_link() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        rising = node == "n2" and p == 2 and step >= 2
        return {"node_infiniband_symbol_error_total": 7.0 + 60.0 * (step - 1)} if rising else {}

    node_out, elem_out, acts = run_nodes(12, port)
    assert opened(node_out) == [("fabric.port.errors", "n2", "mlx5_2:1")]
    assert opened(elem_out) == [("fabric.link.errors", "n2:mlx5_2:1", None)]
    assert [a.kind for a in acts] == ["repair_link"]


def test_a_counter_reset_is_not_a_burst_of_errors() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        return {"node_infiniband_symbol_error_total": 0.0,
                "node_infiniband_link_downed_total": 0.0} if step >= 5 else {}  # fmt: skip

    node_out, _, acts = run_nodes(10, port)
    assert node_out == [] and acts == []


OUTAGE = st.tuples(
    st.sampled_from(["n0", "n1", "n2"]), st.integers(0, PORTS - 1), st.integers(0, 9),
    st.integers(1, 6),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(OUTAGE, max_size=6))
def test_no_node_is_ever_told_to_act_for_a_port_and_every_element_names_its_kind(
    outages: list[tuple[str, int, int, int]],
) -> None:
    """Whatever ports go down when, node findings only watch, and every action is a network
    element's repair whose target kind matches it; every element that opens, clears once the
    ports are back."""

    def port(node: str, p: int, step: int) -> dict[str, float]:
        hit = any(n == node and q == p and s <= step < s + d for n, q, s, d in outages)
        return down({}) if hit else {}

    node_out, elem_out, acts = run_nodes(20, port)
    assert {f.recommended_action for f in node_out} <= {"watch", "none"}
    for action in acts:
        assert (action.kind, action.target.kind) in (
            ("repair_link", "link"), ("repair_switch", "switch"))  # fmt: skip
    assert len({f.finding_id for f in elem_out if not f.healthy}) == len(acts)
    assert sum(not f.healthy for f in elem_out) == sum(f.healthy for f in elem_out)


def test_embedded_runtime_places_nodes_by_inventory_and_publishes_the_repair() -> None:
    from pipeline.model import Inventory

    base = load_settings(environ={})
    outputs: dict[str, list[object]] = {}
    runtime = EmbeddedRuntime(base, lambda suffix, e: outputs.setdefault(suffix, []).append(e))
    for node, place in PLACES.items():
        runtime.feed(Inventory(ts=T0, cluster="c1", kind="node", name=node, pool="p1",
                               zone="z1", accelerator="H100", capacity=8,
                               leaf_switch=place.leaf, rail=place.rail))  # fmt: skip
    for step in range(8):
        for node in PLACES:
            runtime.feed(sample(node, step, lambda n, p, s: down({}) if (
                n in ("n0", "n1") and s >= 3) else {}))  # fmt: skip
    actions = [a for a in outputs.get("actions", []) if isinstance(a, Action)]
    assert [(a.kind, a.target.kind, a.target.name) for a in actions] == [
        ("repair_switch", "switch", "leaf-a")]  # fmt: skip
    states = outputs.get("node-state", [])
    assert all(getattr(s, "state", "healthy") not in ("cordoned", "draining") for s in states)
    assert msgspec.json.encode(actions[0])  # a valid action/3 value
    # the verdicts go through the health stage's topics, which leaves them to the network team
    assert not [p for p in outputs.get("proposals", []) if getattr(p, "target", None)
                and p.target.kind in ("switch", "link")]  # type: ignore[attr-defined]  # fmt: skip


def test_the_fleet_stage_is_keyed_by_cluster_and_refuses_other_keys() -> None:
    import pytest

    from pipeline.errors import DecodeError
    from pipeline.stages import topology
    from pipeline.wire import internal

    stage = topology.READER[internal.FLEET_INPUT]
    assert stage.name == "fleet" and "telemetry.fabric" in internal.TELEMETRY_TOPICS
    event = sample("n0", 0, lambda n, p, s: {})
    assert stage.key(event, "c1") == "c1"
    with pytest.raises(DecodeError, match="cluster"):
        stage.key(event, "c1/n0")  # a node key would split the cluster's state


def test_a_switch_that_gets_a_node_back_before_the_window_ends_waits_a_whole_window_again() -> None:
    # n0 and n1 behind leaf-a go dark; n0 comes back, and one of its ports goes dark again a
    # scrape later (the switch has its quorum back) before it too recovers for good
    def port(node: str, p: int, step: int) -> dict[str, float]:
        dark = {"n0": 4 <= step <= 8 or (p == 0 and 10 <= step <= 12), "n1": step >= 4}
        return down({}) if dark.get(node, False) else {}

    _, elem_out, acts = run_nodes(30, port)
    changes = element_changes(elem_out)
    assert changes[:2] == [
        ("fabric.switch.down", False, "leaf-a"), ("fabric.switch.down", True, "leaf-a")]
    assert changes[2:] == [("fabric.link.down", False, "n1:mlx5_0:1"),
                           ("fabric.link.down", False, "n1:mlx5_1:1"),
                           ("fabric.link.down", False, "n1:mlx5_2:1"),
                           ("fabric.link.down", False, "n1:mlx5_3:1")]
    # a whole window after n0's last recovery, not counted from its first one
    switch_cleared = elem_out[1].ts
    assert switch_cleared - (T0 + 13 * STEP) >= SETTINGS.fabric_group_window_s * 1000
    assert [a.kind for a in acts] == ["repair_switch"] + ["repair_link"] * 4


def test_receive_errors_are_read_under_node_exporters_name() -> None:
    def port(node: str, p: int, step: int) -> dict[str, float]:
        rising = node == "n2" and p == 2 and step >= 2
        return {"node_infiniband_port_errors_received_total": 60.0 * step} if rising else {}

    node_out, _, _ = run_nodes(12, port)
    assert opened(node_out) == [("fabric.port.errors", "n2", "mlx5_2:1")]


def saturating(step: int) -> FabricSample:
    """n0's port 0: link_downed jumps to its 8-bit maximum and symbol errors to their 16-bit
    one at step 3 and stay there, as a saturated IB counter does; the exporter says so."""
    out = sample("n0", step, healthy)
    if step < 3:
        return out
    first = out.ports[0]
    metrics = first.metrics | {"node_infiniband_link_downed_total": 255.0,
                               "node_infiniband_symbol_error_total": 65535.0}  # fmt: skip
    saturated = ["node_infiniband_link_downed_total", "node_infiniband_symbol_error_total"]
    ports = [msgspec.structs.replace(first, metrics=metrics, saturated=saturated), *out.ports[1:]]
    return msgspec.structs.replace(out, ports=ports)


def test_a_saturated_counter_is_neither_a_burst_nor_a_flap() -> None:
    state: FabricNodeState | None = None
    found: list[Finding] = []
    for step in range(12):
        state, out = detect_fabric(state, saturating(step), SETTINGS)
        found += out
    assert opened(found) == []


def test_the_same_jump_unmarked_is_read_as_flaps() -> None:
    """The control: without the exporter's mark the jump reads as the link toggling."""
    state: FabricNodeState | None = None
    found: list[Finding] = []
    for step in range(12):
        s = saturating(step)
        ports = [msgspec.structs.replace(p, saturated=[]) for p in s.ports]
        state, out = detect_fabric(state, msgspec.structs.replace(s, ports=ports), SETTINGS)
        found += out
    assert opened(found) != []
