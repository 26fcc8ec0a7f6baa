"""XID rules: catalog severity and action, burst dedupe, application-XID recurrence across jobs,
the recovery action of XID 154, expiry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import DetectSettings
from pipeline.detect import XidState, detect_xid, expire_xid, note_repair
from pipeline.detect.xid import AppHit, _strikes_alone
from pipeline.model import Finding, XidEvent
from tests.detect_fixture import SETTINGS, T0, checks, unhealthy, xid


def feed(events: list[XidEvent], state: XidState | None = None) -> tuple[XidState, list[Finding]]:
    found: list[Finding] = []
    for event in events:
        state, out = detect_xid(state, event, SETTINGS)
        found += out
    assert state is not None
    return state, found


@pytest.mark.parametrize(
    ("code", "action", "fatal"),
    [
        (79, "reboot", True),
        (48, "reset_gpu", True),
        (95, "reset_gpu", True),
        (119, "reset_gpu", True),
        (54, "replace", True),
        (63, "watch", False),
        (92, "watch", False),
        (8, "watch", False),
        (99_999, "watch", False),
    ],
)
def test_catalogued_xid_acts_with_the_catalog_action(code: int, action: str, fatal: bool) -> None:
    _, found = feed([xid(code, 10, gpu=3)])
    (finding,) = found
    assert (finding.check, finding.entity.device) == (f"xid.{code}", "3")
    assert (finding.recommended_action, finding.fatal) == (action, fatal)
    assert finding.severity == ("critical" if fatal else "warning")
    assert finding.entity.target.name == "n1" and finding.entity.target.kind == "node"


def test_info_xid_without_action_is_no_finding() -> None:
    assert feed([xid(121, 10)])[1] == []  # corrected C2C errors


def test_burst_is_one_episode_and_a_replay_is_dropped() -> None:
    events = [xid(95, 10 + i) for i in range(50)]  # 50 lines in 50 s
    state, found = feed([*events, xid(95, 30)])  # plus a late duplicate
    assert len(found) == 1
    assert state.dropped == 1
    assert state.episodes["0|95"].count == 50


def test_episode_clears_after_silence_and_a_new_burst_has_a_new_id() -> None:
    state, first = feed([xid(79, 10), xid(79, 20)])
    state, cleared = expire_xid(state, T0 + 20_000 + SETTINGS.xid_clear_s * 1000, SETTINGS)
    assert checks(cleared) == [("xid.79", "0", True)]
    _, second = feed([xid(79, 5000)], state)
    assert first[0].finding_id != second[0].finding_id != cleared[0].finding_id


def test_expire_does_nothing_before_the_silence_is_long_enough() -> None:
    state, _ = feed([xid(79, 10)])
    assert expire_xid(state, T0 + 10_000 + SETTINGS.xid_clear_s * 1000 - 1, SETTINGS)[1] == []


def test_non_fatal_nvlink_line_is_watched_a_fatal_one_acts() -> None:
    soft = xid(
        74,
        10,
        message="NVRM: Xid (PCI:0000:10:00): 74, NVLink: non-fatal error detected on link 3(0x0)",
    )
    hard = xid(
        74,
        400,
        message="NVRM: Xid (PCI:0000:10:00): 74, NVLink: fatal error detected on link 3(0x0)",
    )
    _, found = feed([soft, hard])
    assert [(f.check, f.recommended_action, f.fatal) for f in found] == [
        ("xid.74.nonfatal", "watch", False),
        ("xid.74", "reset_gpu", True),
    ]


@pytest.mark.parametrize(("new", "action"), [(1, "reset_gpu"), (2, "reboot"), (3, "drain")])
def test_xid_154_acts_on_the_new_recovery_action(new: int, action: str) -> None:
    line = f"NVRM: Xid (PCI:0000:10:00): 154, GPU recovery action changed from 0x0 (None) to 0x{new:x} (X)"
    (finding,) = feed([xid(154, 10, message=line)])[1]
    assert (finding.check, finding.recommended_action, finding.fatal) == ("xid.154", action, True)


def test_xid_154_back_to_none_clears() -> None:
    up = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    down = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    _, found = feed([xid(154, 10, message=up), xid(154, 900, message=down)])
    assert checks(found) == [("xid.154", "0", False), ("xid.154", "0", True)]


def crash(seconds: float, *, gpu: int = 0, job: str | None = "job-a") -> list[XidEvent]:
    """One strike: the illegal access and the channel cleanup that follows it."""
    return [xid(13, seconds, gpu=gpu, job=job), xid(43, seconds + 1, gpu=gpu, job=job),
            xid(45, seconds + 2, gpu=gpu, job=job)]


def test_application_xid_never_acts_on_its_own() -> None:
    events = [xid(code, 10 + i * 60) for i, code in enumerate([13, 31, 43, 45, 13, 31])]
    assert unhealthy(feed(events)[1]) == []  # six episodes of one crash, one job


def blamed(found: list[Finding]) -> list[Finding]:
    """The unhealthy findings that act on the GPU (the repeat watch only watches)."""
    return [f for f in unhealthy(found) if f.check != "xid.app_repeat"]


def watched(found: list[Finding]) -> list[tuple[str | None, int]]:
    """The GPUs an application-XID repeat watch opened on, with the strikes it counted."""
    return [(f.entity.device, int(f.evidence.value if f.evidence else 0))
            for f in unhealthy(found) if f.check == "xid.app_repeat"]  # fmt: skip


def test_one_job_struck_three_times_on_one_gpu_is_watched_not_yet_blamed() -> None:
    # A bug tied to a rank can follow the rank to the same GPU after a restart.
    events = crash(10) + crash(1800) + crash(3600)
    found = feed(events)[1]
    assert blamed(found) == []
    assert watched(found) == [("0", 2)]  # at the second strike, once
    (watch,) = unhealthy(found)
    assert (watch.recommended_action, watch.severity, watch.ts) == (
        "watch", "warning", T0 + 1_800_000)


def test_one_strike_is_not_watched_and_the_repeat_watch_stays_open_under_the_blame() -> None:
    assert unhealthy(feed(crash(10, gpu=3))[1]) == []
    events = crash(10, gpu=3) + crash(1800, gpu=3) + crash(3600, gpu=3) + crash(5400, gpu=3)
    state, found = feed(events)
    assert [f.check for f in unhealthy(found)] == ["xid.app_repeat", "xid.app_recurrence"]
    # both clear together when the strikes fall out of the window
    _, out = expire_xid(state, T0 + 5_401_000 + SETTINGS.app_xid_window_s * 1000, SETTINGS)
    assert sorted(f.check for f in out if f.healthy) == ["xid.app_recurrence", "xid.app_repeat"]


def test_the_repeat_watch_needs_its_strikes_apart_and_on_this_gpu_alone() -> None:
    # 13, 43, 45 of one crash and its repeat within xid_dedupe_s are one strike
    close = crash(10) + crash(10 + SETTINGS.xid_dedupe_s - 10)
    assert unhealthy(feed(close)[1]) == []
    # a job that hit two GPUs is its own bug: its strikes count against neither
    spread = [e for t in (10, 1800) for g in (0, 1) for e in crash(t + g, gpu=g, job="a")]
    assert unhealthy(feed(spread)[1]) == []


def test_the_repeat_watch_limit_is_a_setting() -> None:
    three = DetectSettings(app_xid_watch_strikes=3)
    state = None
    found: list[Finding] = []
    for at in (10, 1800, 3600):
        for event in crash(at):
            state, out = detect_xid(state, event, three)
            found += out
    assert watched(found) == [("0", 3)]


def test_the_same_job_struck_again_and_again_on_one_gpu_blames_the_gpu() -> None:
    # A long training job restarted on the node whose GPU is bad: one job, four strikes.
    events = crash(10, gpu=3) + crash(1800, gpu=3) + crash(3600, gpu=3) + crash(5400, gpu=3)
    (finding,) = blamed(feed(events)[1])
    assert (finding.check, finding.entity.device) == ("xid.app_recurrence", "3")
    assert finding.evidence is not None and finding.evidence.value == 4
    assert finding.ts == T0 + 5_400_000


def test_application_xid_recurring_on_one_gpu_across_three_jobs_blames_the_gpu() -> None:
    events = [
        xid(13, 10, gpu=5, job="a"),
        xid(31, 2000, gpu=5, job="b"),
        xid(13, 4000, gpu=5, job="c"),
    ]
    (finding,) = blamed(feed(events)[1])
    assert (finding.check, finding.entity.device) == ("xid.app_recurrence", "5")
    assert (finding.recommended_action, finding.fatal) == ("reset_gpu", False)
    assert finding.ts == T0 + 4_000_000


def test_a_job_hitting_several_gpus_is_its_own_bug() -> None:
    events = [
        xid(13, 10, gpu=5, job="a"),
        xid(13, 11, gpu=6, job="a"),
        xid(13, 2000, gpu=5, job="b"),
        xid(13, 4000, gpu=5, job="c"),
    ]
    found = feed(events)[1]
    assert blamed(found) == []
    assert watched(found) == [("5", 2)]  # jobs b and c struck GPU 5 alone: watched
    # job a's strikes alone on GPU 0 and GPU 1 by turns: its bug moves between ranks
    moving = [e for i, t in enumerate(range(6000, 22_000, 2000))
              for e in crash(t, gpu=i % 2, job="a")]  # fmt: skip
    found = feed(events + moving)[1]
    assert blamed(found) == []  # four strikes each on GPUs 0 and 1 (at most watched)
    assert ("5", 2) in watched(found)


def test_a_gpu_struck_alone_again_and_again_is_blamed_under_a_job_that_crashed_job_wide() -> None:
    # A long training job's one job-wide crash (its own bug, on GPUs 0-7 at once) does not
    # hide the bad GPU that keeps striking under it afterwards, alone.
    job_wide = [e for g in range(8) for e in crash(10 + g, gpu=g, job="a")]
    alone = [e for t in (2000, 4000, 6000, 8000) for e in crash(t, gpu=6, job="a")]
    found = feed(job_wide + alone[:9])[1]
    assert blamed(found) == []
    assert watched(found) == [("6", 2)]  # the job-wide strike counts against no GPU
    (finding,) = blamed(feed(job_wide + alone)[1])
    assert (finding.check, finding.entity.device) == ("xid.app_recurrence", "6")
    assert finding.evidence is not None and finding.evidence.value == 4
    assert finding.ts == T0 + 8_000_000
    # nor does one stray strike of the same job on another GPU (an XID 31 burst on GPU 3)
    stray = crash(1000, gpu=3, job="a")
    (finding,) = blamed(feed(stray + alone)[1])
    assert (finding.entity.device, finding.ts) == ("6", T0 + 8_000_000)
    # but as many lone strikes elsewhere as here is a bug that moves: nobody is blamed
    spread = [e for t in (1000, 3000, 5000, 7000) for e in crash(t, gpu=3, job="a")]
    assert blamed(feed(sorted(spread + alone, key=lambda e: e.ts))[1]) == []


def test_application_xids_without_a_job_count_as_one_unknown_job() -> None:
    # its strikes count as one job's: three are not enough, four blame the GPU
    unknown = [e for t in (10, 1800, 3600) for e in crash(t, gpu=2, job=None)]
    assert blamed(feed(unknown)[1]) == []
    (finding,) = blamed(feed(unknown + crash(5400, gpu=2, job=None))[1])
    assert (finding.check, finding.entity.device) == ("xid.app_recurrence", "2")
    assert "unknown" in finding.message
    # never a distinct job: two known jobs and the unknown one, a strike each, blame nobody
    mixed = crash(10, gpu=4, job="a") + crash(1800, gpu=4, job="b")
    assert blamed(feed(mixed + crash(3600, gpu=4, job=None))[1]) == []
    # and unknown lines on two GPUs are a job-wide bug like any job's
    spread = [e for t in (10, 1800, 3600, 5400) for g in (0, 1)
              for e in crash(t + g, gpu=g, job=None)]  # fmt: skip
    assert unhealthy(feed(spread)[1]) == []


def test_recurrence_clears_when_it_falls_out_of_the_window() -> None:
    events = [
        xid(13, 10, gpu=5, job="a"),
        xid(13, 1000, gpu=5, job="b"),
        xid(13, 2000, gpu=5, job="c"),
    ]
    state, found = feed(events)
    assert ("xid.app_recurrence", "5", False) in checks(found)
    _, out = expire_xid(state, T0 + 1_001_000 + SETTINGS.app_xid_window_s * 1000, SETTINGS)
    assert ("xid.app_recurrence", "5", True) in checks(out)


def test_xid_without_gpu_index_is_named_by_its_pci_address() -> None:
    (finding,) = feed([xid(79, 10, gpu=None)])[1]
    assert finding.entity.device == "0000:10:00"


def test_same_events_same_ids() -> None:
    events = [xid(79, 10), xid(13, 20, job="a"), xid(13, 900, job="b"), xid(13, 1800, job="c")]
    assert [f.finding_id for f in feed(events)[1]] == [f.finding_id for f in feed(events)[1]]


def test_a_repair_forgets_the_strikes_before_it_and_clears_their_blame() -> None:
    # four strikes blame GPU 3; the node is repaired (GPU replaced): the blame clears at the next
    # expiry instead of staying open through the probation (the health machine would take the
    # repair for failed and repair again), and a strike after it starts afresh
    events = crash(10, gpu=3) + crash(1800, gpu=3) + crash(3600, gpu=3) + crash(5400, gpu=3)
    state, found = feed(events)
    assert [f.check for f in blamed(found)] == ["xid.app_recurrence"]
    repaired = T0 + 9_000_000
    state = note_repair(state, repaired)
    state, out = expire_xid(state, repaired + 60_000, SETTINGS)
    assert sorted(f.check for f in out if f.healthy) == ["xid.app_recurrence", "xid.app_repeat"]
    assert all("repaired" in f.message for f in out)
    _, after = feed(crash(9_300, gpu=3) + crash(11_100, gpu=3), state)
    assert blamed(after) == [] and watched(after) == [("3", 2)]  # two strikes since: watched
    # a line from before the repair, read late, is no strike
    _, late = feed(crash(8_000, gpu=3), state)
    assert unhealthy(late) == []


def test_without_a_repair_the_blame_stays_open() -> None:
    events = crash(10, gpu=3) + crash(1800, gpu=3) + crash(3600, gpu=3) + crash(5400, gpu=3)
    state, _ = feed(events)
    _, out = expire_xid(state, T0 + 9_060_000, SETTINGS)
    assert [f for f in out if f.check.startswith("xid.app")] == []


def _strikes_alone_plainly(hits: list[AppHit], gap_ms: int) -> dict[str, list[set[str]]]:
    """The lone strikes per GPU in their plainest form: every hit of a strike compared with
    every hit of the node."""
    out: dict[str, list[set[str]]] = {}
    for device in {h.device for h in hits}:
        own = sorted((h for h in hits if h.device == device), key=lambda h: h.ts)
        runs: list[list[AppHit]] = []
        for hit in own:
            if runs and hit.ts - runs[-1][-1].ts <= gap_ms:
                runs[-1].append(hit)
            else:
                runs.append([hit])
        out[device] = [
            {h.job for h in run} for run in runs
            if not any(o.device != device and o.job in {h.job for h in run}
                       and run[0].ts - gap_ms <= o.ts <= run[-1].ts + gap_ms for o in hits)
        ]  # fmt: skip
    return out


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", ""]), st.sampled_from(["0", "1", "2"]),
                  st.integers(0, 60).map(lambda minute: minute * 60_000)),
        max_size=40,
    )
)  # fmt: skip
def test_lone_strikes_are_found_as_the_plain_comparison_finds_them(
    raw: list[tuple[str, str, int]],
) -> None:
    # whole minutes, so hits often fall exactly xid_dedupe_s apart: the window's edges
    hits = [AppHit(job, device, 13, ts) for job, device, ts in raw]
    gap_ms = SETTINGS.xid_dedupe_s * 1000
    assert _strikes_alone(hits, gap_ms) == _strikes_alone_plainly(hits, gap_ms)
