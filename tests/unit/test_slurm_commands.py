"""Slurm's commands as the actuator and watcher run them: a slow one is cut at
slurm.command_timeout_s, a controller that is away is a failure to retry (SinkError), a request
Slurm refuses for what it asks is SlurmRefusedError (dead-lettered after a few tries), and each
error names the command and what Slurm said. The commands here are small scripts standing in
for scontrol (the real ones are run against a real slurmctld in tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.slurm.commands import Slurm, SlurmRefusedError


def slurm_with(tmp_path: Path, script: str, timeout_s: float = 5.0) -> Slurm:
    """A Slurm whose `scontrol` is `script` (a bash body)."""
    path = tmp_path / "scontrol"
    path.write_text(f"#!/bin/bash\n{script}\n")
    path.chmod(0o755)
    return Slurm(SlurmSettings(bin_dir=str(tmp_path), command_timeout_s=timeout_s))


def test_a_slow_command_is_cut_at_the_timeout(tmp_path: Path) -> None:
    slurm = slurm_with(tmp_path, "sleep 5", timeout_s=0.3)
    with pytest.raises(SinkError, match=r"`scontrol update NodeName=n1 State=DRAIN` took more "
                       r"than slurm.command_timeout_s \(0.3 s\)"):  # fmt: skip
        slurm.update("n1", State="DRAIN")


def test_a_controller_away_is_retried_not_dead_lettered(tmp_path: Path) -> None:
    said = "slurm_update error: Unable to contact slurm controller (connect failure)"
    slurm = slurm_with(tmp_path, f"echo '{said}' >&2; exit 1")
    with pytest.raises(SinkError) as caught:
        slurm.update("n1", State="DRAIN")
    assert not isinstance(caught.value, SlurmRefusedError)
    assert "exited 1: slurm_update error: Unable to contact slurm controller" in str(caught.value)


def test_a_request_slurm_refuses_is_refused_for_good(tmp_path: Path) -> None:
    slurm = slurm_with(tmp_path, "echo 'slurm_update error: Invalid node name specified' >&2; "
                       "exit 1")  # fmt: skip
    with pytest.raises(SlurmRefusedError, match="Invalid node name specified"):
        slurm.update("n1", State="DRAIN")


def test_arguments_pass_as_they_are_no_shell(tmp_path: Path) -> None:
    slurm = slurm_with(tmp_path, 'printf "%s|" "$@"')
    assert slurm.run("scontrol", "update", "Reason=fleetpulse: a $(b) `c`") == \
        "update|Reason=fleetpulse: a $(b) `c`|"  # fmt: skip


def test_a_missing_command_says_so(tmp_path: Path) -> None:
    slurm = Slurm(SlurmSettings(bin_dir=str(tmp_path / "nowhere")))
    with pytest.raises(SinkError, match="`sinfo --json` could not start"):
        slurm.nodes()
