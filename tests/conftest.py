"""Suite-wide test policy.

A test marked `kafka` drives real processes (workers, sinks, adapters, a broker it may stop)
through real sockets on a shared two-core machine: a scheduling stall can push one of its
waits past its deadline. Such a test runs once more when it fails, and only once; pytest's
summary line counts every rerun ("N rerun") and a section before it shows the end of each
first failure, so a test that needed one is visible and is a bug to chase (its timing), not a
pass to trust. A test that fails twice fails the suite.
Unit, property and end-to-end tests without the marker are never rerun.

Property tests run derandomized in `make test` (profile `ci`): the same examples on every
run, so the suite passes or fails on the code, never on the draw. New examples are searched
for by `make fuzz` (profile `fuzz`: a random seed each run; a test without its own
`max_examples` draws 2,000); a failure it finds is fixed and then pinned with `@example(...)`
on the test so `make test` keeps it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

KAFKA_RERUNS = 1


_RERUN_TAIL_LINES = 12
_first_failures: list[tuple[str, str]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kafka") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=KAFKA_RERUNS, reruns_delay=2))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a rerun that then passes leaves no trace of why it failed: keep the end of the failure
    if report.outcome == "rerun":
        tail = "\n".join(report.longreprtext.strip().splitlines()[-_RERUN_TAIL_LINES:])
        _first_failures.append((report.nodeid, tail))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _first_failures:
        terminalreporter.section("why each rerun test failed the first time")
        for nodeid, tail in _first_failures:
            terminalreporter.line(f"{nodeid}:\n{tail}\n")
