"""A watcher's not_ready is listed among the node state's open checks until its ready, and
proposes nothing by itself (pipeline/decide/health.py)."""

from __future__ import annotations

from pipeline.config import load_settings
from pipeline.decide import health
from pipeline.decide.health_state import NOT_READY
from pipeline.model import NodeEvent

SETTINGS = load_settings(environ={}).health
T0 = 1_767_225_600_000


def _event(kind: str, ts: int) -> NodeEvent:
    return NodeEvent(ts=ts, cluster="c", target_kind="node", target="n1", pool="p", zone="z",
                     kind=kind, actor="kubernetes")  # type: ignore[arg-type]


def test_not_ready_is_open_until_ready_and_proposes_nothing() -> None:
    state, proposals = health.transition(None, _event("not_ready", T0), SETTINGS)
    node_state = health.to_node_state(state)
    assert node_state.open_checks == [NOT_READY] and node_state.state == "healthy"
    assert proposals == []
    state, proposals = health.transition(state, _event("ready", T0 + 5_000), SETTINGS)
    assert health.to_node_state(state).open_checks == [] and proposals == []
