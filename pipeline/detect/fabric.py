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
from pipeline.detect import catalog
from pipeline.detect.emit import Judgement, Said, emit, said
from pipeline.detect.episodes import OPEN, Run, rule
from pipeline.detect.findings import Book, evidence, refresh
from pipeline.detect.stats import counter_delta
from pipeline.model import FabricPort, FabricSample, Finding

NIC_MISSING = catalog.FABRIC_NIC_MISSING
PORT_DOWN = catalog.FABRIC_PORT_DOWN
PORT_FLAP = catalog.FABRIC_PORT_FLAP
PORT_FLAP_PERSISTENT = catalog.FABRIC_PORT_FLAP_PERSISTENT
PORT_ERRORS = catalog.FABRIC_PORT_ERRORS
# The checks fabric_localise.py turns into a link or switch verdict.
ELEMENT_CHECKS = frozenset({PORT_DOWN, PORT_FLAP_PERSISTENT, PORT_ERRORS})

STATE = "node_infiniband_state_id"  # 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE
PHYSICAL = "node_infiniband_physical_state_id"  # 2 Polling, 3 Disabled, 5 LinkUp
NET_UP = "node_network_up"
ACTIVE, LINK_UP = 4.0, 5.0
LINK_DOWNED = "node_infiniband_link_downed_total"
CARRIER = "node_network_carrier_changes_total"  # counts both edges of a toggle
# node_exporter's names (its infiniband collector): receive errors are port_errors_received.
ERROR_FIELDS = (
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_link_error_recovery_total",
    "node_network_receive_errs_total",
    "node_network_transmit_errs_total",
)
COUNTERS = (LINK_DOWNED, CARRIER, *ERROR_FIELDS)
# The spelling the simulator used before it followed node_exporter: recordings still carry it.
OLD_NAMES = {
    "node_infiniband_port_errors_received_total": "node_infiniband_port_receive_errors_total",
}


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
    book, out = state.book, list[Finding]()
    ps = state.ports.get(port.key)
    if ps is None:
        ps = state.ports[port.key] = PortState(nic=port.device)
    judged = []
    if ps.absent:
        judged.append(Judgement(NIC_MISSING, port.device, False, said(f"NIC {port.device} back")))
        ps.absent = 0
    values = _counters(port)
    deltas = [
        counter_delta(last, value) if value is not None and last is not None else 0.0
        for last, value in zip(ps.counters or (None,) * len(COUNTERS), values, strict=True)
    ]
    dt_s = (ts - ps.last_ts) / 1000 if ps.last_ts else 0.0
    ps.counters, ps.last_ts = values, ts
    down = _is_down(port.metrics)
    judged.append(_down(book, port, down))
    # A toggle is a down-and-up between scrapes: link_downed steps on the way down, carrier
    # changes count both edges. A port down now is a down, not a flap.
    toggles = 0.0 if down else max(deltas[0], deltas[1] // 2)
    judged += _flaps(book, ps, port, ts, toggles, settings)
    rate = sum(deltas[2:]) / dt_s if dt_s > 0 else 0.0
    if not (down or toggles > 0):
        # errors counted while the link went down or toggled belong to that event
        judged.append(_errors(book, port, rate, settings))
    for one in judged:
        emit(book, ps.runs, ts, one, settings, out)
    return out


def _counters(port: FabricPort) -> tuple[float | None, ...]:
    """The raw COUNTERS of a sample; a counter stuck at its hardware maximum is unknown (None),
    so no delta is read across it — not a reset, not a burst — now or at the next sample."""
    saturated = set(port.saturated)
    values: list[float | None] = []
    for name in COUNTERS:
        old = OLD_NAMES.get(name, "")
        if name in saturated or old in saturated:
            values.append(None)
        else:
            values.append(port.metrics.get(name, port.metrics.get(old)))
    return tuple(values)


def _is_down(metrics: dict[str, float]) -> bool:
    state, physical, up = metrics.get(STATE), metrics.get(PHYSICAL), metrics.get(NET_UP)
    return (
        (state is not None and state != ACTIVE)
        or (physical is not None and physical != LINK_UP)
        or (up is not None and up == 0.0)
    )


def _down(book: Book, port: FabricPort, down: bool) -> Judgement:
    def say(edge: int) -> Said:
        if edge != OPEN:
            return f"port {port.key} up again", None
        metrics = port.metrics
        return (
            f"port {port.key} of {book.name} is down (state {metrics.get(STATE)}, physical "
            f"{metrics.get(PHYSICAL)}, netdev up {metrics.get(NET_UP)}): its cable or switch; "
            "localised by the fabric stage",
            evidence(STATE, metrics.get(STATE, metrics.get(NET_UP)), ACTIVE, None, 0),
        )

    return Judgement(PORT_DOWN, port.key, down, say)


def _flaps(
    book: Book,
    ps: PortState,
    port: FabricPort,
    ts: int,
    toggles: float,
    settings: DetectSettings,
) -> list[Judgement]:
    window_ms = settings.fabric_flap_window_s * 1000
    if toggles > 0:
        ps.flaps.append(ts)
    ps.flaps = [t for t in ps.flaps if ts - t <= window_ms]
    if toggles > 0:
        first = said(
            f"port {port.key} of {book.name} went down and up ({toggles:.0f} toggles): first "
            "flapping episode, watched",
            evidence(LINK_DOWNED, toggles, 0.0, None, settings.fabric_flap_window_s),
        )
        judged = [Judgement(PORT_FLAP, port.key, True, first)]
        persist = settings.tuned(PORT_FLAP_PERSISTENT).fabric_flap_persist
        if len(ps.flaps) >= persist:
            again = said(
                f"port {port.key} of {book.name} keeps flapping: toggles in {len(ps.flaps)} "
                f"scrapes within {settings.fabric_flap_window_s} s",
                evidence("flapping_scrapes", len(ps.flaps), persist, None,
                         settings.fabric_flap_window_s),
            )  # fmt: skip
            judged.append(Judgement(PORT_FLAP_PERSISTENT, port.key, True, again))
        return judged
    if not ps.flaps and book.open:  # no toggle for a whole window: the episode is over
        stable = said(f"port {port.key} stable again")
        return [Judgement(check, port.key, False, stable) for check in (PORT_FLAP,
                                                                        PORT_FLAP_PERSISTENT)]
    return []


def _errors(book: Book, port: FabricPort, rate: float, settings: DetectSettings) -> Judgement:
    """Errors on a link that stays up: a failing optic or dirty connector."""
    limit = settings.tuned(PORT_ERRORS).fabric_errors_per_s

    def say(edge: int) -> Said:
        if edge != OPEN:
            return f"port {port.key} errors stopped", None
        return (
            f"port {port.key} of {book.name}: {rate:.2f} symbol/receive/recovery errors per "
            "second with the link up: silent gray loss on its cable or optic",
            evidence("port_errors_per_s", rate, limit, None, 0),
        )

    return Judgement(PORT_ERRORS, port.key, rate >= limit, say)


def _absent(
    state: FabricNodeState, seen: set[str], ts: int, settings: DetectSettings
) -> list[Finding]:
    out: list[Finding] = []
    missing = rule(settings, NIC_MISSING).open_after
    for key, ps in state.ports.items():
        if key in seen:
            continue
        ps.absent += 1
        if ps.absent != missing:
            continue  # the absence count is the check's window (catalog)
        gone = said(
            f"NIC {ps.nic} (port {key}) of {state.book.name} gone from {ps.absent} scrapes while "
            "the node reports: the NIC failed",
            evidence("ports_reporting", len(seen), len(state.ports), None, 0),
        )
        emit(state.book, ps.runs, ts, Judgement(NIC_MISSING, ps.nic, True, gone), settings, out)
    return out
