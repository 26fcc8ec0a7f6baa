"""What every benchmark shares: machine description, repetitions, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("msgspec", "numpy", "pyarrow", "duckdb", "faust-streaming", "aiokafka", "kafka-python")


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": _commit(),
    }


def _commit() -> str:
    """The checkout measured: HEAD, marked "+dirty" when tracked files differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, check=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def median_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, list[float]]:
    """Run fn `repeat` times; return the median wall time and every run's time."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def write_result(name: str, figures: dict[str, Any], settings: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    body = {"name": name, "figures": figures, "settings": settings, "machine": machine()}
    path.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
    return path


# --- shared by the pipeline benchmarks (throughput, latency, detection, profile) ---------------

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Timing:
    """Median wall and CPU seconds of several runs of one thing, with every run kept.

    CPU seconds are this process's (user + system), so on a shared machine a rate per CPU
    second ("per core") moves less than a rate per wall second when neighbours are busy.
    """

    wall_s: float
    cpu_s: float
    runs_wall_s: list[float]
    runs_cpu_s: list[float]

    def rates(self, units: float) -> dict[str, float]:
        return {"per_s": units / self.wall_s, "per_core_s": units / self.cpu_s}

    def summary(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 4),
            "cpu_s": round(self.cpu_s, 4),
            "runs_wall_s": [round(t, 4) for t in self.runs_wall_s],
            "runs_cpu_s": [round(t, 4) for t in self.runs_cpu_s],
        }


def timing(runs: list[tuple[float, float]]) -> Timing:
    """A Timing from (wall_s, cpu_s) pairs; the medians are taken independently."""
    walls = [wall for wall, _ in runs]
    cpus = [cpu for _, cpu in runs]
    return Timing(statistics.median(walls), statistics.median(cpus), walls, cpus)


def measure(fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None,
            ) -> Timing:
    """Run `fn` `repeat` times (each after `setup`, untimed); wall and CPU time of each."""
    runs = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return timing(runs)


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (default: this one), from /proc."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


def result_name(name: str, quick: bool) -> str:
    """Quick runs write `<name>-quick.json` so they never overwrite a full run's figures."""
    return f"{name}-quick" if quick else name
