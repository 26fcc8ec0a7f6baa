"""What every benchmark shares: machine description, repetitions, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
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
    }


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
