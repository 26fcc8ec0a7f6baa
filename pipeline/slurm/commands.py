"""Talking to Slurm through its own commands: `sinfo --json` to read, `scontrol` to act.

Debian's 22.05 has no REST call that changes a node (slurmrestd's v0.0.38 only reads) and no
`scontrol --json`, so the commands are the API. Each runs with SLURM_CONF from [slurm], a
timeout (slurm.command_timeout_s) and no shell. A command that fails because the controller
is away or slow (timeouts, "Unable to contact slurm controller", "Socket timed out") raises
SinkError: retried, nothing committed. One Slurm refuses for what it was asked (an invalid node
name, an argument it cannot take) raises SlurmRefusedError: tried a few times, then
dead-lettered. Either names the command and what Slurm said.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pipeline.actuate.base import RefusedError
from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.slurm.nodes import SlurmNode, parse_sinfo

# what Slurm says when the request itself can never succeed (scontrol's own words)
_REFUSALS = ("Invalid", "Unknown", "Access/permission denied")


class SlurmRefusedError(RefusedError):
    """Slurm refused the request for good (e.g. a node name it does not know)."""


class Slurm:
    """The commands, configured once from [slurm]."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self._env = dict(os.environ)
        if settings.conf:
            self._env["SLURM_CONF"] = settings.conf

    def run(self, *args: str) -> str:
        """Run one Slurm command (args[0] is its name); its stdout. Raises SinkError or
        SlurmRefusedError (module docstring)."""
        binary = str(Path(self.settings.bin_dir) / args[0]) if self.settings.bin_dir else args[0]
        shown = " ".join(args)[:300]
        try:
            done = subprocess.run([binary, *args[1:]], env=self._env, capture_output=True,
                                  text=True, timeout=self.settings.command_timeout_s,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SinkError(f"`{shown}` took more than slurm.command_timeout_s "
                            f"({self.settings.command_timeout_s:g} s)") from None  # fmt: skip
        except OSError as exc:
            raise SinkError(f"`{shown}` could not start: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().replace("\n", "; ")[:500]
            what = f"`{shown}` exited {done.returncode}: {said or 'no message'}"
            if any(word in said for word in _REFUSALS) and "controller" not in said:
                raise SlurmRefusedError(what)
            raise SinkError(what)
        return done.stdout

    def nodes(self, names: Sequence[str] = ()) -> list[SlurmNode]:
        """Every node (or those named) as `sinfo --json` lists them."""
        args = ["sinfo", "--json"]
        if names:
            args += ["--nodes", ",".join(names)]
        return parse_sinfo(self.run(*args))

    def node(self, name: str) -> SlurmNode | None:
        found = [n for n in self.nodes([name]) if n.name == name]
        return found[0] if found else None

    def update(self, name: str, **fields: str) -> None:
        """`scontrol update NodeName=<name> Key=value …` (values passed as one argument each,
        so a reason with spaces needs no quoting)."""
        self.run("scontrol", "update", f"NodeName={name}",
                 *(f"{key}={value}" for key, value in fields.items()))  # fmt: skip

    def reboot(self, name: str, reason: str) -> None:
        """Reboot once the node's jobs are done (ASAP drains it meanwhile), then resume it."""
        self.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", name)

    def reservations(self) -> str:
        return self.run("scontrol", "show", "reservation", "-o")

    def jobs_on(self, name: str) -> str:
        """`squeue` lines for the jobs on the node: id, user, name."""
        return self.run("squeue", "-h", "-w", name, "-o", "%i %u %j")
