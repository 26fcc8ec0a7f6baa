"""The real-service fixtures of tests/integration (Kafka), for the fault scenarios."""

from tests.integration.conftest import kafka_bootstrap, kafka_settings, settings

__all__ = ["kafka_bootstrap", "kafka_settings", "settings"]
