"""Fixtures for tests against real services started by `make test` (deploy/with-services.sh).

Nothing here skips: a test that needs Kafka fails loudly when the broker is unreachable,
because in CI every real component must be present.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
import warnings
from collections.abc import Iterator

import msgspec
import pytest
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError, UnknownTopicOrPartitionError

from pipeline.config import KafkaSettings, Settings, load_settings


def _bootstrap() -> str:
    return os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    bootstrap = _bootstrap()
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(
            f"Kafka is not reachable at {bootstrap} ({exc}); run the tests with `make test`, "
            "which starts the broker (deploy/kafka/kafka.sh start)"
        )
    before = _topics(bootstrap)
    yield bootstrap
    _delete_new_topics(bootstrap, before)


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _delete_new_topics(bootstrap: str, before: set[str]) -> None:
    """The topics this session made (every test has a prefix of its own): a broker kept between
    runs (`make kafka-up`) would otherwise gather thousands, and every client that asks for all
    topics' metadata (faust's, at start) pays for each of them."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        made = sorted(t for t in set(admin.list_topics()) - before if not t.startswith("__"))
        for start in range(0, len(made), 200):
            # some may be gone already: the rest of the request is carried out all the same
            with contextlib.suppress(UnknownTopicOrPartitionError):
                admin.delete_topics(made[start : start + 200], timeout_ms=60_000)
    except KafkaError as exc:  # the tests' results stand; the broker is only left fuller
        warnings.warn(f"could not delete this session's topics: {type(exc).__name__}",
                      stacklevel=1)
    finally:
        admin.close()


@pytest.fixture
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    """Kafka settings with a topic prefix unique to this test, so tests never share topics."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=prefix, partitions=3)


@pytest.fixture
def settings(kafka_settings: KafkaSettings) -> Settings:
    return msgspec.structs.replace(load_settings(environ={}), kafka=kafka_settings)


# the real kube-apiserver and helm for tests/integration/test_kubernetes_*.py
# a worker and an actuator scraped by a real Prometheus (test_rules_promtool, test_dashboard_queries)
from tests.integration.fleet_processes import fleet_scraped  # noqa: E402, F401
from tests.kube_fixture import helm, kube  # noqa: E402, F401
