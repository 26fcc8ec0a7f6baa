"""The latency benchmark's arithmetic: how the fatal XID → action time splits per hop. No
timings here (those are `python -m bench --only latency`)."""

from __future__ import annotations

from bench.latency import Injection, hop_latencies


def injection(
    appended: int, finding: int | None, proposal: int | None, action: int | None
) -> Injection:
    return Injection(
        node="n1",
        sent_at=0.0,
        appended_ms=appended,
        finding_ms=finding,
        proposal_ms=proposal,
        action_ms=action,
    )


def test_each_hop_is_the_gap_between_its_two_broker_stamps() -> None:
    hops = hop_latencies([injection(1_000, 1_010, 1_040, 1_045)])
    assert hops["xid_to_finding_s"]["p50"] == 0.01
    assert hops["finding_to_proposal_s"]["p50"] == 0.03
    assert hops["proposal_to_action_s"]["p50"] == 0.005


def test_a_fault_that_stopped_short_counts_only_in_the_hops_it_crossed() -> None:
    hops = hop_latencies(
        [injection(1_000, 1_010, 1_040, 1_045), injection(2_000, 2_500, None, None)]
    )
    assert hops["xid_to_finding_s"]["count"] == 2
    assert hops["xid_to_finding_s"]["max"] == 0.5
    assert hops["finding_to_proposal_s"]["count"] == 1
    assert hops["proposal_to_action_s"]["count"] == 1
