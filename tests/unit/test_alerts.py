"""Alert builders: Alertmanager's fingerprint, RFC 3339 times, firing → update → resolved."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.decide import alerts
from pipeline.model import Alert, Reason
from pipeline.wire.codec import decode, encode
from tests.remediation_fixture import T0, target


def _fnv1a64(data: bytes) -> str:
    # Straight from the FNV spec, over the whole byte string at once.
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return f"{value:016x}"


def test_fingerprint_of_no_labels_is_the_fnv_offset_basis_like_alertmanager() -> None:
    assert alerts.fingerprint({}) == "cbf29ce484222325"


def test_fingerprint_is_fnv1a_over_sorted_names_and_values_with_0xff_separators() -> None:
    labels = {"zone": "z1", "alertname": "X", "pool": "pool-ä"}
    data = b"".join(
        name.encode() + b"\xff" + labels[name].encode() + b"\xff" for name in sorted(labels)
    )
    assert alerts.fingerprint(labels) == _fnv1a64(data)


@given(st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=5))
def test_fingerprint_ignores_insertion_order(labels: dict[str, str]) -> None:
    reordered = dict(reversed(list(labels.items())))
    assert alerts.fingerprint(reordered) == alerts.fingerprint(labels)
    assert len(alerts.fingerprint(labels)) == 16


def test_fingerprint_separates_names_from_values() -> None:
    assert alerts.fingerprint({"ab": "c"}) != alerts.fingerprint({"a": "bc"})
    assert alerts.fingerprint({"a": "b"}) != alerts.fingerprint({"a": "b", "c": ""})


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert alerts.rfc3339(T0 + 123) == "2023-11-14T22:13:20.123Z"
    assert alerts.rfc3339(T0) == "2023-11-14T22:13:20.000Z"


def test_firing_then_update_then_resolved_keep_identity_and_start() -> None:
    labels = {"alertname": "A", "pool": "p1"}
    first = alerts.firing(labels, {"summary": "one"}, T0)
    later = alerts.update(first, {"summary": "two"}, T0 + 5_000)
    done = alerts.resolve(later, T0 + 9_000)
    assert first.status == later.status == "firing" and first.endsAt is None
    assert first.fingerprint == later.fingerprint == done.fingerprint == alerts.fingerprint(labels)
    assert later.startsAt == done.startsAt == alerts.rfc3339(T0)
    assert later.annotations == {"summary": "two", "runbook_url": first.annotations["runbook_url"]}
    assert later.ts == T0 + 5_000
    assert done.status == "resolved" and done.endsAt == alerts.rfc3339(T0 + 9_000)


def test_alerts_fit_the_schema_even_with_long_text() -> None:
    reason = Reason(checks=["ecc_dbe"], finding_ids=["fnd-12345678"], summary="x" * 10_000)
    alert = alerts.cordon_alert(
        target(), reason, T0, action_id="act-12345678", fatal=True, maintenance=False
    )
    assert decode(encode(alert), Alert) == alert
    assert len(alert.annotations["description"]) <= 4000


def test_cordon_alert_names_the_target_and_maintenance_is_informational() -> None:
    reason = Reason(checks=["ecc_dbe"], finding_ids=[], summary="s")
    fault = alerts.cordon_alert(
        target("n7"), reason, T0, action_id="a" * 8, fatal=False, maintenance=False
    )
    maint = alerts.cordon_alert(
        target("n7"), reason, T0, action_id="a" * 8, fatal=False, maintenance=True
    )
    assert fault.labels["node"] == "n7" and fault.labels["severity"] == "warning"
    assert fault.labels["alertname"] == alerts.CORDONED
    assert maint.labels["alertname"] == alerts.MAINTENANCE and maint.labels["severity"] == "info"
    assert fault.fingerprint != maint.fingerprint


def test_pool_alerts_differ_by_cause_and_pool() -> None:
    prints = {
        alerts.pool_alert(name, pool, "c1", T0, {"summary": "s"}).fingerprint
        for name in alerts.POOL_ALERTS
        for pool in ("p1", "p2")
    }
    assert len(prints) == 6


ROUTING = {"alertname", "severity", "cluster", "pool", "check"}


def _every_kind_of_alert() -> list[Alert]:
    reason = Reason(checks=["gpu.ecc.dbe", "xid.79"], finding_ids=[], summary="s")
    made = [
        alerts.cordon_alert(target("n7"), reason, T0, action_id="a" * 8, fatal=True,
                            maintenance=False),
        alerts.cordon_alert(target("s1", kind="slice"), reason, T0, action_id="a" * 8,
                            fatal=False, maintenance=True),
    ]  # fmt: skip
    made += [
        alerts.pool_alert(name, "p1", "c1", T0, {"summary": "s"}) for name in alerts.POOL_ALERTS
    ]
    return made


def test_alerts_carry_the_labels_alertmanager_users_route_on() -> None:
    node, slice_, *pools = _every_kind_of_alert()
    for alert in (node, slice_, *pools):
        assert set(alert.labels) >= ROUTING, alert.labels
    assert node.labels["node"] == "n7" and "slice" not in node.labels
    assert slice_.labels["slice"] == "s1" and "node" not in slice_.labels
    assert node.labels["zone"] == slice_.labels["zone"] == target().zone
    assert node.labels["check"] == "gpu.ecc.dbe,xid.79"
    assert slice_.labels["check"] == "maintenance"
    assert {a.labels["check"] for a in pools} == {f"policy.{n}" for n in alerts.POOL_ALERTS}


def test_every_alert_links_its_runbook_and_where_it_came_from() -> None:
    node, _slice, budget, *_ = _every_kind_of_alert()
    assert node.annotations["runbook_url"] == f"{alerts.RUNBOOK_BASE}/gpu.ecc.dbe"
    assert budget.annotations["runbook_url"] == f"{alerts.RUNBOOK_BASE}/policy.budget"
    t = target("n7")
    assert node.generatorURL == f"{alerts.GENERATOR_BASE}/{t.cluster}/n7"
    assert budget.generatorURL == f"{alerts.GENERATOR_BASE}/c1/p1"
    custom = alerts.pool_alert(
        "budget", "p1", "c1", T0, {}, runbook_base="https://wiki/rb/", generator_base="https://g"
    )
    assert custom.annotations["runbook_url"] == "https://wiki/rb/policy.budget"
    assert custom.generatorURL == "https://g/c1/p1"
    # an update keeps the link; the resolved copy too
    later = alerts.update(node, {"summary": "two"}, T0 + 1)
    resolved = alerts.resolve(later, T0 + 2)
    assert resolved.annotations["runbook_url"] == node.annotations["runbook_url"]


def test_the_alert_sample_is_what_the_code_emits_for_the_action_sample() -> None:
    from pipeline.model import Action
    from pipeline.schemas_tool import SCHEMA_DIR

    action = decode((SCHEMA_DIR / "samples" / "action.v3.json").read_bytes(), Action)
    sample = decode((SCHEMA_DIR / "samples" / "alert.v1.json").read_bytes(), Alert)
    emitted = alerts.cordon_alert(
        action.target, action.reason, sample.ts, action_id=action.action_id, fatal=True,
        maintenance=False,
    )  # fmt: skip
    assert sample == emitted


def test_the_development_alertmanager_groups_by_labels_that_exist() -> None:
    import re
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "deploy/alertmanager/alertmanager.yml.in"
    found = re.search(r"^\s*group_by:\s*\[(.*)\]", config.read_text(), re.M)
    assert found is not None
    group_by = {name.strip().strip("\"'") for name in found.group(1).split(",")}
    for alert in _every_kind_of_alert():
        missing = group_by - set(alert.labels)
        assert not missing, f"{alert.labels['alertname']} lacks {missing}"
