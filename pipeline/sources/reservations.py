"""Reservations: Compute Engine (`google-cloud-compute` ReservationsClient, REST) and Cloud TPU
(`google-cloud-tpu` v2alpha1 `list_reservations`, gRPC) → RESERVATION_CHANGED events.

A reservation is capacity paid for whether used or not, so the capacity view needs how many
devices each holds and how many are in use:

- a specific reservation (`specificReservation`): `count` VMs of one shape, `inUseCount` of
  them running; devices = VMs x the shape's guest accelerators
- an aggregate reservation (`aggregateReservation`, TPUs and GPUs reserved by count):
  `reservedResources[].accelerator.acceleratorCount`, `inUseResources[]` likewise
- a Cloud TPU reservation (`Reservation.standard`): `size` in CHIPS (or CORES, turned into
  chips with the generation's TensorCores per chip), `usage.total` in use

Each is said once when first seen and again when its devices, use or state change, as a
RESERVATION_CHANGED whose `quota` carries it (metric = the reservation's resource name,
limit = devices reserved, usage = devices in use, unit "devices") and `state` its status; one
that disappears is said once more with state DELETED. The checkpoint keeps a digest per
reservation. A reservation without accelerators (CPU only) is not ours: skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.catalog import tpu_generation
from pipeline.errors import SourceError
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent, QuotaInfo
from pipeline.sources.base import Parsed, add_validated
from pipeline.sources.gcp_clients import NO_CREDENTIALS, api_call

COMPUTE_SOURCE = "gcp.compute.reservation"
TPU_SOURCE = "gcp.tpu.reservation"
GONE = "DELETED"


@dataclass(frozen=True)
class Held:
    """One reservation as read: its devices reserved and in use."""

    name: str  # the resource name, unique across zones and APIs
    zone: str
    accelerator_type: str  # as the API names it (a GPU type, a TPU type or generation)
    reserved: int
    in_use: int
    state: str
    source: str

    def digest(self) -> str:
        return f"{self.accelerator_type}|{self.reserved}|{self.in_use}|{self.state}"


# --- the pure parsers ----------------------------------------------------------------------


def compute_reservation(item: Any) -> Held | None:
    """A compute_v1.Reservation → Held; None when it reserves no accelerators."""
    if "specific_reservation" in item:
        figures = _specific(item.specific_reservation)
    elif "aggregate_reservation" in item:
        figures = _aggregate(item.aggregate_reservation)
    else:
        return None
    if figures is None:
        return None
    accelerator, reserved, in_use = figures
    return Held(
        name=str(item.self_link or item.name),
        zone=_last(item.zone),
        accelerator_type=accelerator,
        reserved=reserved,
        in_use=min(in_use, reserved),
        state=str(item.status or "READY"),
        source=COMPUTE_SOURCE,
    )


def _specific(specific: Any) -> tuple[str, int, int] | None:
    accelerators = list(specific.instance_properties.guest_accelerators)
    if not accelerators:
        return None
    per_vm = sum(int(a.accelerator_count) for a in accelerators)
    kind = _last(accelerators[0].accelerator_type)
    return kind, int(specific.count) * per_vm, int(specific.in_use_count) * per_vm


def _aggregate(aggregate: Any) -> tuple[str, int, int] | None:
    reserved = [r.accelerator for r in aggregate.reserved_resources if "accelerator" in r]
    if not reserved:
        return None
    in_use = [r.accelerator for r in aggregate.in_use_resources if "accelerator" in r]
    kind = _last(reserved[0].accelerator_type)
    return (
        kind,
        sum(int(a.accelerator_count) for a in reserved),
        sum(int(a.accelerator_count) for a in in_use),
    )


def tpu_reservation(item: Any) -> Held | None:
    """A tpu_v2alpha1.Reservation → Held (its size in chips); None without a standard part."""
    if "standard" not in item:
        return None
    standard = item.standard
    kind = str(standard.resource_type)
    chips, used = int(standard.size), int(standard.usage.total)
    if standard.capacity_units.name == "CORES":
        per_chip = _cores_per_chip(kind)
        chips, used = chips // per_chip, used // per_chip
    return Held(
        name=str(item.name),
        zone=item.name.split("/locations/", 1)[-1].split("/", 1)[0],
        accelerator_type=kind,
        reserved=chips,
        in_use=min(used, chips),
        state=item.state.name,
        source=TPU_SOURCE,
    )


def _cores_per_chip(kind: str) -> int:
    try:
        return tpu_generation(kind).tensorcores_per_chip
    except (KeyError, ValueError):
        return 1


def reservation_events(seen: dict[str, str], held: Sequence[Held], now_ms: int) -> Parsed:
    """Events for reservations new or changed since `seen` (name → digest, updated in place),
    and a DELETED one for each that is gone."""
    parsed = Parsed()
    current = {h.name: h for h in held}
    for name, one in sorted(current.items()):
        if seen.get(name) != one.digest():
            _add(parsed, one, now_ms, seen.get(name))
            seen[name] = one.digest()
    for name in sorted(set(seen) - set(current)):
        last = seen.pop(name)
        gone = Held(name, _zone_of(name), last.split("|", 1)[0], 0, 0, GONE, _source_of(name))
        _add(parsed, gone, now_ms, last)
    return parsed


def _add(parsed: Parsed, held: Held, now_ms: int, previous: str | None) -> None:
    add_validated(parsed, lambda: _event(held, now_ms, previous), repr(held))


def _event(held: Held, now_ms: int, previous: str | None) -> CapacityEvent:
    return CapacityEvent(
        event_id=stable_id("cap", "reservation", held.name, held.digest(), now_ms),
        ts=now_ms,
        provider="gcp",
        source=held.source,
        kind="RESERVATION_CHANGED",
        severity="info",
        region=held.zone.rsplit("-", 1)[0],
        zone=held.zone,
        accelerator_type=held.accelerator_type,
        quota=QuotaInfo(
            metric=held.name[-256:], limit=held.reserved, usage=held.in_use, unit="devices"
        ),
        state=held.state,
        previous_state=None if previous is None else previous.rsplit("|", 1)[-1] or None,
        message=(
            f"reservation {held.name.rsplit('/', 1)[-1]}: {held.in_use} of {held.reserved} "
            f"{held.accelerator_type} in use ({held.state})"
        ),
    )


def _zone_of(name: str) -> str:
    for marker in ("/zones/", "/locations/"):
        if marker in name:
            return name.split(marker, 1)[1].split("/", 1)[0]
    return "unknown"


def _source_of(name: str) -> str:
    return TPU_SOURCE if "/locations/" in name else COMPUTE_SOURCE


def _last(url: str) -> str:
    return str(url).rstrip("/").rsplit("/", 1)[-1]


# --- the reading ---------------------------------------------------------------------------


def list_compute(
    client: Any, project: str, zones: Sequence[str], page_size: int, timeout_s: float
) -> list[Held]:
    """Every accelerator reservation of the project (of `zones` when given), by name."""
    from google.cloud import compute_v1

    request = compute_v1.AggregatedListReservationsRequest(project=project, max_results=page_size)

    def call() -> list[Any]:
        return [
            item
            for _, scoped in client.aggregated_list(request=request, timeout=timeout_s)
            for item in scoped.reservations
        ]

    found = [compute_reservation(item) for item in api_call("compute reservations", call)]
    wanted = set(zones)
    return sorted(
        (h for h in found if h is not None and (not wanted or h.zone in wanted)),
        key=lambda h: h.name,
    )


def list_tpu(client: Any, parents: Sequence[str], page_size: int, timeout_s: float) -> list[Held]:
    """Every Cloud TPU reservation under `parents` (projects/P/locations/Z or .../-), by name."""
    from google.cloud import tpu_v2alpha1

    found: list[Held | None] = []
    for parent in parents:
        request = tpu_v2alpha1.ListReservationsRequest(parent=parent, page_size=page_size)

        def call(request: Any = request) -> list[Any]:
            return list(client.list_reservations(request=request, timeout=timeout_s))

        found += [tpu_reservation(item) for item in api_call("tpu reservations.list", call)]
    return sorted((h for h in found if h is not None), key=lambda h: h.name)


def reservations_client(endpoint: str) -> Any:
    """`google.cloud.compute_v1.ReservationsClient` (REST): the real API ("") or a stand-in
    (`http://host:port`, anonymous)."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import compute_v1

    if not endpoint:
        try:
            return compute_v1.ReservationsClient()
        except DefaultCredentialsError as exc:
            msg = NO_CREDENTIALS.format(
                api="The Compute Engine API (reservations)", role="roles/compute.viewer",
                setting="compute_endpoint", env="COMPUTE_ENDPOINT",
            )  # fmt: skip
            raise SourceError(msg) from exc
    from google.auth.credentials import AnonymousCredentials

    return compute_v1.ReservationsClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options={"api_endpoint": endpoint},
    )
