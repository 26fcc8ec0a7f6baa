"""XID rules: the catalog decides; bursts are one episode; application XIDs need recurrence.

- A burst of the same XID on the same GPU is one episode (a new one only after
  `xid_dedupe_s` of silence, as NVIDIA's own dedupe does); one node once logged ~800K XID-95
  lines with 29 distinct events.
- A record the source coalesced (`count` lines of one GPU, Xid and process from `ts` to
  `last_ts`, within `sources.xid_coalesce_s`) is those lines: its lines fall within one
  episode, so it is at most one episode and one strike, as the lines one by one would be
  (strikes are crashes, not lines: a storm of repeats within seconds is one crash); its count
  goes to the episode's count, and the episode runs to its last line.
- Fatal XIDs open a finding at once with the catalog's severity and action (`xid.<code>`),
  unless the line itself says the error was non-fatal (NVLink "non-fatal error detected"):
  then `xid.<code>.nonfatal`, warning, watch.
- Application XIDs (13, 31, 43, 45 ...) never open a finding by themselves: one strike is what
  a bug in the job looks like. The GPU is watched once struck `app_xid_watch_strikes` times
  (`xid.app_repeat`: the recurrence has begun), and blamed only when hit in
  `app_xid_min_jobs` distinct jobs, or struck `app_xid_min_strikes` separate times by
  whatever jobs, within `app_xid_window_s` (`xid.app_recurrence`, reset_gpu). A strike is
  a run of hits no more than `xid_dedupe_s` apart (13, 43, 45 of one crash are one strike).
  The same job restarted on the same GPU is what a bad GPU under a long training job looks
  like; a bug tied to a rank can follow it there too, so one job's repeats need one strike
  more than distinct jobs do. Strikes are judged one by one: a strike in which the job also
  hit another GPU of the node is its own bug (it moves with the job) and counts against none
  of them. A job's strikes on one GPU alone count against it only while at least two in three
  of the job's lone strikes on the node are there: a bug that moves between ranks spreads
  them, a bad GPU gathers them. So neither a job's earlier job-wide crash nor a stray strike
  elsewhere hides a GPU that keeps striking alone under it. Lines whose job is
  not known (no pod for the process) count as one unknown job: their strikes count, but never
  as a distinct job, and not when they hit several GPUs.
- XID 154 opens a fatal finding with the action the driver asks for (its new recovery
  action: reset, reboot, drain); a change back to 0 clears it.
- Other catalogued XIDs open a finding with the catalog's severity and action when the
  catalog asks for one (unknown codes: warning, watch).
- A finding clears after `xid_clear_s` without a repeat; the runtime calls `expire_xid` as
  event time advances (and every new event expires first). A clear means the burst ended,
  not that the GPU was repaired: repairs are the health machine's business.
- A repair of the node (a `repaired` or `created` node event: GPU reset or replaced, node
  rebuilt) ends the application-XID history: strikes before it no longer count, and the
  watch and blame they opened clear at the next expiry (`note_repair`). Otherwise a blame
  from before the repair stays open through the probation that follows it, and the health
  machine takes the repair for failed and repairs again.
"""

from __future__ import annotations

import bisect
import re

import msgspec

from pipeline.catalog import xid_info
from pipeline.catalog.xid import Action, XidEntry
from pipeline.config import DetectSettings
from pipeline.detect import catalog
from pipeline.detect.catalog import xid_check
from pipeline.detect.emit import Judgement, emit, said
from pipeline.detect.findings import Book, evidence, refresh
from pipeline.detect.gpu_metrics import recovery
from pipeline.model import Finding, RecommendedAction, XidEvent

APP_RECURRENCE = catalog.XID_APP_RECURRENCE
APP_REPEAT = catalog.XID_APP_REPEAT
APP_CHECKS = (APP_REPEAT, APP_RECURRENCE)
UNKNOWN_JOB = ""  # the job of an application XID whose process has no known pod
RECOVERY_XID = 154
# "GPU recovery action changed from 0x0 (None) to 0x1 (Reset Required)"
_RECOVERY_TO = re.compile(r"\bto 0x([0-9a-fA-F]+)")
_NON_FATAL = re.compile(r"\bnon-fatal\b", re.IGNORECASE)
# FleetPulse actions on a node; restarting the application is the job owner's business.
_ACTIONS: dict[Action, RecommendedAction] = {
    "none": "none",
    "watch": "watch",
    "restart_app": "watch",
    "reset_gpu": "reset_gpu",
    "reboot": "reboot",
    "replace": "replace",
}


class XidEpisode(msgspec.Struct, kw_only=True, gc=False):
    device: str
    code: int
    start_ts: int
    last_ts: int
    count: int = 1


class AppHit(msgspec.Struct, array_like=True, gc=False):
    """An application-XID episode: which job, which GPU, when."""

    job: str
    device: str
    code: int
    ts: int


class XidState(msgspec.Struct, kw_only=True):
    book: Book
    episodes: dict[str, XidEpisode] = {}  # by "device|code"
    app_hits: list[AppHit] = []  # application-XID episodes within the recurrence window
    repaired_ts: int = 0  # the node's last repair: application XIDs before it no longer count
    dropped: int = 0  # duplicate or out-of-order events inside an episode


def detect_xid(
    state: XidState | None, event: XidEvent, settings: DetectSettings
) -> tuple[XidState, list[Finding]]:
    """Feed one XID event of one node; returns the new state and any findings."""
    if state is None:
        state = XidState(book=Book.of(event))
    refresh(state.book, event.cluster, event.pool, event.zone)
    state, out = expire_xid(state, event.ts, settings)
    device = str(event.gpu_index) if event.gpu_index is not None else event.pci_bus_id
    key = f"{device}|{event.xid}"
    episode = state.episodes.get(key)
    end = event.end_ts  # a coalesced record: its lines run from ts to last_ts
    if episode is not None:
        if end <= episode.last_ts:
            state.dropped += 1  # replayed or late: already part of this episode
            return state, out
        if event.ts - episode.last_ts <= settings.xid_dedupe_s * 1000:
            episode.last_ts = end
            episode.count += event.count
            return state, out
    state.episodes[key] = XidEpisode(
        device=device, code=event.xid, start_ts=event.ts, last_ts=end, count=event.count
    )
    entry = xid_info(event.xid)
    if event.xid == RECOVERY_XID:
        judged = _recovery_changed(event, device)
    elif entry.application:
        judged = _application(state, event, device, settings)
    else:
        judged = _catalogued(event, device, entry)
    if judged is not None:
        emit(state.book, {}, event.ts, judged, settings, out)
    return state, out


def what_rules_read(event: XidEvent) -> str:
    """What the rules read in a line's text besides its code: an Xid 154's new recovery action,
    whether the driver says the error was non-fatal. Lines of one GPU, Xid and process that
    agree on it are alike to every rule here (the XID source counts them as one record)."""
    if event.xid == RECOVERY_XID:
        match = _RECOVERY_TO.search(event.message)
        return match.group(1).lower() if match else ""
    return "non-fatal" if _NON_FATAL.search(event.message) else ""


def note_repair(state: XidState, ts: int) -> XidState:
    """The node was repaired at `ts`: its earlier application-XID strikes are forgotten (and
    the checks they opened clear at the next `expire_xid`)."""
    state.repaired_ts = max(state.repaired_ts, ts)
    return state


def expire_xid(
    state: XidState, now_ms: int, settings: DetectSettings
) -> tuple[XidState, list[Finding]]:
    """Close episodes silent for `xid_clear_s` and recurrences that fell out of the window."""
    out: list[Finding] = []
    clear_ms = settings.xid_clear_s * 1000
    for key in [k for k, e in state.episodes.items() if now_ms - e.last_ts >= clear_ms]:
        episode = state.episodes.pop(key)
        quiet = said(
            f"XID {episode.code} on GPU {episode.device}: quiet after {episode.count} events"
        )
        for nonfatal in (False, True):
            check = xid_check(episode.code, nonfatal)
            emit(state.book, {}, now_ms, Judgement(check, episode.device, False, quiet), settings,
                 out)  # fmt: skip
    window_ms = settings.tuned(APP_RECURRENCE).app_xid_window_s * 1000
    since = max(now_ms - window_ms, state.repaired_ts)  # hits before this no longer count
    if state.app_hits and state.app_hits[0].ts < since:
        state.app_hits = [hit for hit in state.app_hits if hit.ts >= since]
        alone = _strikes_alone(state.app_hits, settings.xid_dedupe_s * 1000)  # once, for all
        for opened in [e for e in state.book.open.values() if e.check in APP_CHECKS]:
            device = opened.device or ""
            jobs, strikes = _recurrence(alone, device)
            if opened.check == APP_RECURRENCE and _recurs(jobs, strikes, settings):
                continue
            if opened.check == APP_REPEAT and _repeats(strikes, settings):
                continue
            gone = said(
                f"GPU {device}: application XIDs no longer recur"
                + (" (the node was repaired)" if state.repaired_ts > now_ms - window_ms else "")
            )
            emit(state.book, {}, now_ms, Judgement(opened.check, device, False, gone), settings,
                 out)  # fmt: skip
    return state, out


def _recovery_changed(event: XidEvent, device: str) -> Judgement | None:
    """XID 154 carries the driver's new recovery action: a reset or reboot it asks for is a
    hard verdict on the GPU (no application bug makes the driver ask for a reset)."""
    match = _RECOVERY_TO.search(event.message)
    if match is None:
        return None
    code = int(match.group(1), 16)
    check = xid_check(RECOVERY_XID)
    if code == 0:
        return Judgement(check, device, False, said(f"GPU {device}: recovered"))
    name, action = recovery(code)
    asks = said(
        f"XID 154 on GPU {device} ({event.pci_bus_id}): the driver asks for {name}",
        evidence("recovery_action", code, 0, None, 0),
    )
    return Judgement(check, device, True, asks, action=action)


def _catalogued(event: XidEvent, device: str, entry: XidEntry) -> Judgement | None:
    action = _ACTIONS[entry.action]
    if action == "none" and entry.severity == "info":
        return None  # e.g. corrected C2C errors: logged by the lake, not a finding
    proof = evidence("xid", event.xid, None, None, 0)
    if entry.fatal and _NON_FATAL.search(event.message):
        # The driver itself says this one was corrected (NVLink "non-fatal error detected"):
        # the link retried and the job survived. Watch it; a real fatal line still acts.
        corrected = said(
            f"XID {event.xid} {entry.mnemonic} on GPU {device}, reported non-fatal", proof
        )
        return Judgement(xid_check(event.xid, nonfatal=True), device, True, corrected)
    line = said(
        f"XID {event.xid} {entry.mnemonic} on GPU {device} ({event.pci_bus_id})", proof
    )
    return Judgement(xid_check(event.xid), device, True, line, action=action,
                     severity=entry.severity, fatal=entry.fatal)  # fmt: skip


def _application(
    state: XidState, event: XidEvent, device: str, settings: DetectSettings
) -> Judgement | None:
    if event.ts < state.repaired_ts:
        return None  # a line from before the repair, read late: its strike no longer counts
    # Unknown: at worst one job, the most cautious reading (`_recurs` never counts it as a
    # distinct job, only its strikes)
    state.app_hits.append(AppHit(event.job or UNKNOWN_JOB, device, event.xid, event.ts))
    alone = _strikes_alone(state.app_hits, settings.xid_dedupe_s * 1000)
    jobs, strikes = _recurrence(alone, device)
    codes = sorted({hit.code for hit in state.app_hits if hit.device == device})
    struck = (
        f"GPU {device}: application XIDs {codes} struck {strikes} times in {len(jobs)} job(s) "
        f"({', '.join(sorted(j or 'unknown' for j in jobs))}), no other GPU of the node"
    )
    if _recurs(jobs, strikes, settings):
        own = settings.tuned(APP_RECURRENCE)
        return _struck(APP_RECURRENCE, device, (strikes, own.app_xid_min_strikes),
                       own.app_xid_window_s, f"{struck}: the GPU, not the code")  # fmt: skip
    if _repeats(strikes, settings):
        watch = settings.tuned(APP_REPEAT)
        return _struck(APP_REPEAT, device, (strikes, watch.app_xid_watch_strikes),
                       watch.app_xid_window_s,
                       f"{struck}: watched; more strikes or jobs would blame the GPU")  # fmt: skip
    return None


def _struck(
    check: str, device: str, strikes: tuple[int, int], window_s: int, message: str
) -> Judgement:
    """`check` on the GPU for its application-XID strikes ((count, the check's limit))."""
    return Judgement(check, device, True, said(message, evidence("strikes", *strikes, None,
                                                                 window_s)))  # fmt: skip


def _recurrence(alone: dict[str, list[set[str]]], device: str) -> tuple[set[str], int]:
    """The jobs whose strikes count against `device`, and how many strikes count, from every
    GPU's lone strikes (`_strikes_alone`): those on this GPU alone, by jobs with two in three
    of their lone strikes here (module docstring)."""
    here: dict[str, int] = {}
    elsewhere: dict[str, int] = {}
    for d, strikes in alone.items():
        tally = here if d == device else elsewhere
        for jobs in strikes:
            for job in jobs:
                tally[job] = tally.get(job, 0) + 1
    gathered = {job for job, n in here.items() if n >= 2 * elsewhere.get(job, 0)}
    counted = [jobs for jobs in alone.get(device, []) if jobs & gathered]
    return set().union(*counted) & gathered, len(counted)


def _strikes_alone(hits: list[AppHit], gap_ms: int) -> dict[str, list[set[str]]]:
    """Per GPU, the jobs of each of its strikes (runs of hits no more than `gap_ms` apart)
    in which no job also hit another GPU of the node."""
    ordered = sorted(hits, key=lambda h: h.ts)
    by_device: dict[str, list[AppHit]] = {}
    by_job: dict[str, list[tuple[int, str]]] = {}  # (ts, device), in time order
    for hit in ordered:
        by_device.setdefault(hit.device, []).append(hit)
        by_job.setdefault(hit.job, []).append((hit.ts, hit.device))
    out: dict[str, list[set[str]]] = {}
    for device, own in by_device.items():
        runs: list[list[AppHit]] = []
        for hit in own:
            if runs and hit.ts - runs[-1][-1].ts <= gap_ms:
                runs[-1].append(hit)
            else:
                runs.append([hit])
        out[device] = [
            {hit.job for hit in run} for run in runs if not _job_wide(run, by_job, gap_ms)
        ]
    return out


def _job_wide(run: list[AppHit], by_job: dict[str, list[tuple[int, str]]], gap_ms: int) -> bool:
    """Whether a job of this strike also hit another GPU of the node during it (a binary
    search per job: a storm of lines keeps the window's hits many)."""
    device = run[0].device
    start, end = run[0].ts - gap_ms, run[-1].ts + gap_ms
    for job in {hit.job for hit in run}:
        times = by_job[job]
        at = bisect.bisect_left(times, (start, ""))
        while at < len(times) and times[at][0] <= end:
            if times[at][1] != device:
                return True
            at += 1
    return False


def _recurs(jobs: set[str], strikes: int, settings: DetectSettings) -> bool:
    own = settings.tuned(APP_RECURRENCE)
    known = len(jobs - {UNKNOWN_JOB})
    return known >= own.app_xid_min_jobs or strikes >= own.app_xid_min_strikes


def _repeats(strikes: int, settings: DetectSettings) -> bool:
    return strikes >= settings.tuned(APP_REPEAT).app_xid_watch_strikes


