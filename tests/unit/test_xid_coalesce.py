"""XID storms at the source: repeats of one GPU's Xid coalesced into records with a count, the
checkpoint kept before what is held, and the rules reading a record as the lines it counts."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import DetectSettings, SourcesSettings
from pipeline.detect.xid import detect_xid
from pipeline.model import Event, XidEvent
from pipeline.sources.base import load_checkpoint
from pipeline.sources.xid import Coalescer, XidPosition, XidSource
from pipeline.sources.xid_streams import JournalXidSource, KmsgXidSource, StreamPosition
from pipeline.wire import codec

T0 = 1_764_424_800_000
WALL = T0 / 1000


def _xid(
    ts: int, xid: int = 95, pci: str = "0000:53:00", pid: int | None = 7, message: str = ""
) -> XidEvent:
    return XidEvent(
        ts=ts, cluster="c1", node="gpu-node-1", pool="a3", zone="z1", pci_bus_id=pci,
        xid=xid, pid=pid, process="python" if pid else None,
        message=message or f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name=python, text",
        source="kernel_log",
    )  # fmt: skip


def _out() -> list[Event]:
    return []


def _counts(events: list[Event]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for event in events:
        assert isinstance(event, XidEvent)
        key = (event.pci_bus_id, event.xid)
        out[key] = out.get(key, 0) + event.count
    return out


# --- the coalescer ---------------------------------------------------------------------------


def test_repeats_of_one_gpu_and_xid_are_one_record_with_their_count_after_the_first() -> None:
    coalescer, out = Coalescer(10.0), _out()
    for n in range(1000):
        coalescer.add(_xid(T0 + 5 * n), WALL + 0.005 * n, n, out)
    assert [(e.count, e.ts) for e in out if isinstance(e, XidEvent)] == [(1, T0)]  # at once
    assert coalescer.held == 999 and list(coalescer.marks()) == [1]
    coalescer.flush(out)
    leader, record = out
    assert isinstance(record, XidEvent)
    assert (record.count, record.ts, record.last_ts) == (999, T0 + 5, T0 + 4995)
    assert record.message == leader.message and record.end_ts == T0 + 4995  # type: ignore[attr-defined]
    assert coalescer.held == 0 and list(coalescer.marks()) == []


def test_gpus_codes_and_processes_stay_apart() -> None:
    coalescer, out = Coalescer(10.0), _out()
    lines = [
        _xid(T0), _xid(T0 + 1, pci="0000:54:00"), _xid(T0 + 2, xid=13), _xid(T0 + 3, pid=8),
        _xid(T0 + 4), _xid(T0 + 5, pci="0000:54:00"), _xid(T0 + 6, xid=13), _xid(T0 + 7, pid=8),
    ]  # fmt: skip
    for n, line in enumerate(lines):
        coalescer.add(line, WALL, n, out)
    assert len(out) == 4  # each first line at once
    coalescer.flush(out)
    records = [e for e in out[4:] if isinstance(e, XidEvent)]
    assert sorted((e.pci_bus_id, e.xid, e.pid, e.count) for e in records) == [
        ("0000:53:00", 13, 7, 1), ("0000:53:00", 95, 7, 1), ("0000:53:00", 95, 8, 1),
        ("0000:54:00", 95, 7, 1),
    ]  # fmt: skip


def test_what_the_rules_read_in_the_text_is_never_merged_away() -> None:
    # an NVLink Xid the driver calls non-fatal, then a fatal one of the same GPU and code:
    # merged, the fatal line would hide in the non-fatal record's count
    coalescer, out = Coalescer(10.0), _out()
    text = "NVRM: Xid (PCI:0000:53:00): 74, pid=7, name=python, NVLink: {}"
    for n in range(3):
        coalescer.add(_xid(T0 + n, 74, message=text.format("non-fatal error detected")), WALL, n, out)
    coalescer.add(_xid(T0 + 3, 74, message=text.format("fatal error detected")), WALL, 3, out)
    coalescer.flush(out)
    assert [(e.count, "non-fatal" in e.message) for e in out if isinstance(e, XidEvent)] == [
        (1, True), (1, False), (2, True),
    ]  # fmt: skip


def test_a_window_ends_on_the_wall_clock_with_no_new_line() -> None:
    coalescer, out = Coalescer(10.0), _out()
    for n in range(3):
        coalescer.add(_xid(T0 + n), WALL + n, n, out)
    coalescer.due(WALL + 9.9, out)
    assert len(out) == 1  # held until the window's end
    coalescer.due(WALL + 10.0, out)
    assert [e.count for e in out if isinstance(e, XidEvent)] == [1, 2]
    coalescer.add(_xid(T0 + 60_000), WALL + 60, 3, out)  # quiet since: a new first line
    assert [e.count for e in out if isinstance(e, XidEvent)] == [1, 2, 1]


def test_a_storm_is_about_one_record_per_window_and_no_record_spans_more() -> None:
    # 100 s of lines, 100 a second, read late (a backlog: event time, not the wall, splits)
    coalescer, out = Coalescer(10.0), _out()
    for n in range(10_000):
        coalescer.add(_xid(T0 + 10 * n), WALL, n, out)
    coalescer.flush(out)
    records = [e for e in out if isinstance(e, XidEvent)]
    assert sum(e.count for e in records) == 10_000
    assert len(records) <= 12, [(e.ts, e.count) for e in records]
    assert all(e.end_ts - e.ts <= 10_000 for e in records)


def test_windows_are_bounded_and_the_oldest_goes_out_early() -> None:
    coalescer, out = Coalescer(10.0, max_keys=4), _out()
    for n in range(50):
        for pid in range(10):  # ten processes' windows, four kept
            coalescer.add(_xid(T0 + n, pid=pid + 1), WALL, n, out)
    assert len(coalescer._windows) <= 4
    coalescer.flush(out)
    assert _counts(out) == {("0000:53:00", 95): 500}


def test_zero_seconds_sends_every_line() -> None:
    coalescer, out = Coalescer(0.0), _out()
    for n in range(5):
        coalescer.add(_xid(T0), WALL, n, out)
    assert [e.count for e in out if isinstance(e, XidEvent)] == [1] * 5


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([13, 79, 95]), st.integers(0, 30_000),
                  st.floats(0, 30)),
        max_size=200,
    ),
    st.floats(0.5, 15),
)
def test_no_line_is_lost_from_the_counts(
    lines: list[tuple[int, int, int, float]], window_s: float
) -> None:
    coalescer, out = Coalescer(window_s, max_keys=3), _out()
    want: dict[tuple[str, int], int] = {}
    for n, (gpu, xid, ms, wall) in enumerate(sorted(lines, key=lambda line: line[3])):
        pci = f"0000:{0x50 + gpu:02x}:00"
        coalescer.add(_xid(T0 + ms, xid, pci), WALL + wall, n, out)
        coalescer.due(WALL + wall, out)
        want[(pci, xid)] = want.get((pci, xid), 0) + 1
    coalescer.flush(out)
    assert _counts(out) == want
    assert all(e.end_ts - e.ts <= round(window_s * 1000) for e in out if isinstance(e, XidEvent))


# --- the tailer ------------------------------------------------------------------------------


def _settings(tmp_path: Path, **more: object) -> SourcesSettings:
    return SourcesSettings(cluster="c1", node="gpu-node-1", pool="a3", zone="z1",
                           state_dir=str(tmp_path / "state"), **more)  # type: ignore[arg-type]


def _line(n: int, pci: str = "0000:53:00", xid: int = 95) -> str:
    stamp = f"2025-11-29T14:00:{n // 1000:02d}.{n % 1000:03d}000+00:00"
    return f"{stamp} gpu-node-1 kernel: NVRM: Xid (PCI:{pci}): {xid}, pid=7, name=python, text\n"


def test_the_checkpoint_stays_before_the_first_line_held(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    lines = [_line(n) for n in range(200)] + [_line(300, "0000:54:00", 79)]
    log.write_text("".join(lines))
    wall = [WALL]
    source = XidSource(_settings(tmp_path), path=log, clock=lambda: wall[0])
    batch = source.poll()
    assert [(e.pci_bus_id, e.count) for e in batch.events] == [  # type: ignore[attr-defined]
        ("0000:53:00", 1), ("0000:54:00", 1)]
    source.commit(batch.position)
    assert source.held == 199
    saved = load_checkpoint(tmp_path / "state" / "xid.json", XidPosition)
    assert saved is not None and saved.files[0].offset == len(lines[0])  # the first held line
    assert source.poll().events == []  # read on, not again
    # a restart reads the held lines again: nothing held is lost with the process
    again = XidSource(_settings(tmp_path), path=log, clock=lambda: wall[0] + 20)
    polled = again.poll()
    again.commit(polled.position)
    redone = [*polled.events, *again.drain().events]
    assert _counts(redone) == {("0000:53:00", 95): 199, ("0000:54:00", 79): 1}
    again.close()
    # the first process's window ends: its held lines go out as one record
    wall[0] += 10
    batch = source.poll()
    assert [(e.count, e.ts, e.last_ts) for e in batch.events] == [  # type: ignore[attr-defined]
        (199, T0 + 1, T0 + 199)]
    source.commit(batch.position)
    saved = load_checkpoint(tmp_path / "state" / "xid.json", XidPosition)
    assert saved is not None and saved.files[0].offset == log.stat().st_size
    source.close()


def test_a_batch_not_sent_is_read_again_into_the_same_windows(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(_line(n) for n in range(50)))
    wall = [WALL]
    source = XidSource(_settings(tmp_path), path=log, clock=lambda: wall[0])
    first = source.poll()  # the broker refused it: no commit
    again = source.poll()
    assert [e.count for e in again.events] == [e.count for e in first.events] == [1]  # type: ignore[attr-defined]
    source.commit(again.position)
    wall[0] += 11
    assert [e.count for e in source.poll().events] == [49]  # type: ignore[attr-defined]
    source.close()


def test_once_reads_the_log_to_its_end_and_sends_what_it_held(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(_line(n) for n in range(5000)) + _line(5001, "0000:54:00"))
    source = XidSource(_settings(tmp_path), path=log, clock=lambda: WALL, max_bytes=4096,
                       once=True)  # fmt: skip
    batch = source.poll()
    assert _counts(list(batch.events)) == {("0000:53:00", 95): 5000, ("0000:54:00", 95): 1}
    source.commit(batch.position)
    assert source.held == 0
    saved = load_checkpoint(tmp_path / "state" / "xid.json", XidPosition)
    assert saved is not None and saved.files[0].offset == log.stat().st_size
    source.close()


def test_drain_sends_what_is_held_before_a_stop(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(_line(n) for n in range(30)))
    source = XidSource(_settings(tmp_path), path=log, clock=lambda: WALL)
    source.commit(source.poll().position)
    drained = source.drain()
    assert [e.count for e in drained.events] == [29]  # type: ignore[attr-defined]
    source.commit(drained.position)
    saved = load_checkpoint(tmp_path / "state" / "xid.json", XidPosition)
    assert saved is not None and saved.files[0].offset == log.stat().st_size
    assert source.held == 0 and source.drain().events == []
    source.close()


def test_coalescing_off_sends_every_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(_line(n) for n in range(30)))
    source = XidSource(_settings(tmp_path, xid_coalesce_s=0.0), path=log, clock=lambda: WALL)
    assert len(source.poll().events) == 30
    source.close()


# --- the journal and /dev/kmsg -----------------------------------------------------------------


def _journal(n: int) -> str:
    return json.dumps({
        "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 31, pid=9, name=python, MMU Fault",
        "__REALTIME_TIMESTAMP": str((T0 + n) * 1000), "_HOSTNAME": "gpu-node-7",
        "__CURSOR": f"s=ab;i={n + 1:x};t={T0 + n:x}",
    }) + "\n"  # fmt: skip


def test_the_journal_saves_the_cursor_before_the_first_record_held(tmp_path: Path) -> None:
    journal = tmp_path / "kernel.json"
    journal.write_text("".join(_journal(n) for n in range(40)))
    wall = [WALL]
    source = JournalXidSource(_settings(tmp_path), path=str(journal), clock=lambda: wall[0])
    batch = source.poll()
    assert [e.count for e in batch.events] == [1]  # type: ignore[attr-defined]
    source.commit(batch.position)
    saved = load_checkpoint(tmp_path / "state" / "xid-journal.json", StreamPosition)
    assert saved == StreamPosition(f"s=ab;i=1;t={T0:x}", len(_journal(0)), {})
    assert source.poll().events == []
    wall[0] += 10
    batch = source.poll()
    assert [e.count for e in batch.events] == [39]  # type: ignore[attr-defined]
    source.commit(batch.position)
    again = JournalXidSource(_settings(tmp_path), path=str(journal), clock=lambda: wall[0])
    assert again.poll().events == []  # all sent: nothing read twice
    source.close()
    again.close()


def test_kmsg_saves_the_sequence_before_the_first_record_held(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("".join(
        f"3,{100 + n},{6_000_000 + n},-;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=x, DBE\n"
        for n in range(20)
    ))  # fmt: skip

    def make() -> KmsgXidSource:
        return KmsgXidSource(_settings(tmp_path), path=str(kmsg), clock=lambda: WALL,
                             monotonic=lambda: 100.0, boot_id=lambda: "boot-a")  # fmt: skip

    source = make()
    batch = source.poll()
    assert [e.count for e in batch.events] == [1]  # type: ignore[attr-defined]
    source.commit(batch.position)
    first = len(kmsg.read_text().splitlines()[0]) + 1
    assert batch.position == StreamPosition("boot-a;100", first)
    restarted = make()  # the held 19 are read again after a restart
    polled = restarted.poll()
    restarted.commit(polled.position)
    assert _counts([*polled.events, *restarted.drain().events]) == {("0000:3b:00", 48): 19}
    drained = source.drain()
    assert [e.count for e in drained.events] == [19]  # type: ignore[attr-defined]
    source.close()
    restarted.close()


# --- the contract and the rules -----------------------------------------------------------------


def test_an_xid_event_of_the_previous_version_is_read_as_one_line() -> None:
    sample = json.loads(Path("schemas/samples/xid_event.v2.json").read_text())
    sample["schema"] = "xid_event/1"
    del sample["count"], sample["last_ts"]
    event = codec.decode(json.dumps(sample).encode(), XidEvent)
    assert type(event) is XidEvent and (event.count, event.last_ts) == (1, None)
    assert json.loads(codec.encode(event))["schema"] == "xid_event/2"


def _findings(events: list[XidEvent]) -> list[tuple[str, bool, str, str]]:
    detect, state = DetectSettings(), None
    out: list[tuple[str, bool, str, str]] = []
    for event in events:
        state, found = detect_xid(state, event, detect)
        out += [(f.check, f.healthy, f.recommended_action, f.finding_id) for f in found]
    return out


def test_a_coalesced_record_is_the_lines_it_counts_to_the_rules() -> None:
    # four crashes 20 minutes apart, each a storm of 500 lines: the rules see one strike per
    # crash whether each crash is one line, its 500 lines, or the records the source sends
    crashes = [T0 + 1_200_000 * k for k in range(4)]
    for xid in (79, 13, 31):
        one = [_xid(start, xid) for start in crashes]
        lines = [_xid(start + 5 * n, xid) for start in crashes for n in range(500)]
        coalesced = [record for start in crashes for record in (
            _xid(start, xid),
            msgspec.structs.replace(_xid(start + 5, xid), count=499, last_ts=start + 5 * 499),
        )]  # fmt: skip
        found = _findings(one)
        assert found, xid  # 79 at once; 13 and 31 watched, then blamed, by their strikes
        assert _findings(coalesced) == _findings(lines) == found, xid


def test_a_record_counts_into_its_episode_and_a_replayed_one_is_dropped() -> None:
    detect = DetectSettings()
    record = msgspec.structs.replace(_xid(T0 + 5, 79), count=499, last_ts=T0 + 9000)
    state, _ = detect_xid(None, _xid(T0, 79), detect)
    state, _ = detect_xid(state, record, detect)
    state, _ = detect_xid(state, record, detect)  # sent again (at least once)
    (episode,) = state.episodes.values()
    assert (episode.count, episode.last_ts, state.dropped) == (500, T0 + 9000, 1)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from(["0000:53:00", "0000:54:00"]),
                  st.floats(0, 12), st.booleans()),
        min_size=1, max_size=8,
    ),
)
def test_polls_and_crashes_anywhere_lose_no_line_and_without_crashes_count_each_once(
    tmp_path_factory: object, steps: list[tuple[int, str, float, bool]]
) -> None:
    """Each step appends `n` lines of one GPU, lets `wait` seconds pass, polls (and commits);
    with `crash`, the process then dies without a stop. At the end a last process reads on
    and stops (drain): every line is in some record's count, exactly once without crashes."""
    folder = Path(tmp_path_factory.mktemp("storm"))  # type: ignore[attr-defined]
    log = folder / "kern.log"
    log.write_text("")
    wall, ms, sent = [WALL], 0, _out()
    written: dict[tuple[str, int], int] = {}

    def start() -> XidSource:
        return XidSource(_settings(folder), path=log, clock=lambda: wall[0], max_bytes=2048)

    source, crashed = start(), False
    for n, pci, wait, crash in steps:
        with log.open("a") as out:
            for _ in range(n):
                ms += 7
                out.write(_line(ms, pci))
        written[(pci, 95)] = written.get((pci, 95), 0) + n
        wall[0] += wait
        batch = source.poll()
        sent += batch.events
        source.commit(batch.position)
        if crash:
            source.close()
            source, crashed = start(), True
    for _ in range(log.stat().st_size // 2048 + 2):  # read on to the end (2 KiB a poll)
        batch = source.poll()
        sent += batch.events
        source.commit(batch.position)
    drained = source.drain()
    sent += drained.events
    source.commit(drained.position)
    source.close()
    counted = _counts(sent)
    assert all(counted.get(key, 0) >= lines for key, lines in written.items()), (counted, written)
    if not crashed:
        assert counted == written
