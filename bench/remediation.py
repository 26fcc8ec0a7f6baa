"""Health machine and policy throughput: signals per second through the pure functions.

    .venv/bin/python -m bench.remediation [--targets 1000] [--repeat 5]

health.heartbeat: a target's once-a-minute clock tick (the bulk of what the health stage sees);
health.episode: a full fault episode (open, persist, cordon, drain, repair, probation, release);
policy.node_state: a NodeState into a pool of N members (the policy changes its state in place);
policy.proposal: a cordon proposal into that pool (its budget counts the pool's targets, so this
grows with the pool).
"""

from __future__ import annotations

import argparse
import functools
import sys

from bench.common import median_seconds, write_result
from pipeline.config import HealthSettings, PolicySettings
from pipeline.decide import health, policy
from pipeline.model import Event
from tests.remediation_fixture import (
    Loop,
    finding,
    heartbeat,
    node_event,
    node_state,
    proposal,
    target,
)


def _heartbeats(n: int) -> None:
    settings = HealthSettings()
    t = target()
    state, _ = health.transition(None, heartbeat(t, 0), settings)
    for i in range(1, n):
        state, _ = health.transition(state, heartbeat(t, i * 60), settings)


def _episode() -> list[Event]:
    t = target()
    loop = Loop()
    loop.feed(finding(t, 0, fatal=True))
    loop.feed(node_event(t, 10, "drained", "act-x-drained"))
    loop.feed(node_event(t, 20, "repaired", "act-x-repaired"))
    loop.feed(finding(t, 30, healthy=True))
    for minute in range(1, 13):
        loop.feed(heartbeat(t, 30 + minute * 60))
    return loop.log


def _pool(size: int) -> policy.PolicyState:
    settings = PolicySettings()
    state = None
    for i in range(size):
        state, _, _ = policy.decide(state, node_state(target(f"n{i}"), 0), settings)
    assert state is not None
    return state


def _node_states(state: policy.PolicyState, n: int) -> None:
    settings = PolicySettings()
    for i in range(n):
        state, _, _ = policy.decide(state, node_state(target(f"n{i % 50}"), 1 + i), settings)


def _proposals(state: policy.PolicyState, n: int) -> None:
    settings = PolicySettings()
    for i in range(n):
        state, _, _ = policy.decide(state, proposal(target(f"n{i % 50}"), 1 + i), settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=1000, help="pool size for the policy")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    figures: dict[str, float] = {}
    n = 5000
    seconds, _ = median_seconds(lambda: _heartbeats(n), args.repeat)
    figures["health_heartbeats_per_s"] = round(n / seconds)
    events = len(_episode())
    seconds, _ = median_seconds(_episode, args.repeat)
    figures["health_episodes_per_s"] = round(1 / seconds, 1)
    figures["episode_records"] = events
    m = 500
    for size in (100, args.targets):
        pool = _pool(size)
        seconds, _ = median_seconds(functools.partial(_node_states, pool, m), args.repeat)
        figures[f"policy_node_states_per_s_pool_{size}"] = round(m / seconds)
        seconds, _ = median_seconds(functools.partial(_proposals, pool, m), args.repeat)
        figures[f"policy_proposals_per_s_pool_{size}"] = round(m / seconds)
    for name, value in figures.items():
        print(f"{name:42} {value}")
    write_result("remediation", figures, {"targets": args.targets, "repeat": args.repeat})
    return 0


if __name__ == "__main__":
    sys.exit(main())
