"""The ICI detector: one state per slice, fed every host's link counters.

Every ICI link is seen from both ends (chip a port p -> chip b, and chip b -> chip a), usually
by two different hosts. Faults are localised from the ends together (severity, action and
persistence of each check: catalog.py, docs/checks.md):
  ici.host.down (node)       every link into one host's chips is down, as the neighbours
                             report it (a dead host reports nothing)
  ici.chip.down (tpu_chip)   every link of one chip is down: the chip, not the cables
  ici.link.down (ici_link)   both ends report the link down, confirmed once after
                             `ici_link_persist_s` (so an OCS pattern can form first), or one
                             end for `ici_one_sided_s` while the other stays silent or healthy
  ici.ocs.degraded (slice)   `ici_ocs_min_links` links down in one torus dimension at once,
                             all leaving their 4x4x4 cube: an optical circuit switch; ICI
                             resiliency routes around it (a link inside a cube is copper: down,
                             it is a link of its own, OCS or not)
  ici.link.degraded (ici_link) health between 1 and 9, flit rate well below the link's usual
                             share of the host's traffic, or errors: resiliency at work
                             (watched, not a repair)
Health is libtpu's `ici_link_health` scale as observed: 0 healthy, 10 down.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.emit import Judgement, Said, emit, said
from pipeline.detect.episodes import OPEN, Run, rule
from pipeline.detect.findings import Book, evidence, refresh
from pipeline.detect.stats import alpha_for, counter_delta, median
from pipeline.model import Finding, IciLink, IciSample

LINK_DOWN = catalog.ICI_LINK_DOWN
LINK_DEGRADED = catalog.ICI_LINK_DEGRADED
CHIP_DOWN = catalog.ICI_CHIP_DOWN
HOST_DOWN = catalog.ICI_HOST_DOWN
OCS = catalog.ICI_OCS
CUBE_EDGE = 4  # chips along each edge of a cube (4x4x4, copper inside; OCS between cubes)


class LinkEnd(msgspec.Struct, kw_only=True, gc=False):
    """One end of a link as its chip's host reports it."""

    chip: int
    port: int
    peer: int
    host: str
    ts: int = 0
    health: int = 0
    tx: int | None = None
    rx: int | None = None
    errors: int | None = None
    share: float = 0.0  # EW mean of its flit rate / the host's median link rate ...
    shares: int = 0  # ... over this many samples
    down: bool = False
    degraded: str = ""  # why it is degraded ("" = it is not)


class IciSliceState(msgspec.Struct, kw_only=True):
    book: Book
    ends: dict[int, LinkEnd] = {}  # by end_key(chip, peer)
    hosts: dict[str, int] = {}  # last ts per reporting host
    peers_of: dict[int, list[int]] = {}  # chip -> every chip it has a link with
    chip_host: dict[int, str] = {}  # chip -> the host that reports its links
    unhealthy: list[int] = []  # keys of the ends that are down or degraded
    runs: dict[str, Run] = {}  # by verdict key
    dropped: int = 0


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """A check's verdict at this instant; severity, action and entity are the catalog's."""

    check: str
    device: str
    persist_ms: int
    metric: str
    value: float
    message: str


def detect_ici(
    state: IciSliceState | None, sample: IciSample, settings: DetectSettings
) -> tuple[IciSliceState, list[Finding]]:
    """Feed one host's ICI link counters; returns the new slice state and any findings."""
    if state is None:
        state = IciSliceState(book=Book.of(sample))
    last = state.hosts.get(sample.node, 0)
    if sample.ts <= last:
        state.dropped += 1
        return state, []
    state.hosts[sample.node] = sample.ts
    refresh(state.book, sample.cluster, sample.pool, sample.zone)
    _update_ends(state, sample, settings)
    if not state.unhealthy and not state.runs:
        return state, []
    return state, _judge(state, sample.ts, settings)


def end_key(chip: int, peer: int) -> int:
    """One int per directed link end (chip ids are below 2**20): cheaper than text keys."""
    return chip << 20 | peer


def _update_ends(state: IciSliceState, sample: IciSample, settings: DetectSettings) -> None:
    rates: list[tuple[LinkEnd, float]] = []
    unhealthy = state.unhealthy
    changed = False
    down_health = settings.ici_down_health
    for link in sample.links:
        key = link.chip_id << 20 | link.peer_chip_id
        end = state.ends.get(key)
        if end is None:
            end = state.ends[key] = _new_end(state, link, sample.node)
            state.chip_host[link.chip_id] = sample.node
        elif end.host != sample.node:
            end.host = state.chip_host[link.chip_id] = sample.node
        errors = 0.0
        if end.ts and sample.ts > end.ts:
            dt_s = (sample.ts - end.ts) / 1000
            flits = counter_delta(end.tx, link.flits_tx) + counter_delta(end.rx, link.flits_rx)
            rates.append((end, flits / dt_s))
            if link.errors is not None:
                errors = counter_delta(end.errors, link.errors) / dt_s
        end.ts, end.health = sample.ts, link.health
        end.tx, end.rx, end.errors = link.flits_tx, link.flits_rx, link.errors
        end.down = link.health >= down_health
        if link.health and not end.down:
            end.degraded = "ici_link_health"
        elif not end.down and errors >= settings.tuned(LINK_DEGRADED).ici_errors_per_s:
            end.degraded = "ici_errors_per_s"
        else:
            end.degraded = ""
        if end.down or end.degraded:
            if key not in unhealthy:
                unhealthy.append(key)
                changed = True
        elif unhealthy and key in unhealthy:
            unhealthy.remove(key)
    _judge_shares(rates, settings)
    for end, _ in rates:
        if end.degraded == "flit_share":
            key = end_key(end.chip, end.peer)
            if key not in unhealthy:
                unhealthy.append(key)
                changed = True
    if changed:
        unhealthy.sort()


def _new_end(state: IciSliceState, link: IciLink, node: str) -> LinkEnd:
    for a, b in ((link.chip_id, link.peer_chip_id), (link.peer_chip_id, link.chip_id)):
        peers = state.peers_of.setdefault(a, [])
        if b not in peers:
            peers.append(b)
    return LinkEnd(chip=link.chip_id, port=link.port, peer=link.peer_chip_id, host=node)


def _judge_shares(rates: list[tuple[LinkEnd, float]], settings: DetectSettings) -> None:
    """A link carrying far less than its usual share of the host's ICI traffic is degraded
    (traffic moves with the job, so the share, not the rate, is what stays put). The usual
    share is a plain EW mean, learned slowly while the link looks low or is down."""
    positive = [rate for _, rate in rates if rate > 0]
    if len(positive) < settings.peer_min:
        return
    host_median = median(positive)
    alpha = alpha_for(settings.half_life_samples)
    warmup, keep = settings.warmup_samples, 1 - settings.tuned(LINK_DEGRADED).ici_flit_drop_frac
    for end, rate in rates:
        share = rate / host_median
        n = end.shares = end.shares + 1
        low = not end.down and n > warmup and share <= end.share * keep
        if n == 1:
            end.share = share
        else:
            a = 1.0 / n if n * alpha < 1.0 else alpha
            if low or end.down:
                a *= settings.anomaly_adapt
            end.share += a * (share - end.share)
        if low and not end.degraded:
            end.degraded = "flit_share"


def _judge(state: IciSliceState, ts: int, settings: DetectSettings) -> list[Finding]:
    verdicts = _localise(state, ts, settings)
    out: list[Finding] = []
    for key in sorted(set(verdicts) | set(state.runs)):
        verdict = verdicts.get(key)
        check = key.partition("|")[0]
        if verdict is None:  # a run on its way back to good
            judged = Judgement(check, None, False, said(f"{check} resolved"), key=key)
        else:
            # the open limit is the verdict's (a link down at one end waits longer than at
            # both), the clear limit the check's
            judged = Judgement(check, verdict.device, True, _said(verdict), key=key,
                               open_ms=verdict.persist_ms)  # fmt: skip
        emit(state.book, state.runs, ts, judged, settings, out)
    return out


def _said(verdict: Verdict) -> Callable[[int], Said]:
    def say(edge: int) -> Said:
        if edge != OPEN:
            return f"{verdict.check} resolved", None
        proof = evidence(verdict.metric, verdict.value, 0.0, None, verdict.persist_ms / 1000)
        return verdict.message, proof

    return say


def _localise(state: IciSliceState, ts: int, settings: DetectSettings) -> dict[str, Verdict]:
    fresh_after = ts - 2 * settings.node_stale_s * 1000
    ends = [state.ends[k] for k in state.unhealthy if state.ends[k].ts > fresh_after]
    down = [end for end in ends if end.down]
    verdicts: dict[str, Verdict] = {}
    dead_hosts = _dead_hosts(state, down, fresh_after)
    for host, count in dead_hosts.items():
        verdicts[f"{HOST_DOWN}|{host}"] = Verdict(
            check=HOST_DOWN,
            device=host,
            persist_ms=rule(settings, HOST_DOWN).open_after,
            metric="ici_links_down",
            value=count,
            message=f"all {count} ICI links into host {host} are down, as its neighbours see "
            "them: the host (machine) failed",
        )
    if dead_hosts:  # their links are explained; what is left is judged on its own
        down = [e for e in down if state.chip_host.get(e.peer) not in dead_hosts]
        down = [e for e in down if e.host not in dead_hosts]
    dead_chips = _dead_chips(state, down)
    for chip in dead_chips:
        verdicts[f"{CHIP_DOWN}|{chip}"] = Verdict(
            check=CHIP_DOWN,
            device=str(chip),
            persist_ms=rule(settings, CHIP_DOWN).open_after,
            metric="ici_links_down",
            value=len(state.peers_of.get(chip, [])),
            message=f"every ICI link of chip {chip} is down: the chip, not its cables",
        )
    links = _down_links(state, down, dead_chips, fresh_after, settings)
    by_dimension: dict[int, list[str]] = {}
    strides = _strides(state) if len(links) >= settings.tuned(OCS).ici_ocs_min_links else {}
    for key, verdict in links.items():
        end_chip, port = (int(part) for part in verdict.device.split(":"))
        dimension = port // 2
        if _crosses_cube_face(end_chip, port, strides.get(dimension)):
            by_dimension.setdefault(dimension, []).append(key)
    for dimension, keys in by_dimension.items():
        if len(keys) >= settings.tuned(OCS).ici_ocs_min_links:
            verdicts[f"{OCS}|dim{dimension}"] = Verdict(
                check=OCS,
                device=f"dim{dimension}",
                persist_ms=rule(settings, OCS).open_after,
                metric="ici_links_down",
                value=len(keys),
                message=f"{len(keys)} ICI links down in dimension {dimension} at once: an "
                "optical circuit switch; ICI resiliency routes around it (slower steps)",
            )
            for key in keys:
                del links[key]
    verdicts.update(links)
    for end in ends:
        if end.degraded and not end.down:
            verdicts[f"{LINK_DEGRADED}|{end.chip}:{end.port}"] = Verdict(
                check=LINK_DEGRADED,
                device=f"{end.chip}:{end.port}",
                persist_ms=rule(settings, LINK_DEGRADED).open_after,
                metric=end.degraded,
                value=end.health,
                message=f"ICI link chip {end.chip} port {end.port} -> chip {end.peer} degraded "
                f"({end.degraded}, health {end.health}): resiliency at work, watch",
            )
    return verdicts


def _strides(state: IciSliceState) -> dict[int, int]:
    """How far chip ids step per coordinate in each torus dimension (ids are row-major in the
    slice topology): the smallest id gap of the links of that dimension seen so far. (The
    wraparound links have the larger gaps.) Inferred from the links themselves because the ICI
    counters carry no topology."""
    strides: dict[int, int] = {}
    for end in state.ends.values():
        gap = abs(end.peer - end.chip)
        dimension = end.port // 2
        if gap and gap < strides.get(dimension, 1 << 30):
            strides[dimension] = gap
    return strides


def _crosses_cube_face(chip: int, port: int, stride: int | None) -> bool:
    """Does this link leave its chip's 4x4x4 cube? Only those go through an optical circuit
    switch; the links inside a cube are copper, and one of them down is a cable of its own even
    while an OCS is out (ports 2d and 2d+1 step -1 and +1 along dimension d). A slice whose
    strides are not known yet counts every link, as before there was this rule."""
    if stride is None:
        return True
    coordinate = (chip // stride) % CUBE_EDGE
    return coordinate == (CUBE_EDGE - 1 if port % 2 else 0)


def _dead_hosts(state: IciSliceState, down: list[LinkEnd], fresh_after: int) -> dict[str, int]:
    """Hosts every fresh link into which, as the chips outside see it, is down, while the host
    itself reports none of those links down (a dead host reports nothing; a live one that sees
    its links go dark has a cable or OCS problem, judged link by link)."""
    suspects = {state.chip_host.get(end.peer) for end in down} - {None}
    if not suspects:
        return {}
    into: dict[str, list[bool]] = {}
    sees_it: set[str] = set()
    for end in state.ends.values():
        if end.ts <= fresh_after:
            continue
        target = state.chip_host.get(end.peer)
        if target is not None and target in suspects and target != end.host:
            into.setdefault(target, []).append(end.down)
        elif end.host in suspects and end.down and target != end.host:
            sees_it.add(end.host)
    return {
        host: len(states)
        for host, states in into.items()
        if len(states) >= 2 and all(states) and host not in sees_it
    }


def _dead_chips(state: IciSliceState, down: list[LinkEnd]) -> set[int]:
    """Chips all of whose links are down, as seen from either end."""
    cut: dict[int, set[int]] = {}
    for end in down:
        cut.setdefault(end.chip, set()).add(end.peer)
        cut.setdefault(end.peer, set()).add(end.chip)
    return {
        chip
        for chip, peers in cut.items()
        if len(peers) >= 2 and len(peers) >= len(state.peers_of.get(chip, ()))
    }


def _down_links(
    state: IciSliceState,
    down: list[LinkEnd],
    dead_chips: set[int],
    fresh_after: int,
    settings: DetectSettings,
) -> dict[str, Verdict]:
    links: dict[str, Verdict] = {}
    for end in down:
        if end.chip in dead_chips or end.peer in dead_chips:
            continue  # explained by the chip
        low, high = sorted((end.chip, end.peer))
        key = f"{LINK_DOWN}|{low}-{high}"
        other = state.ends.get(end_key(end.peer, end.chip))
        both = other is not None and other.ts > fresh_after and other.down
        named = end if end.chip == low or other is None else other
        verdict = links.get(key)
        if verdict is not None and verdict.persist_ms == 0:
            continue
        links[key] = Verdict(
            check=LINK_DOWN,
            device=f"{named.chip}:{named.port}",
            persist_ms=rule(settings, LINK_DOWN).open_after
            if both
            else settings.tuned(LINK_DOWN).ici_one_sided_s * 1000,
            metric="ici_link_health",
            value=end.health,
            message=f"ICI link chip {low} <-> chip {high} down "
            + ("at both ends" if both else f"as seen from chip {end.chip} only"),
        )
    return links
