"""Remediation policy: every control on its own, driven with proposals, node states and
capacity events as the health machine and the capacity source would send them."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import pytest

from pipeline.config import PolicySettings
from pipeline.decide import alerts
from pipeline.decide.policy import PolicyState, budget, decide
from pipeline.ids import stable_id
from pipeline.model import Action, Alert, CapacityEvent, NodeState, Proposal
from tests.remediation_fixture import capacity, node_state, proposal, target

BASE = PolicySettings(
    max_unavailable_pct=10.0,
    max_unavailable=10,
    burst_cordons=100,  # slow start and rate limits off unless a test turns them on
    max_actions_per_hour=1000,
)
Signal = Proposal | NodeState | CapacityEvent


def run(
    state: PolicyState | None, signals: Iterable[Signal], settings: PolicySettings = BASE
) -> tuple[PolicyState, list[Action], list[Alert]]:
    actions: list[Action] = []
    raised: list[Alert] = []
    for signal in signals:
        state, new_actions, new_alerts = decide(state, signal, settings)
        actions += new_actions
        raised += new_alerts
    assert state is not None
    return state, actions, raised


def pool(size: int, settings: PolicySettings = BASE, at: float = 0) -> PolicyState:
    state, _, _ = run(None, [node_state(target(f"n{i}"), at) for i in range(size)], settings)
    return state


def reflect(action: Action, at: float, state: str = "cordoned") -> NodeState:
    """The node state the health machine publishes once it has seen our action."""
    by_us = action.kind != "uncordon"
    return node_state(
        action.target,
        at,
        state if by_us else "healthy",
        episode=f"ep-{action.target.name}-episode" if by_us else None,
        by_us=by_us,
        last_action=f"{action.kind}:{action.action_id}",
    )


def targets(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.target.name) for a in actions]


@pytest.mark.parametrize(
    ("size", "pct", "cap", "floor", "limit"),
    [
        (20, 10.0, 10, 1, 2),  # 10 % of 20
        (200, 10.0, 10, 1, 10),  # the absolute cap wins
        (5, 10.0, 10, 1, 1),  # 10 % of 5 rounds down to 0; the floor keeps one
        (5, 10.0, 10, 0, 0),  # strict: a pool this small is never touched
        (30, 10.0, 2, 1, 2),
    ],
)
def test_budget_is_the_smaller_of_percent_and_cap(
    size: int, pct: float, cap: int, floor: int, limit: int
) -> None:
    settings = msgspec.structs.replace(
        BASE, max_unavailable_pct=pct, max_unavailable=cap, budget_floor=floor
    )
    assert budget(pool(size, settings), settings).limit == limit


def test_cordons_stop_at_the_budget_with_one_alert_that_resolves_when_it_frees() -> None:
    state = pool(20)  # budget 2
    state, actions, raised = run(state, [proposal(target(f"n{i}"), 10 + i) for i in range(4)])
    assert targets(actions) == [("cordon", "n0"), ("cordon", "n1")]
    budget_alerts = [a for a in raised if a.labels["alertname"] == "FleetPulseBudgetExhausted"]
    assert {a.fingerprint for a in budget_alerts} == {budget_alerts[0].fingerprint}
    assert [a.status for a in budget_alerts] == ["firing", "firing"]  # fired, then updated
    last = budget_alerts[-1]
    assert "2 of 20" in last.annotations["description"]
    assert "cordon n2" in last.annotations["description"]
    assert "cordon n3" in last.annotations["description"]
    # n0 comes back: the oldest withheld proposal goes out; n1 too: the alert resolves
    state, actions, raised = run(state, [reflect(actions[0], 30), reflect(actions[1], 31)])
    released = [node_state(target("n0"), 40), node_state(target("n1"), 41)]
    state, actions, raised = run(state, released)
    assert targets(actions) == [("cordon", "n2"), ("cordon", "n3")]
    assert [a.status for a in raised if a.labels["alertname"] == "FleetPulseBudgetExhausted"] == [
        "firing",
        "resolved",
    ]
    assert not state.withheld


def test_a_burst_of_withheld_proposals_is_one_alert_updated_log_many_times() -> None:
    state = pool(100)  # budget 10
    burst = [proposal(target(f"n{i}"), 10 + i / 100) for i in range(50)]
    state, actions, raised = run(state, burst)
    assert len(actions) == 10
    updates = [a for a in raised if a.labels["alertname"] == "FleetPulseBudgetExhausted"]
    assert {a.fingerprint for a in updates} == {updates[0].fingerprint}
    assert 1 < len(updates) <= 7  # 1, 2, 4, 8, 16, 32 withheld: not one message per proposal
    resent = [msgspec.structs.replace(p, ts=p.ts + 301_000) for p in burst[10:]]
    state, _, raised = run(state, resent)  # the health machine re-sends; 5 min have passed
    assert [a.annotations["withheld_count"] for a in raised] == ["40"]


def test_people_cordons_count_against_the_budget() -> None:
    state = pool(20)
    held = [node_state(target(f"n{i}"), 1, "cordoned", human=True) for i in (5, 6)]
    state, actions, _ = run(state, [*held, proposal(target("n0"), 2)])
    assert actions == [] and state.withheld["c1/node/n0"].reason == "budget"


def test_fatal_faults_go_past_the_budget_up_to_the_ceiling() -> None:
    state = pool(10)  # budget 1, fatal ceiling 50 % = 5
    signals = [proposal(target(f"n{i}"), i, fatal=True) for i in range(6)]
    state, actions, raised = run(state, signals)
    assert len(actions) == 5 and all(a.kind == "cordon" for a in actions)
    assert state.withheld["c1/node/n5"].reason == "fatal_ceiling"
    assert any(a.labels["alertname"] == "FleetPulseBudgetExhausted" for a in raised)
    state, actions, _ = run(state, [proposal(target("n9"), 10)])
    assert actions == [] and state.withheld["c1/node/n9"].reason == "budget"


def test_slow_start_after_a_burst() -> None:
    settings = msgspec.structs.replace(
        BASE,
        burst_cordons=3,
        burst_window_s=600,
        slow_start_interval_s=300,
        calm_s=1800,
        max_unavailable=100,
        max_unavailable_pct=100.0,
    )
    state = pool(20, settings)
    signals = [proposal(target(f"n{i}"), i) for i in range(5)]
    state, actions, raised = run(state, signals, settings)
    assert targets(actions) == [("cordon", "n0"), ("cordon", "n1"), ("cordon", "n2")]
    assert state.withheld["c1/node/n3"].reason == "slow_start"
    assert raised[-1].labels["alertname"] == "FleetPulseRemediationThrottled"
    state, actions, _ = run(state, [node_state(target("n19"), 301)], settings)  # time passes
    assert actions == []  # 299 s after the burst's last cordon
    state, actions, _ = run(state, [node_state(target("n19"), 302)], settings)
    assert targets(actions) == [("cordon", "n3")]  # one per interval
    state, actions, _ = run(state, [node_state(target("n19"), 500)], settings)
    assert actions == []
    state, actions, raised = run(state, [node_state(target("n19"), 602)], settings)
    assert targets(actions) == [("cordon", "n4")]
    assert raised[-1].status == "resolved"
    # calm: calm_s after the last slow-start cordon, bursts are allowed again
    fresh = [proposal(target(f"n{i}"), 602 + 1800 + i) for i in (10, 11)]
    state, actions, _ = run(state, fresh, settings)
    assert targets(actions) == [("cordon", "n10"), ("cordon", "n11")]


def test_rate_limit_per_pool_and_hour_spares_fatal_faults() -> None:
    settings = msgspec.structs.replace(
        BASE, max_actions_per_hour=2, max_unavailable=100, max_unavailable_pct=100.0
    )
    state = pool(10, settings)
    signals = [proposal(target(f"n{i}"), i) for i in range(3)]
    state, actions, _ = run(state, [*signals, proposal(target("n5"), 4, fatal=True)], settings)
    assert targets(actions) == [("cordon", "n0"), ("cordon", "n1"), ("cordon", "n5")]
    assert state.withheld["c1/node/n2"].reason == "rate_limit"
    refreshed = proposal(target("n2"), 3601)  # the health machine re-sends it
    state, actions, _ = run(state, [refreshed], settings)
    assert targets(actions) == [("cordon", "n2")]


def test_the_same_proposal_twice_is_one_action_with_a_derived_id() -> None:
    state = pool(10)
    p = proposal(target("n1"), 5)
    state, actions, _ = run(state, [p, p, msgspec.structs.replace(p, ts=p.ts + 60_000)])
    assert len(actions) == 1 and actions[0].action_id == stable_id("act", p.proposal_id)
    assert actions[0].proposal_id == p.proposal_id and actions[0].expires_at is not None


def test_one_open_action_per_target_until_the_health_machine_reports_it() -> None:
    state = pool(10)
    t = target("n1")
    state, actions, _ = run(state, [proposal(t, 1)])
    drain = proposal(t, 2, "drain")
    state, more, _ = run(state, [drain])
    assert more == [] and state.withheld["c1/node/n1"].reason == "busy"
    state, more, _ = run(state, [reflect(actions[0], 3)])
    # proposed before the health machine saw the cordon (it came back late): dropped; the
    # health machine proposes again, after the state that reports the cordon, what it wants
    assert more == [] and not state.withheld
    state, more, _ = run(state, [drain])
    assert targets(more) == [("drain", "n1")]


def test_an_unreported_action_stops_blocking_when_it_expires() -> None:
    settings = msgspec.structs.replace(BASE, report_ttl_s=60)
    state = pool(10, settings)
    t = target("n1")
    state, _actions, _ = run(
        state, [proposal(t, 1), node_state(t, 2, "cordoned", by_us=True)], settings
    )
    state, more, _ = run(state, [proposal(t, 30, "drain")], settings)
    assert more == []
    state, more, _ = run(state, [node_state(target("n2"), 62)], settings)
    assert targets(more) == [("drain", "n1")]


def test_repairs_wait_for_our_cordon() -> None:
    state = pool(10)
    t = target("n1")
    state, actions, _ = run(state, [proposal(t, 1, "reboot")])
    assert actions == [] and state.withheld["c1/node/n1"].reason == "awaiting_cordon"
    state, actions, _ = run(
        state, [node_state(t, 2, "draining", by_us=True, episode="ep-n1-episode")]
    )
    assert targets(actions) == [("reboot", "n1")]


@pytest.mark.parametrize(("by_us", "human"), [(False, False), (False, True), (True, True)])
def test_never_release_what_is_not_ours_alone(by_us: bool, human: bool) -> None:
    t = target("n1")
    state = pool(10)
    state, _, _ = run(
        state, [node_state(t, 1, "cordoned", by_us=by_us, human=human, episode="ep-n1-episode")]
    )
    state, actions, _ = run(state, [proposal(t, 2, "uncordon")])
    assert actions == [] and not state.withheld


def test_releases_pass_the_budget_capacity_and_throttles() -> None:
    settings = msgspec.structs.replace(BASE, max_unavailable=1, max_actions_per_hour=1)
    t = target("n1")
    state = pool(10, settings)
    state, _, _ = run(
        state,
        [
            node_state(target("n2"), 1, "cordoned", human=True),
            node_state(t, 1, "probation", by_us=True, episode="ep-n1-episode"),
            capacity(2, "STOCKOUT"),
            proposal(target("n3"), 3),
        ],
        settings,
    )
    state, actions, _ = run(state, [proposal(t, 4, "uncordon")], settings)
    assert targets(actions) == [("uncordon", "n1")]


def test_global_dry_run_publishes_dry_actions_that_still_count() -> None:
    dry = msgspec.structs.replace(BASE, dry_run=True)
    state = pool(10, dry)  # budget 1
    first = proposal(target("n1"), 1)
    state, actions, raised = run(state, [first, proposal(target("n2"), 2)], dry)
    assert [(a.kind, a.target.name, a.dry_run) for a in actions] == [("cordon", "n1", True)]
    assert actions[0].action_id == stable_id("act", first.proposal_id, "dry-run")
    assert not any(a.labels["alertname"] == alerts.CORDONED for a in raised)
    assert state.withheld["c1/node/n2"].reason == "budget"  # n1 counts as if it were out
    state, again, _ = run(state, [first], dry)
    assert again == []  # the hourly re-send while dry run is on: no second dry action
    state, real, _ = run(state, [first], BASE)  # dry run switched off: now for real
    assert [(a.action_id, a.dry_run) for a in real] == [
        (stable_id("act", first.proposal_id), False)
    ]


@pytest.mark.parametrize(
    ("kind", "checks", "dry"),
    [
        ("cordon", ("new_check",), True),
        ("cordon", ("new_check", "ecc_dbe"), False),  # a trusted check justifies it alone
        ("reboot", ("new_check",), True),
        ("uncordon", ("new_check",), False),  # releasing our own cordon is never a dry run
    ],
)
def test_dry_run_per_check(kind: str, checks: tuple[str, ...], dry: bool) -> None:
    settings = msgspec.structs.replace(BASE, dry_run_checks=("new_check",))
    t = target("n1")
    state = pool(10, settings)
    if kind != "cordon":
        state, _, _ = run(
            state, [node_state(t, 1, "cordoned", by_us=True, episode="ep-n1-episode")], settings
        )
    state, actions, _ = run(state, [proposal(t, 2, kind, checks=checks)], settings)
    assert [a.dry_run for a in actions] == [dry]


def test_scheduled_maintenance_cordons_drains_and_releases_outside_the_budget() -> None:
    settings = msgspec.structs.replace(BASE, maintenance_lead_s=1800)
    state = pool(10, settings)  # budget 1
    t = target("n3")
    notice = capacity(0, "MAINTENANCE_SCHEDULED", t=t, window=(10_000, 20_000))
    state, actions, _ = run(state, [notice, node_state(target("n9"), 8199)], settings)
    assert actions == []
    state, actions, raised = run(state, [node_state(target("n9"), 8200)], settings)
    assert targets(actions) == [("cordon", "n3")]
    assert actions[0].reason.checks == ["maintenance"]
    assert raised[0].labels["alertname"] == alerts.MAINTENANCE
    state, actions, _ = run(state, [reflect(actions[0], 8201)], settings)
    assert targets(actions) == [("drain", "n3")]
    assert budget(state, settings).failure == frozenset()  # not a fault: budget untouched
    state, failure, _ = run(state, [proposal(target("n5"), 8300)], settings)
    assert targets(failure) == [("cordon", "n5")]
    state, _, _ = run(state, [reflect(actions[0], 8202, "draining")], settings)
    done = capacity(15_000, "MAINTENANCE_DONE", t=t)
    state, actions, _ = run(state, [done], settings)
    assert actions == []  # the pool's time (the health machine's) is not there yet
    state, actions, raised = run(state, [node_state(target("n9"), 15_000)], settings)
    assert targets(actions) == [("uncordon", "n3")]
    assert [a.status for a in raised if a.labels["alertname"] == alerts.MAINTENANCE] == ["resolved"]
    state, again, _ = run(state, [notice, node_state(target("n9"), 16_000)], settings)
    assert again == []  # the same notice delivered twice is one maintenance


def test_a_fault_proposal_for_a_target_out_for_maintenance_is_dropped() -> None:
    settings = msgspec.structs.replace(BASE, maintenance_lead_s=60)
    t = target("n3")
    state = pool(10, settings)
    state, actions, _ = run(
        state, [capacity(0, "MAINTENANCE_STARTED", t=t, window=(0, 600))], settings
    )
    state, _, _ = run(state, [reflect(actions[0], 1)], settings)
    state, more, _ = run(state, [proposal(t, 2, episode="ep-n3-episode")], settings)
    assert [a.kind for a in more] == [] and not state.withheld


def test_a_replayed_proposal_from_an_ended_episode_is_dropped() -> None:
    state = pool(10)
    t = target("n1")
    old = proposal(t, 1, episode="ep-n1-old-one")
    state, actions, _ = run(state, [node_state(t, 5, "healthy"), old])
    assert actions == [] and not state.withheld


def test_maintenance_leaves_targets_already_out_alone() -> None:
    t = target("n3")
    state = pool(10)
    state, actions, _ = run(
        state,
        [
            node_state(t, 0, "cordoned", human=True),
            capacity(1, "MAINTENANCE_STARTED", t=t, window=(1, 100)),
            capacity(50, "MAINTENANCE_DONE", t=t),
        ],
    )
    assert actions == []


def test_a_stockout_defers_non_fatal_removals_and_says_so() -> None:
    state = pool(40)  # budget 4: only capacity stands in the way here
    out = target("n1")
    state, _, _ = run(state, [node_state(out, 0, "draining", by_us=True, episode="ep-n1-episode")])
    state, actions, raised = run(
        state,
        [
            capacity(1, "STOCKOUT"),
            proposal(target("n2"), 2),  # would remove capacity
            proposal(out, 3, "replace", episode="ep-n1-episode"),  # needs new capacity
        ],
    )
    assert actions == []
    assert raised[-1].labels["alertname"] == "FleetPulseCapacityDeferral"
    assert "STOCKOUT in z1" in raised[-1].annotations["description"]
    state, actions, _ = run(state, [proposal(target("n4"), 4, fatal=True)])
    assert targets(actions) == [("cordon", "n4")]
    resent = [proposal(target("n2"), 3601), proposal(out, 3601, "replace", episode="ep-n1-episode")]
    state, actions, raised = run(state, resent)  # the health machine re-sends what is pending
    assert sorted(targets(actions)) == [("cordon", "n2"), ("replace", "n1")]
    assert raised[-1].status == "resolved"


def test_reboots_are_not_deferred_for_capacity() -> None:
    state = pool(10)
    t = target("n1")
    state, actions, _ = run(
        state,
        [
            node_state(t, 0, "draining", by_us=True, episode="ep-n1-episode"),
            capacity(1, "QUOTA_EXCEEDED"),
            proposal(t, 2, "reboot"),
        ],
    )
    assert targets(actions) == [("reboot", "n1")]


@pytest.mark.parametrize(
    ("event", "deferred"),
    [
        (capacity(1, "QUOTA_USAGE", usage=96.0), True),
        (capacity(1, "QUOTA_USAGE", usage=50.0), False),
        (capacity(1, "STOCKOUT", zone="z2"), False),  # another zone
        (capacity(1, "STOCKOUT", pool="p9"), False),  # another pool
    ],
)
def test_which_capacity_events_count(event: CapacityEvent, deferred: bool) -> None:
    _state, actions, _ = run(pool(10), [event, proposal(target("n1"), 2)])
    assert (actions == []) is deferred


def test_a_reading_of_one_quota_does_not_clear_another_quotas_hold() -> None:
    # a zone has many quotas (GPUs, TPUs, CPUs) read at the same instant: the TPU quota's
    # healthy reading must not lift the hold the exhausted GPU quota put on the pool
    exhausted = capacity(1, "QUOTA_EXCEEDED", usage=101.0, metric="GPUS")
    other = capacity(1, "QUOTA_USAGE", usage=10.0, metric="TPUS", event_id="cap-event-2")
    state, actions, _ = run(pool(10), [exhausted, other, proposal(target("n1"), 2)])
    assert actions == [] and state.quota_until > 0
    recovered = capacity(3, "QUOTA_USAGE", usage=10.0, metric="GPUS", event_id="cap-event-3")
    state, _, _ = run(state, [recovered])
    assert state.quota_until == 0 and state.quota_holds == {}


def test_a_withheld_proposal_is_dropped_when_its_episode_ends() -> None:
    state = pool(10)  # budget 1
    first, second = proposal(target("n1"), 1), proposal(target("n2"), 2)
    state, actions, _ = run(state, [first, second])
    assert "c1/node/n2" in state.withheld
    state, _, raised = run(state, [node_state(target("n2"), 3)])  # n2 recovered meanwhile
    assert not state.withheld and raised[-1].status == "resolved"
    state, actions, _ = run(state, [reflect(actions[0], 4), node_state(target("n1"), 5)])
    assert actions == []  # the budget freed, and nothing stale went out


def test_a_withheld_proposal_not_re_sent_expires() -> None:
    settings = msgspec.structs.replace(BASE, pending_ttl_s=600)
    state = pool(10, settings)
    state, _, _ = run(state, [proposal(target("n1"), 1), proposal(target("n2"), 2)], settings)
    state, _, _ = run(state, [node_state(target("n9"), 603)], settings)
    assert not state.withheld


def test_a_cordon_alert_fires_and_resolves_when_a_person_uncordons() -> None:
    state = pool(10)
    t = target("n1")
    state, actions, raised = run(state, [proposal(t, 1, fatal=True)])
    assert [(a.labels["alertname"], a.labels["severity"], a.status) for a in raised] == [
        (alerts.CORDONED, "critical", "firing")
    ]
    state, _, more = run(state, [node_state(t, 1.5), reflect(actions[0], 2)])
    assert more == []  # a record from before the cordon resolves nothing
    state, _, more = run(state, [node_state(t, 3, "probation")])
    assert [(a.fingerprint, a.status) for a in more] == [(raised[0].fingerprint, "resolved")]


def test_decide_is_deterministic_from_a_snapshot() -> None:
    # decide changes the state it is given (pipeline/stages/topology.py): the driver keeps
    # the snapshot, and the same snapshot and signals give the same decisions
    snapshot = msgspec.msgpack.encode(pool(10))
    signals: list[Signal] = [proposal(target(f"n{i}"), i) for i in range(3)]

    def restored() -> PolicyState:
        return msgspec.msgpack.decode(snapshot, type=PolicyState)

    assert run(restored(), signals) == run(restored(), signals)


def test_a_signal_for_another_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="p2"):
        decide(pool(2), proposal(target("x", pool="p2"), 1), BASE)


def test_a_gpu_reset_action_carries_the_device_of_its_proposal() -> None:
    state = pool(10)
    t = target("n1")
    state, _, _ = run(state, [node_state(t, 1, "draining", by_us=True, episode="ep-n1-episode")])
    reset = msgspec.structs.replace(proposal(t, 2, "reset_gpu"), device="0,3")
    state, actions, _ = run(state, [reset])
    assert [(a.kind, a.device) for a in actions] == [("reset_gpu", "0,3")]


def _alert_ids(raised: list[Alert]) -> list[str]:
    return [f"{a.fingerprint}/{a.status}" for a in raised]


def test_capacity_readings_ahead_of_the_health_machine_decide_as_in_event_time() -> None:
    # Working off a backlog, the zone stage fans capacity readings out long before the health
    # machine's proposals and node states of the same hour reach the policy, and our cordon
    # reaches the health machine only after it published a node state or two. Read in that
    # order, the pool must decide as it does in event-time order: the cordon stays open (not
    # expired by the readings' time) and its alert is not resolved by the stale node state.
    t = target("n1")
    readings = [capacity(60 * m, "QUOTA_USAGE", usage=10, event_id=f"cap-{m}") for m in range(60)]
    cordon = proposal(t, 200, fatal=True)

    def decide_in(order: list[Signal]) -> tuple[list[Action], list[Alert]]:
        state = pool(10)
        actions: list[Action] = []
        raised: list[Alert] = []
        for signal in order:
            if signal == "reflect":  # our own cordon, back from the health machine
                signal = reflect(actions[0], 230)
            state, new_actions, new_alerts = decide(state, signal, BASE)
            actions += new_actions
            raised += new_alerts
        return actions, raised

    stale = node_state(t, 210, "degraded", episode=cordon.episode)  # before it saw the cordon
    live = [r for r in readings if r.ts <= cordon.ts] + [cordon, stale, "reflect"] + [
        r for r in readings if r.ts > cordon.ts
    ]
    # the readings of the next hour come in while the cordon is on its way back
    backlog = [*readings[:30], cordon, *readings[30:], stale, "reflect"]
    want_actions, want_alerts = decide_in(live)  # type: ignore[arg-type]
    got_actions, got_alerts = decide_in(backlog)  # type: ignore[arg-type]
    assert targets(want_actions) == [("cordon", "n1")]
    assert [a.action_id for a in got_actions] == [a.action_id for a in want_actions]
    assert _alert_ids(got_alerts) == _alert_ids(want_alerts)
    assert got_actions[0].ts == want_actions[0].ts == cordon.ts  # the pool's (health) time


def test_a_node_state_from_before_our_cordon_came_back_does_not_resolve_its_alert() -> None:
    # A backlog brings our cordon back to the health machine after it has published node
    # states for the next quarter of an hour: the open action expires meanwhile, but the
    # cordon alert stays firing until a node state that has seen the cordon says it is over.
    t = target("n1")
    state, actions, raised = run(pool(10), [proposal(t, 200, fatal=True)])
    assert targets(actions) == [("cordon", "n1")] and _alert_ids(raised)[0].endswith("/firing")
    later = node_state(target("n9"), 200 + BASE.action_ttl_s + 1)  # the pool's time moves on
    stale = node_state(t, 200 + BASE.action_ttl_s + 2, "degraded", episode="ep-n1-episode")
    state, _, raised = run(state, [later, stale])
    assert raised == [] and "cordon:c1/node/n1" in state.alerts
    seen = reflect(actions[0], 200 + BASE.action_ttl_s + 3)
    released = node_state(t, 200 + BASE.action_ttl_s + 4, "healthy",
                          last_action=seen.last_action)  # a person uncordoned it
    state, _, raised = run(state, [seen, released])
    assert [a.status for a in raised] == ["resolved"]
