"""The exception tree. Callers catch FleetPulseError; the runtime routes DecodeError to the DLQ.

FleetPulseError
├── ConfigError        bad config file or environment override (raised at start-up)
├── DecodeError        a record that does not match its schema (goes to fleet.dlq)
│   └── InvalidNameError  a name field that does not match model.NAME_PATTERN
├── SourceError        an ingest endpoint failed or answered nonsense (retried with backoff)
│   └── BrokerUnavailableError  Kafka did not take an ingest batch (retried within seconds)
├── SinkError          an output could not be written (the record is not acknowledged)
└── ListenError        a listening address is taken or not allowed (raised at start-up)
"""

from __future__ import annotations


class FleetPulseError(Exception):
    """Base of every error FleetPulse raises on purpose."""


class ConfigError(FleetPulseError):
    """The config file or an environment override is invalid; the message names the key."""


class DecodeError(FleetPulseError):
    """A record does not match its schema.

    Carries the field path, what was expected and what arrived, so a dead letter explains itself,
    and a short machine-readable `reason` for metrics and the dead letter's `reason` field:
    "tombstone" (a null value), "too_large" (over kafka.max_value_bytes), "too_deep" (nesting
    beyond the parser's limit) or "invalid" (anything else: not JSON, not UTF-8, wrong schema).
    """

    def __init__(
        self, field: str, expected: str, got: str, detail: str = "", reason: str = "invalid"
    ) -> None:
        self.field, self.expected, self.got, self.detail = field, expected, got, detail
        self.reason = reason
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{field}: expected {expected}, got {got}{extra}")


class InvalidNameError(DecodeError, ValueError):
    """A name field (cluster, pool, zone, node, ...) does not match model.NAME_PATTERN.

    Raised by a struct's __post_init__ (model.KnownNames), so both where a struct is decoded
    and where a source builds one: msgspec turns a ValueError into its ValidationError with the
    path (the codec then names the field), and a source's `except DecodeError` dead-letters it.
    """

    def __init__(self, field: str, expected: str, got: str) -> None:
        super().__init__(field=f"$.{field}", expected=expected, got=got)


class SourceError(FleetPulseError):
    """An ingest source failed; the adapter retries with backoff."""


class BrokerUnavailableError(SourceError):
    """Kafka could not be reached or did not acknowledge a batch; the adapter retries within a
    few seconds (the endpoint's longer backoff is for the endpoint)."""


class SinkError(FleetPulseError):
    """An output could not be written; the input is not acknowledged.

    `reason` is short and machine-readable, for metrics ("disk_full", "delivery", …)."""

    def __init__(self, message: str, reason: str = "error") -> None:
        self.reason = reason
        super().__init__(message)


class ListenError(FleetPulseError):
    """A process cannot listen where it is configured to; the message names the setting."""
