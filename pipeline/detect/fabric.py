"""The fabric detector: one state per GPU node, fed its network ports as node_exporter sees them.

Checks (entity fabric_port, device "mlx5_0:1", unless noted; severity, action, persistence and
settings: catalog.py, docs/checks.md). A port's trouble is the cable's or the switch's far more
often than the node's, so only a vanished NIC acts on the node; the rest are watched here and
localised to the element (link or switch) by fabric_localise.py:
  fabric.nic.missing (nic)    a known port gone from the scrape while the node reports: the NIC
                              fell off the bus or died (N1)
  fabric.port.down            IB state not ACTIVE, physical state not LinkUp, or netdev down
                              (F1: a cable or the leaf switch)
  fabric.port.flap            link_downed / carrier changes stepped: the first flapping
                              episode (F2); clears after a window quiet
  fabric.port.flap.persistent toggles in `fabric_flap_persist` scrapes within
                              `fabric_flap_window_s`: a persistent flapper (ByteRobust waits
                              for 2 alerts within 5 min)
  fabric.port.errors          symbol / receive / link-recovery errors at `fabric_errors_per_s`
                              for `fabric_error_samples` scrapes with the link up, no link-down:
                              silent gray loss (F3)
Pure: no I/O, no clock; time is the samples' event time.
"""

from __future__ import annotations

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect.episodes import CLEAR, OPEN, Run, clear_episode, open_episode, rule, step
from pipeline.detect.findings import Book, evidence, refresh
from pipeline.detect.stats import counter_delta
from pipeline.model import FabricPort, FabricSample, Finding

NIC_MISSING = "fabric.nic.missing"
PORT_DOWN = "fabric.port.down"
PORT_FLAP = "fabric.port.flap"
PORT_FLAP_PERSISTENT = "fabric.port.flap.persistent"
PORT_ERRORS = "fabric.port.errors"
# The checks fabric_localise.py turns into a link or switch verdict.
ELEMENT_CHECKS = frozenset({PORT_DOWN, PORT_FLAP_PERSISTENT, PORT_ERRORS})

STATE = "node_infiniband_state_id"  # 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE
PHYSICAL = "node_infiniband_physical_state_id"  # 2 Polling, 3 Disabled, 5 LinkUp
NET_UP = "node_network_up"
ACTIVE, LINK_UP = 4.0, 5.0
LINK_DOWNED = "node_infiniband_link_downed_total"
CARRIER = "node_network_carrier_changes_total"  # counts both edges of a toggle
ERROR_FIELDS = (
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_receive_errors_total",
    "node_infiniband_link_error_recovery_total",
    "node_network_receive_errs_total",
    "node_network_transmit_errs_total",
)
COUNTERS = (LINK_DOWNED, CARRIER, *ERROR_FIELDS)


class PortState(msgspec.Struct, kw_only=True, gc=False):
    """What the detector remembers of one port."""

    nic: str
    last_ts: int = 0
    counters: tuple[float | None, ...] = ()  # last raw values of COUNTERS
    absent: int = 0  # consecutive scrapes of the node without this port
    flaps: list[int] = []  # ts of recent scrapes in which the link toggled
    runs: dict[str, Run] = {}  # port down and error-rate stretches (episode engine)


class FabricNodeState(msgspec.Struct, kw_only=True):
    book: Book
    last_ts: int = 0
    dropped: int = 0
    ports: dict[str, PortState] = {}  # by FabricPort.key


def detect_fabric(
    state: FabricNodeState | None, sample: FabricSample, settings: DetectSettings
) -> tuple[FabricNodeState, list[Finding]]:
    """Feed one node_exporter scrape of one node's ports; returns the state and findings."""
    if state is None:
        state = FabricNodeState(
            book=Book(
                cluster=sample.cluster,
                kind="node",
                name=sample.node,
                pool=sample.pool,
                zone=sample.zone,
            )
        )
    if sample.ts <= state.last_ts:
        state.dropped += 1
        return state, []
    refresh(state.book, sample.cluster, sample.pool, sample.zone)
    state.last_ts = sample.ts
    out: list[Finding] = []
    seen = set()
    for port in sample.ports:
        seen.add(port.key)
        out += _port(state, port, sample.ts, settings)
    out += _absent(state, seen, sample.ts, settings)
    # No heartbeat here: the node's GPU detector already gives the health machine its clock.
    return state, out


def _port(
    state: FabricNodeState, port: FabricPort, ts: int, settings: DetectSettings
) -> list[Finding]:
    book, out = state.book, []
    ps = state.ports.get(port.key)
    if ps is None:
        ps = state.ports[port.key] = PortState(nic=port.device)
    if ps.absent:
        if ps.absent >= rule(settings, NIC_MISSING).open_after:
            out.append(clear_episode(book, NIC_MISSING, ts, port.device, f"NIC {port.device} back"))
        ps.absent = 0
    values = tuple(port.metrics.get(name) for name in COUNTERS)
    deltas = [
        counter_delta(last, value) if value is not None and last is not None else 0.0
        for last, value in zip(ps.counters or (None,) * len(COUNTERS), values, strict=True)
    ]
    dt_s = (ts - ps.last_ts) / 1000 if ps.last_ts else 0.0
    ps.counters, ps.last_ts = values, ts
    down = _is_down(port.metrics)
    out += _down(book, ps, port, ts, down, settings)
    # A toggle is a down-and-up between scrapes: link_downed steps on the way down, carrier
    # changes count both edges. A port down now is a down, not a flap.
    toggles = 0.0 if down else max(deltas[0], deltas[1] // 2)
    out += _flaps(book, ps, port, ts, toggles, settings)
    rate = sum(deltas[2:]) / dt_s if dt_s > 0 else 0.0
    out += _errors(book, ps, port, ts, rate, down or toggles > 0, settings)
    return [f for f in out if f is not None]


def _is_down(metrics: dict[str, float]) -> bool:
    state, physical, up = metrics.get(STATE), metrics.get(PHYSICAL), metrics.get(NET_UP)
    return (
        (state is not None and state != ACTIVE)
        or (physical is not None and physical != LINK_UP)
        or (up is not None and up == 0.0)
    )


def _down(
    book: Book, ps: PortState, port: FabricPort, ts: int, down: bool, settings: DetectSettings
) -> list[Finding | None]:
    edge = step(ps.runs, PORT_DOWN, ts, down, rule(settings, PORT_DOWN))
    if edge == CLEAR:
        return [clear_episode(book, PORT_DOWN, ts, port.key, f"port {port.key} up again")]
    if edge != OPEN:
        return []
    return [
        open_episode(
            book,
            PORT_DOWN,
            ts,
            device=port.key,
            evidence=evidence(
                STATE, port.metrics.get(STATE, port.metrics.get(NET_UP)), ACTIVE, None, 0
            ),
            message=f"port {port.key} of {book.name} is down (state "
            f"{port.metrics.get(STATE)}, physical {port.metrics.get(PHYSICAL)}, netdev up "
            f"{port.metrics.get(NET_UP)}): its cable or switch; localised by the fabric stage",
        )
    ]


def _flaps(
    book: Book,
    ps: PortState,
    port: FabricPort,
    ts: int,
    toggles: float,
    settings: DetectSettings,
) -> list[Finding | None]:
    window_ms = settings.fabric_flap_window_s * 1000
    if toggles > 0:
        ps.flaps.append(ts)
    ps.flaps = [t for t in ps.flaps if ts - t <= window_ms]
    out: list[Finding | None] = []
    if toggles > 0:
        out.append(
            open_episode(
                book,
                PORT_FLAP,
                ts,
                device=port.key,
                evidence=evidence(LINK_DOWNED, toggles, 0.0, None, settings.fabric_flap_window_s),
                message=f"port {port.key} of {book.name} went down and up ({toggles:.0f} "
                "toggles): first flapping episode, watched",
            )
        )
        persist = settings.tuned(PORT_FLAP_PERSISTENT).fabric_flap_persist
        if len(ps.flaps) >= persist:
            out.append(
                open_episode(
                    book,
                    PORT_FLAP_PERSISTENT,
                    ts,
                    device=port.key,
                    evidence=evidence(
                        "flapping_scrapes",
                        len(ps.flaps),
                        persist,
                        None,
                        settings.fabric_flap_window_s,
                    ),
                    message=f"port {port.key} of {book.name} keeps flapping: toggles in "
                    f"{len(ps.flaps)} scrapes within {settings.fabric_flap_window_s} s",
                )
            )
    elif not ps.flaps and book.open:  # no toggle for a whole window: the episode is over
        for check in (PORT_FLAP, PORT_FLAP_PERSISTENT):
            out.append(clear_episode(book, check, ts, port.key, f"port {port.key} stable again"))
    return out


def _errors(
    book: Book,
    ps: PortState,
    port: FabricPort,
    ts: int,
    rate: float,
    link_event: bool,
    settings: DetectSettings,
) -> list[Finding | None]:
    """Errors on a link that stays up: a failing optic or dirty connector. Errors counted while
    the link went down or toggled belong to that event, not to gray loss."""
    if link_event:
        return []
    limit = settings.tuned(PORT_ERRORS).fabric_errors_per_s
    bad = rate >= limit
    edge = step(ps.runs, PORT_ERRORS, ts, bad, rule(settings, PORT_ERRORS))
    if edge == CLEAR:
        return [clear_episode(book, PORT_ERRORS, ts, port.key, f"port {port.key} errors stopped")]
    if edge != OPEN:
        return []
    return [
        open_episode(
            book,
            PORT_ERRORS,
            ts,
            device=port.key,
            evidence=evidence("port_errors_per_s", rate, limit, None, 0),
            message=f"port {port.key} of {book.name}: {rate:.2f} symbol/receive/recovery "
            "errors per second with the link up: silent gray loss on its cable or optic",
        )
    ]


def _absent(
    state: FabricNodeState, seen: set[str], ts: int, settings: DetectSettings
) -> list[Finding]:
    out = []
    for key, ps in state.ports.items():
        if key in seen:
            continue
        ps.absent += 1
        if ps.absent != rule(settings, NIC_MISSING).open_after:
            continue
        finding = open_episode(
            state.book,
            NIC_MISSING,
            ts,
            device=ps.nic,
            evidence=evidence(
                "ports_reporting", len(seen), len(state.ports), None, 0
            ),
            message=f"NIC {ps.nic} (port {key}) of {state.book.name} gone from "
            f"{ps.absent} scrapes while the node reports: the NIC failed",
        )
        if finding is not None:
            out.append(finding)
    return out
