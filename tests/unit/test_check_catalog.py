"""The check catalog, the episode engine and the generated check table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import cli
from pipeline.config import DetectSettings, load_settings
from pipeline.detect import (
    catalog,
    check_docs,
    device_flap,
    episodes,
    fabric_localise,
    gpu,
    gpu_counters,
    gpu_gauges,
    ici,
    job_peers,
    tpu,
)
from pipeline.detect import fabric as fabric_checks
from pipeline.detect import xid as xid_checks
from pipeline.detect.catalog import CATALOG, CHECKS, spec_of, validate_tunings
from pipeline.detect.episodes import CLEAR, OPEN, Rule, Run, open_episode, step
from pipeline.detect.findings import Book, heartbeat
from pipeline.detect.skew import skew_finding
from pipeline.detect.spec import CheckSpec
from pipeline.errors import ConfigError
from pipeline.model import Target

DEFAULTS = DetectSettings()


def test_the_docs_table_is_the_catalogs() -> None:
    text = check_docs.DOC.read_text()
    assert check_docs.render(text) == text, "run: python -m pipeline.detect.check_docs"


# A check name as a detector would spell it: family, dot, parts; or one of the two plain ones.
CHECK_NAME = re.compile(
    r"^(gpu|tpu|ici|fabric|job|xid|node)(\.[a-z0-9_<>]+)+$|^(heartbeat|clock_skew)$"
)


def test_no_detector_spells_a_check_name() -> None:
    """Check names come from the catalog: a name typed in a detector could drift from it."""
    spelled = []
    for path in sorted(Path(catalog.__file__).parent.glob("*.py")):
        if path.name == "catalog.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if CHECK_NAME.match(node.value):
                spelled.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not spelled, "use the catalog's names: " + ", ".join(spelled)
    assert CHECK_NAME.match("gpu.ecc.dbe") and not CHECK_NAME.match("DCGM_FI_DEV_GPU_TEMP")


def test_the_names_detectors_take_are_the_catalogs_checks() -> None:
    named = [
        gpu.NODE_STALE, gpu.NODE_DOWN, gpu.GPU_MISSING, gpu_counters.DBE, gpu_counters.SBE,
        gpu_counters.REMAP_FAILURE, gpu_counters.REMAP_PENDING, gpu_counters.PCIE_REPLAY,
        gpu_counters.PCIE_DOWNGRADE, gpu_counters.NVLINK, gpu_counters.RECOVERY, gpu_gauges.TEMP,
        gpu_gauges.CLOCK, gpu_gauges.SLOW, gpu_gauges.POWER, gpu_gauges.PCIE_TRAFFIC,
        tpu.DUTY, tpu.UTIL, tpu.CHIP_MISSING, tpu.HOST_STALE, tpu.HOST_DOWN, tpu.SLICE_STALE,
        ici.LINK_DOWN, ici.LINK_DEGRADED, ici.CHIP_DOWN, ici.HOST_DOWN, ici.OCS,
        fabric_checks.NIC_MISSING, fabric_checks.PORT_DOWN, fabric_checks.PORT_FLAP,
        fabric_checks.PORT_FLAP_PERSISTENT, fabric_checks.PORT_ERRORS,
        fabric_localise.SWITCH_DOWN, *fabric_localise.LINK_CHECKS.values(),
        job_peers.STRAGGLER, job_peers.PERSISTENT, *job_peers.ACTIVITY, job_peers.STEP,
        job_peers.STEP_PERSISTENT, *xid_checks.APP_CHECKS, catalog.xid_check(154),
        *(c for prefix in device_flap.PREFIXES for c in device_flap.flap_checks(prefix)),
        catalog.HEARTBEAT, catalog.CLOCK_SKEW,
    ]  # fmt: skip
    assert sorted(named) == sorted(n for n in CHECKS if "<code>" not in n)
    assert spec_of("xid.79").name == "xid.<code>"
    assert spec_of(catalog.xid_check(74, nonfatal=True)).name == "xid.<code>.nonfatal"
    with pytest.raises(KeyError, match="unknown check"):
        spec_of("gpu.nope")


def test_heartbeat_and_clock_skew_findings_follow_their_specs() -> None:
    book = Book(cluster="c", kind="slice", name="s1", pool="p", zone="z")
    beat = heartbeat(book, 60_000, 60)
    assert beat is not None and beat.check == catalog.HEARTBEAT
    assert (beat.severity, beat.recommended_action, beat.healthy) == ("info", "none", True)
    assert beat.entity.kind == "slice" and heartbeat(book, 61_000, 60) is None
    target = Target(cluster="c", kind="node", name="n1", pool="p", zone="z")
    off = skew_finding(target, since=5_000, reference=5_000, off_ms=-90_000, is_off=True)
    back = skew_finding(target, since=5_000, reference=9_000, off_ms=1_000, is_off=False)
    spec = CHECKS[catalog.CLOCK_SKEW]
    assert (off.severity, off.recommended_action, off.healthy) == (spec.severity, spec.action,
                                                                   False)  # fmt: skip
    assert off.message == "event time of n1 is 90 s behind the partition's clock"
    assert (back.severity, back.recommended_action, back.healthy) == ("info", "none", True)
    assert off.finding_id != back.finding_id and off.entity.kind == "node"
    assert off.evidence is not None and off.evidence.value == -90.0


@pytest.mark.parametrize("spec", CATALOG, ids=[s.name for s in CATALOG])
def test_a_spec_names_only_settings_that_exist(spec: CheckSpec) -> None:
    fields = set(DetectSettings.__struct_fields__)
    assert set(spec.settings) <= fields
    for amount in (spec.persistence.open_after, spec.persistence.clear_after):
        if isinstance(amount, str):
            assert isinstance(getattr(DEFAULTS, amount), int), amount


def test_a_checks_persistence_is_tuned_alone_from_the_environment() -> None:
    settings = load_settings(
        environ={"FLEETPULSE_DETECT__CHECKS": '{"gpu.temp.peer" = {open_after = 9}}'}
    ).detect
    assert episodes.rule(settings, "gpu.temp.peer") == Rule(9, False, 6, False)
    assert episodes.rule(settings, "gpu.power.peer") == Rule(4, False, 6, False)  # shared
    assert episodes.rule(settings, "tpu.chip.duty_cycle") == Rule(30_000, True, 120_000, True)


@pytest.mark.parametrize(
    ("name", "refusal"),
    [("gpu.nope", "no check named gpu.nope"), ("gpu.ecc.dbe", "no tunable persistence")],
)
def test_only_engine_counted_checks_take_an_override(name: str, refusal: str) -> None:
    environ = {"FLEETPULSE_DETECT__CHECKS": f'{{"{name}" = {{open_after = 2}}}}'}
    with pytest.raises(ConfigError, match=refusal):
        validate_tunings(load_settings(environ=environ).detect)


def test_a_checks_thresholds_are_tuned_alone_from_the_environment() -> None:
    environ = {"FLEETPULSE_DETECT__CHECKS":
               '{"job.straggler.persistent" = {settings = {clock_drop_frac = 0.08}}}'}  # fmt: skip
    settings = load_settings(environ=environ).detect
    assert settings.tuned("job.straggler.persistent").clock_drop_frac == 0.08
    assert settings.clock_drop_frac == 0.05
    for other in ("job.straggler", "gpu.clock.throttle", "gpu.temp.peer"):
        assert settings.tuned(other) is settings  # the others read the shared value
    # a persistence setting named in `settings` is the check's own too
    environ = {"FLEETPULSE_DETECT__CHECKS":
               '{"job.straggler.persistent" = {settings = {slow_escalate_s = 600}}}'}  # fmt: skip
    settings = load_settings(environ=environ).detect
    assert episodes.rule(settings, "job.straggler.persistent").open_after == 600_000
    assert episodes.rule(settings, "gpu.clock.throttle") == episodes.rule(DEFAULTS, "gpu.clock.throttle")


@pytest.mark.parametrize(
    ("tuning", "refusal"),
    [
        ('{"gpu.temp.peer" = {settings = {clock_drop_frac = 0.1}}}',
         "clock_drop_frac not used by gpu.temp.peer; expected one of temp_peer_delta_c"),
        ('{"gpu.temp.peer" = {settings = {peer_min = 3}}}',
         "peer_min shared by every check of its detector: set it in \\[detect\\]"),
        ('{"job.straggler" = {settings = {clock_drop_frac = 1.5}}}',
         "checks.job.straggler.settings: Expected `float` <= 1.0"),
    ],
)  # fmt: skip
def test_a_check_setting_it_does_not_use_or_shares_or_out_of_range_is_refused(
    tuning: str, refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal):
        validate_tunings(load_settings(environ={"FLEETPULSE_DETECT__CHECKS": tuning}).detect)


def test_the_cli_refuses_a_bad_check_tuning_at_its_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEETPULSE_DETECT__CHECKS", '{"gpu.nope" = {open_after = 2}}')
    assert cli.main(["simulate", "--list-faults"]) == 2
    assert capsys.readouterr().err == (
        "fleetpulse: error: invalid configuration: checks: no check named gpu.nope; "
        "docs/checks.md lists them - at `detect`\n"
    )


def test_good_check_tunings_pass() -> None:
    environ = {"FLEETPULSE_DETECT__CHECKS": '{"gpu.temp.peer" = {open_after = 6, settings = '
               '{temp_peer_delta_c = 8.0}}}'}  # fmt: skip
    validate_tunings(load_settings(environ=environ).detect)


def test_a_caller_cannot_change_a_checks_action() -> None:
    book = Book(cluster="c", kind="node", name="n", pool="p", zone="z")
    with pytest.raises(ValueError, match="catalog's"):
        open_episode(book, "gpu.temp.peer", 1, device="0", evidence=None, message="m",
                     action="reboot")  # fmt: skip
    found = open_episode(book, "gpu.recovery_action", 1, device="0", evidence=None, message="m",
                         action="reset_gpu")  # fmt: skip
    assert found is not None and found.recommended_action == "reset_gpu" and found.fatal


def _reference(verdicts: list[tuple[int, bool]], rule: Rule) -> list[int]:
    """The persistence rule in its plainest form: open once bad for `open_after` (samples or
    ms since the bad stretch began), clear once an open condition was good for `clear_after`."""
    edges, opened, bad_n, good_n, bad_since, good_since = [], False, 0, 0, 0, 0
    for ts, bad in verdicts:
        edge = 0
        if bad:
            bad_since = bad_since if bad_n else ts
            bad_n, good_n = bad_n + 1, 0
            held = ts - bad_since if rule.open_ms else bad_n
            if not opened and held >= rule.open_after:
                opened, edge = True, OPEN
        else:
            good_since = good_since if good_n else ts
            good_n, bad_n = good_n + 1, 0
            held = ts - good_since if rule.clear_ms else good_n
            if opened and held >= rule.clear_after:
                opened, edge = False, CLEAR
        edges.append(edge)
    return edges


@given(
    bads=st.lists(st.booleans(), max_size=60),
    gaps=st.lists(st.integers(1, 40_000), min_size=60, max_size=60),
    open_after=st.integers(0, 6),
    clear_after=st.integers(1, 6),
    in_ms=st.booleans(),
)
def test_the_engine_opens_and_clears_as_the_rule_says(
    bads: list[bool], gaps: list[int], open_after: int, clear_after: int, in_ms: bool
) -> None:
    rule = Rule(open_after * 10_000, True, clear_after * 10_000, True) if in_ms else Rule(
        max(open_after, 1), False, clear_after, False)  # fmt: skip
    ts, verdicts = 0, []
    for bad, gap in zip(bads, gaps, strict=False):
        ts += gap
        verdicts.append((ts, bad))
    runs: dict[str, Run] = {}
    got = [step(runs, "k", t, bad, rule) for t, bad in verdicts]
    assert got == _reference(verdicts, rule)


def test_runs_survive_a_state_round_trip() -> None:
    runs = {"k": Run(bad_since=5, streak=2, open=True)}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(runs), type=dict[str, Run]) == runs
