"""A real Slurm for the Slurm tests, from deploy/slurm/slurm.sh: Debian's slurmctld, four
`slurmd -N gpu-<i>` on this host (8 fake GPUs each, partition `batch`), munged.

`make test` (deploy/with-services.sh) starts it and exports SLURM_CONF; a session started
without it starts one itself on SLURM_CTLD_PORT / SLURM_NODE_PORT (or their defaults) and stops
it at the end. Tests share the four nodes one after another: `lab.node()` hands one out and the
fixture puts every node it handed out back as it found it (jobs cancelled, reboots finished,
drains resumed, comment cleared, a killed slurmd started again, reservations deleted).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import SlurmSettings
from pipeline.slurm.nodes import SlurmNode, parse_sinfo

REPO = Path(__file__).resolve().parents[1]
SLURM_SH = REPO / "deploy" / "slurm" / "slurm.sh"
NODES = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
CLUSTER = "slurm-lab"  # FleetPulse's name for this Slurm cluster in the tests
POOL, ZONE = "batch", "lab"  # the partition, and the zone the tests configure


@dataclass
class SlurmLab:
    conf: str
    used: list[str] = field(default_factory=list)
    reservations: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)

    def settings(self, **extra: Any) -> SlurmSettings:
        base: dict[str, Any] = {"conf": self.conf, "zone": ZONE, "cluster": CLUSTER,
                                "drain_poll_s": 0.3, "command_timeout_s": 15.0}  # fmt: skip
        return SlurmSettings(**(base | extra))

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(list(args), env={**os.environ, "SLURM_CONF": self.conf},
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def node(self) -> str:
        """A node no other part of this test has, idle."""
        name = next(n for n in NODES if n not in self.used)
        self.used.append(name)
        return name

    def state(self, name: str) -> SlurmNode:
        (found,) = [n for n in parse_sinfo(self.run("sinfo", "--json")) if n.name == name]
        return found

    def job(self, node: str, seconds: float, marker: Path | None = None) -> str:
        """A real batch job on the node: sleeps, then (if asked) writes `marker` to prove it ran
        to its end rather than being killed."""
        script = f"sleep {seconds}" + (f"; echo done > {marker}" if marker else "")
        job = self.submit(node, script)
        self.until(lambda: self.state(node).busy, 10, f"job {job} running on {node}")
        return job

    def submit(self, node: str, script: str) -> str:
        """`sbatch -w node --wrap script`: the job id (cancelled at the end, even if pending)."""
        out = self.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", script)
        self.jobs.append(out.strip().split(";")[0])
        return self.jobs[-1]

    def drain_by_person(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def maintenance(self, node: str) -> str:
        name = f"maint-{node}-{int(time.time() * 1000) % 100000}"
        self.run("scontrol", "create", "reservation", f"ReservationName={name}",
                 "StartTime=now", "Duration=10", f"Nodes={node}", "Users=root", "Flags=MAINT")
        self.reservations.append(name)
        return name

    def kill_slurmd(self, node: str) -> None:
        pid = (Path(self.conf).parent / "run" / f"slurmd-{node}.pid").read_text().strip()
        os.kill(int(pid), 15)

    def until(self, check: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Poll `check` until true; the seconds it took (fails the test after timeout_s)."""
        start = time.monotonic()
        while not check():
            assert time.monotonic() - start < timeout_s, f"not {what} after {timeout_s} s"
            time.sleep(0.2)
        return time.monotonic() - start

    def reset(self) -> None:
        if self.jobs:  # a job still pending on a drained node would run on the next test's
            self.run("scancel", *self.jobs, check=False)
        for name in self.reservations:
            self.run("scontrol", "delete", f"ReservationName={name}", check=False)
        for node in self.used:
            self._reset(node)

    def _reset(self, node: str) -> None:
        self.run("scancel", "-w", node, check=False)
        pidfile = Path(self.conf).parent / "run" / f"slurmd-{node}.pid"
        if not _alive(pidfile):
            self.run("/usr/sbin/slurmd", "-f", self.conf, "-N", node)
        self.until(lambda: not self.state(node).reboot_pending and not self.state(node).busy,
                   30, f"{node} settled")  # fmt: skip
        now = self.state(node)
        if now.drain or now.down:
            self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.run("scontrol", "update", f"NodeName={node}", "Comment=")
        self.until(lambda: _idle(self.state(node)), 30, f"{node} idle again")


def _idle(node: SlurmNode) -> bool:
    return node.state == "idle" and not node.flags - {"RESERVED"}


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    conf = os.environ.get("SLURM_CONF")
    if conf:
        yield conf
        return
    start = subprocess.run(["bash", str(SLURM_SH), "start"], capture_output=True, text=True,
                           timeout=120, check=False)  # fmt: skip
    if start.returncode != 0:
        pytest.fail(f"deploy/slurm/slurm.sh start failed: {start.stderr[-2000:]}")
    line = [ln for ln in start.stdout.splitlines() if ln.startswith("SLURM_CONF=")][-1]
    try:
        yield line.removeprefix("SLURM_CONF=")
    finally:
        subprocess.run(["bash", str(SLURM_SH), "stop"], capture_output=True, timeout=120,
                       check=False)  # fmt: skip


@pytest.fixture
def slurm(slurm_conf: str) -> Iterator[SlurmLab]:
    lab = SlurmLab(slurm_conf)
    try:
        yield lab
    finally:
        lab.reset()
