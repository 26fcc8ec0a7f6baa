"""Suite-wide test policy.

A test marked `kafka` drives real processes (workers, sinks, adapters, a broker it may stop)
through real sockets on a shared two-core machine: a scheduling stall can push one of its
waits past its deadline. Such a test runs once more when it fails, and only once; pytest's
summary line counts every rerun ("N rerun"), so a test that needed one is visible and is a
bug to chase (its timing), not a pass to trust. A test that fails twice fails the suite.
Unit, property and end-to-end tests without the marker are never rerun.
"""

from __future__ import annotations

import pytest

KAFKA_RERUNS = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kafka") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=KAFKA_RERUNS, reruns_delay=2))
