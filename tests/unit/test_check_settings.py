"""Every check reads its own settings: moving a setting in [detect] and putting it back for
every check that names it (`[detect.checks."<check>"] settings`) changes nothing, so no
detector reads a check's threshold from the shared value behind the check's back."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from pipeline.config import DetectSettings, Settings, load_settings
from pipeline.detect.catalog import CATALOG, SHARED_SETTINGS
from pipeline.model import Action, Event, Finding
from pipeline.runtime.embedded import collect
from pipeline.sim import Simulation

BASE = load_settings(environ={})
OWN = sorted({n for spec in CATALOG for n in spec.settings if n not in SHARED_SETTINGS})


def _moved(value: Any, name: str) -> Any:
    """A valid value far from `value` for the setting `name` (far, so that a detector that
    reads the moved value changes what it finds in the fleet below)."""
    defaults = msgspec.structs.asdict(DetectSettings())
    if isinstance(value, bool):
        candidates: list[Any] = [not value]
    elif isinstance(value, int):
        candidates = [max(value // 4, 1), value * 4, value + 1]
    else:
        candidates = [value / 8, value * 8, value + 1.0]
    for candidate in candidates:
        try:
            msgspec.convert(defaults | {name: candidate, "checks": {}}, DetectSettings)
        except msgspec.ValidationError:
            continue
        if candidate != value:
            return candidate
    raise AssertionError(f"no other valid value for {name}")


def _detect(restored: bool) -> DetectSettings:
    defaults = DetectSettings()
    fields = msgspec.structs.asdict(defaults)
    moved = {name: _moved(fields[name], name) for name in OWN}
    checks = {
        spec.name: {"settings": {n: fields[n] for n in spec.settings if n in moved}}
        for spec in CATALOG
        if restored and any(n in moved for n in spec.settings)
    }
    return msgspec.convert(fields | moved | {"checks": checks}, DetectSettings)


@cache
def _verdicts(which: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Findings and actions of one faulty simulated fleet under default, moved or moved and
    restored settings."""
    sim = msgspec.structs.replace(
        BASE.sim, seed=5, duration_s=3 * 3600, gpu_nodes=24, clusters=2, tpu_slices=2,
        intensity=1000.0, gpu_interval_s=30, tpu_interval_s=30, ici_interval_s=30,
    )  # fmt: skip
    detect = BASE.detect if which == "default" else _detect(restored=which == "restored")
    settings: Settings = msgspec.structs.replace(BASE, sim=sim, detect=detect)
    out = collect(settings, Simulation(sim).events())
    findings = [_finding(f) for f in out.get("findings", []) if isinstance(f, Finding)]
    actions = [(a.ts, a.kind, a.target.name) for a in out.get("actions", []) if isinstance(a, Action)]
    return findings, actions


def _finding(f: Event) -> tuple[Any, ...]:
    assert isinstance(f, Finding)
    return (f.ts, f.check, f.entity.target.name, f.entity.device, f.healthy)


def test_every_check_reads_its_thresholds_as_its_own() -> None:
    default = _verdicts("default")
    assert len(default[0]) > 100 and default[1], "the fleet must give the checks work"
    assert _verdicts("moved") != default, "moving the settings must matter to this fleet"
    restored = _verdicts("restored")
    assert restored[0] == default[0]
    assert restored[1] == default[1]


def test_a_check_without_its_own_settings_reads_the_shared_ones() -> None:
    restored = _detect(restored=True)
    for spec in CATALOG:
        own = restored.tuned(spec.name)
        for name in spec.settings:
            if name in SHARED_SETTINGS:
                assert getattr(own, name) == getattr(DetectSettings(), name)
            else:  # the check's own copy is back at the default, the shared value is not
                assert getattr(own, name) == getattr(DetectSettings(), name), (spec.name, name)
                assert getattr(restored, name) != getattr(DetectSettings(), name), name
