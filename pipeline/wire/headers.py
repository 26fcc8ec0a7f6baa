"""CloudEvents Kafka binary-mode headers for what downstream consumers read: actions, alerts,
node state.

The record value stays the plain JSON of the topic's schema; the CloudEvents attributes go in
`ce_*` headers (and `content-type`), so a consumer can route on type and subject without
decoding, and a CloudEvents SDK reads the record as an event. Built with the `cloudevents`
SDK's Kafka binding, so the header names and encodings are the spec's, not ours.

- ce_id: the content-derived id: action_id; for an alert, fingerprint + status + ts; for a
  node state, target + ts + state. A redelivered record carries the same id.
- ce_source: the stage that decided it (/fleetpulse/policy, /fleetpulse/health).
- ce_type: io.fleetpulse.action.<kind>, io.fleetpulse.alert.<status>,
  io.fleetpulse.node_state.<state>.
- ce_subject: cluster/target (cluster/pool for pool-wide alerts).
- ce_time: the event's `ts` (event time), RFC 3339 UTC.
- ce_dataschema: the schema's `$id`.

Pure: everything comes from the event; never the clock (the SDK would default `time` to now,
so it is always given).
"""

from __future__ import annotations

from datetime import UTC, datetime

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from pipeline.ids import stable_id
from pipeline.model import Action, Alert, Event, NodeState
from pipeline.schemas_tool import schema_id

# Topic suffixes whose records carry the headers (pipeline/wire/topics.py)
TOPICS = frozenset({"actions", "alerts", "node-state"})
TYPE_PREFIX = "io.fleetpulse"
CONTENT_TYPE = "application/json"
_FORMAT = JSONFormat()
Headers = list[tuple[str, bytes]]


def attributes(event: Action | Alert | NodeState) -> dict[str, object]:
    """The CloudEvents attributes of one event (specversion is the SDK's 1.0)."""
    if isinstance(event, Action):
        ce_id, source = event.action_id, "/fleetpulse/policy"
        ce_type = f"{TYPE_PREFIX}.action.{event.kind}"
        subject = f"{event.target.cluster}/{event.target.name}"
    elif isinstance(event, Alert):
        ce_id = stable_id("alr", event.fingerprint, event.status, event.ts)
        source = "/fleetpulse/policy"
        ce_type = f"{TYPE_PREFIX}.alert.{event.status}"
        subject = _alert_subject(event)
    else:
        target = event.target
        ce_id = stable_id("nst", target.cluster, target.kind, target.name, event.ts, event.state)
        source = "/fleetpulse/health"
        ce_type = f"{TYPE_PREFIX}.node_state.{event.state}"
        subject = f"{target.cluster}/{target.name}"
    return {
        "id": ce_id,
        "source": source,
        "type": ce_type,
        "subject": subject,
        "time": _time(event.ts),
        "dataschema": schema_id(type(event)),
        "datacontenttype": CONTENT_TYPE,
    }


def _time(ms: int) -> datetime:
    seconds, millis = divmod(ms, 1000)  # integer ms: no float rounding in the stamp
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=millis * 1000)


def _alert_subject(alert: Alert) -> str:
    labels = alert.labels
    where = labels.get("node") or labels.get("slice") or labels.get("pool") or "fleet"
    cluster = labels.get("cluster")
    return f"{cluster}/{where}" if cluster else where


def headers(event: Event, value: bytes) -> Headers:
    """Binary-mode headers for `event`, whose encoded value is `value` (sent unchanged); no
    headers for values that are not actions, alerts or node states."""
    if not isinstance(event, Action | Alert | NodeState):
        return []
    message = ce_kafka.to_binary(CloudEvent(attributes(event), data=value), _FORMAT)
    # bytes data is written as-is: the record value is exactly the schema's JSON
    assert message.value == value
    return list(message.headers.items())
