"""XID kernel-log parser (every line form of data-shapes §2.1) and the tailer across rotations."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import SimSettings, SourcesSettings
from pipeline.errors import DecodeError
from pipeline.model import Event, XidEvent
from pipeline.sim.endpoints.kernel_log import KernelLogWriter, format_xid_message
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import parse_forced
from pipeline.sim.fleet import build_fleet
from pipeline.sources.xid import GpuInfo, Identity, XidSource, parse_line, parse_lines
from pipeline.wire.codec import normalize_pci

ID = Identity(cluster="c1", node="gpu-node-1", pool="a3", zone="us-central1-a")
FALLBACK = 1_764_424_999_000
T0 = 1_764_424_800_000


@pytest.mark.parametrize(
    ("message", "pci", "xid", "pid", "process"),
    [
        (
            "NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000",
            "0000:66:00",
            32,
            2280636,
            "train.3",
        ),
        (
            "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
            "Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
            "0000:b5:00",
            13,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
            "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            "0003:00:00",
            74,
            None,
            None,
        ),
        ("NVRM: Xid (PCI:0000:3f:00): 46", "0000:3f:00", 46, None, None),
        (
            "NVRM: Xid (PCI:0000:2B:00): 79, GPU has fallen off the bus.",
            "0000:2b:00",
            79,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
            "reset gpu to activate.",
            "0000:10:1c",
            63,
            1896,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP",
            "0000:65:00",
            119,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
            "(GPU Reset Required)",
            "0008:01:00",
            154,
            None,
            None,
        ),
        (
            "NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
            "0000:01:00",
            3,
            None,
            None,
        ),  # old driver format: no "PCI:"
    ],
)
def test_real_xid_lines_parse(
    message: str, pci: str, xid: int, pid: int | None, process: str | None
) -> None:
    line = f"2025-11-29T14:00:04.211000+00:00 gpu-node-1 kernel: [ 8123.456789] {message}\n"
    event = parse_line(line, ID, fallback_ts_ms=FALLBACK)
    assert isinstance(event, XidEvent)
    assert (event.pci_bus_id, event.xid, event.pid, event.process) == (pci, xid, pid, process)
    assert event.message == message
    assert event.ts == 1_764_424_804_211
    assert (event.cluster, event.node, event.pool, event.zone) == (
        "c1",
        "gpu-node-1",
        "a3",
        "us-central1-a",
    )
    assert event.source == "kernel_log"


@pytest.mark.parametrize(
    ("prefix", "ts"),
    [
        ("2025-11-29T14:00:04.211000+00:00 gpu-node-1 kernel: ", 1_764_424_804_211),
        ("2025-11-29T15:00:04.211+01:00 gpu-node-1 kernel: [   12.000001] ", 1_764_424_804_211),
        (
            "Nov 29 14:00:04 gpu-node-1 kernel: [ 8123.456789] ",
            1_764_424_804_000,
        ),  # year of reading
        ("[ 8123.456789] ", FALLBACK),  # dmesg: no wall clock, time of reading
        ("", FALLBACK),
    ],
)
def test_timestamps_of_each_log_format(prefix: str, ts: int) -> None:
    event = parse_line(f"{prefix}NVRM: Xid (PCI:0000:3f:00): 46", ID, fallback_ts_ms=FALLBACK)
    assert isinstance(event, XidEvent)
    assert event.ts == ts


def test_companion_line_teaches_uuid_and_known_gpus_fill_index() -> None:
    lines = [
        "2025-11-29T14:00:04.211000+00:00 n kernel: NVRM: GPU at PCI:0000:2b:00: GPU-15704b32-f531-14ce-0530-1ac21e4b68e6\n",
        "2025-11-29T14:00:04.211000+00:00 n kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n",
        "2025-11-29T14:00:04.211000+00:00 n kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.\n",
        "2025-11-29T14:00:05.000000+00:00 n kernel: NVRM: Xid (PCI:0000:53:00): 48, pid=7, name=python, DBE\n",
        "2025-11-29T14:00:05.100000+00:00 n kernel: usb 1-1: new high-speed USB device number 2\n",
    ]
    gpus = {"0000:53:00": GpuInfo(3, "GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24")}
    parsed = parse_lines(lines, ID, fallback_ts_ms=FALLBACK, gpus=gpus)
    assert parsed.bad == []
    fell, dbe = parsed.events
    assert isinstance(fell, XidEvent) and isinstance(dbe, XidEvent)
    assert (fell.xid, fell.uuid, fell.gpu_index) == (
        79,
        "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",
        None,
    )
    assert (dbe.xid, dbe.uuid, dbe.gpu_index) == (48, "GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24", 3)


@pytest.mark.parametrize(
    "message",
    [
        "NVRM: Xid (PCI:0000:66:00): abc, pid=1",  # code is not a number
        "NVRM: Xid (PCI:zz:66): 13, pid=1",  # not a PCI id
        "NVRM: Xid PCI:0000:66:00: 13",  # no parentheses
        "NVRM: Xid (PCI:0000:66:00): 999999999, pid=1",  # beyond the model's code range
    ],
)
def test_malformed_xid_lines_become_dead_letters(message: str) -> None:
    with pytest.raises((DecodeError, ValueError)):
        parse_line(message, ID, fallback_ts_ms=FALLBACK)
    parsed = parse_lines([message + "\n"], ID, fallback_ts_ms=FALLBACK, gpus={})
    assert parsed.events == []
    [bad] = parsed.bad
    assert bad.raw == (message + "\n").encode()
    assert "expected" in str(bad.error) and "got" in str(bad.error)


def test_other_kernel_lines_are_skipped() -> None:
    for line in [
        "2025-11-29T14:00:04.211000+00:00 n kernel: EXT4-fs (sda1): mounted filesystem",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
    ]:
        assert parse_line(line, ID, fallback_ts_ms=FALLBACK) is None


# --- the tailer ---------------------------------------------------------------------------


def _event(n: int) -> XidEvent:
    xid = (13, 31, 48, 79, 63, 94)[n % 6]
    return XidEvent(
        ts=T0 + 1000 * n,
        cluster="c1",
        node="gpu-node-1",
        pool="a3",
        zone="us-central1-a",
        pci_bus_id=f"0000:{0x18 + n % 8:02x}:00",
        xid=xid,
        pid=4000 + n if n % 2 else None,
        process="train.py" if n % 2 else None,
        message=f"event {n}",
        source="kernel_log",
    )


def _source(tmp_path: Path, log: Path, clock: list[float]) -> XidSource:
    settings = SourcesSettings(
        cluster="c1", node="gpu-node-1", pool="a3", zone="us-central1-a", state_dir=str(tmp_path)
    )
    return XidSource(settings, path=log, clock=lambda: clock[0], rotate_wait_s=1.0)


def _read(source: XidSource, commit: bool = True) -> list[tuple[int, int, str]]:
    batch = source.poll()
    assert batch.bad == []
    if commit:
        source.commit(batch.position)
    return [(e.ts, e.xid, e.message) for e in batch.events if isinstance(e, XidEvent)]


def _expected(n: int) -> tuple[int, int, str]:
    event = _event(n)
    return event.ts, event.xid, format_xid_message(event)


def test_rotation_truncation_and_restart_lose_and_repeat_nothing(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    clock = [T0 / 1000]
    writer = KernelLogWriter(log, "gpu-node-1", boot_ms=T0 - 60_000)
    source = _source(tmp_path, log, clock)
    got: list[tuple[int, int, str]] = []
    writer.write_xid(_event(0))
    writer.write_xid(_event(1))
    got += _read(source)
    writer.write_xid(_event(2))
    writer.rotate()  # create mode: kern.log -> kern.log.1, new kern.log
    writer.write_xid(_event(3))
    got += _read(source)
    writer.write_xid(_event(4))
    assert _read(source, commit=False)  # read but never committed: must come again
    source.close()
    writer.rotate()  # rotated while the reader is down
    writer.write_xid(_event(5))
    clock[0] += 10
    source = _source(tmp_path, log, clock)
    got += _read(source)
    got += _read(source)  # the old files are drained and let go
    writer.truncate()  # copytruncate after everything was read
    writer.write_xid(_event(6))
    got += _read(source)
    assert got == [_expected(n) for n in range(7)]
    writer.close()
    source.close()


def test_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    source = _source(tmp_path, log, [T0 / 1000])
    line = "2025-11-29T14:00:04.211000+00:00 n kernel: NVRM: Xid (PCI:0000:3f:00): 46\n"
    with log.open("a") as out:
        out.write(line[:30])
    assert _read(source) == []
    with log.open("a") as out:
        out.write(line[30:])
    assert [xid for _, xid, _ in _read(source)] == [46]


def test_lines_written_to_a_renamed_file_are_still_read(tmp_path: Path) -> None:
    """rsyslog keeps writing to the old file until it reopens: rotate_wait covers that."""
    log = tmp_path / "kern.log"
    clock = [T0 / 1000]
    source = _source(tmp_path, log, clock)
    old = log.open("a")
    old.write("NVRM: Xid (PCI:0000:3f:00): 46\n")
    old.flush()
    assert len(_read(source)) == 1
    log.rename(tmp_path / "kern.log.1")
    log.write_text("NVRM: Xid (PCI:0000:3f:00): 48\n")
    old.write("NVRM: Xid (PCI:0000:3f:00): 13\n")  # after the rename, before the reopen
    old.flush()
    assert sorted(x for _, x, _ in _read(source)) == [13, 48]
    old.write("NVRM: Xid (PCI:0000:3f:00): 31\n")
    old.close()
    clock[0] += 0.5
    assert [x for _, x, _ in _read(source)] == [31]
    clock[0] += 5
    assert _read(source) == []
    assert len(source._tracked) == 1  # the drained old file was let go


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 3)),
        st.just(("rotate", 0)),
        st.just(("truncate", 0)),
        st.just(("poll", 0)),
        st.just(("peek", 0)),
        st.just(("restart", 0)),
    ),
    max_size=14,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_any_interleaving_reads_every_line_once(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    tmp = tmp_path_factory.mktemp("xid")
    log = tmp / "kern.log"
    clock = [T0 / 1000]
    writer = KernelLogWriter(log, "gpu-node-1")
    source = _source(tmp, log, clock)
    assert _read(source) == []  # the first poll fixes where reading starts
    written = 0
    got: list[tuple[int, int, str]] = []
    pending = False  # lines written since the last committed poll
    rotated = False  # a rotation since the last committed poll
    for op, count in ops:
        clock[0] += 0.4
        if op == "write":
            for _ in range(count):
                writer.write_xid(_event(written))
                written += 1
            pending = True
        elif op == "rotate" and not (pending and rotated):
            # a second rotation before the reader has read the first one's file loses its
            # unread lines by design (only `.1` is followed; logrotate runs far less often
            # than the reader polls)
            writer.rotate()
            rotated = True
        elif op == "truncate" and not pending:  # copytruncate loses unread lines by design
            writer.truncate()
        elif op == "poll":
            got += _read(source)
            pending = rotated = False
        elif op == "peek":
            _read(source, commit=False)
        elif op == "restart":
            source.close()
            source = _source(tmp, log, clock)
    clock[0] += 10
    got += _read(source)
    got += _read(source)
    assert got == [_expected(n) for n in range(written)]
    assert os.listdir(tmp)  # the checkpoint and logs are where we think
    writer.close()
    source.close()


def test_simulated_xids_read_back_across_a_rotation(tmp_path: Path) -> None:
    config = SimSettings(
        seed=3, duration_s=600, gpu_nodes=2, tpu_slices=0, clusters=1, random_faults=False
    )
    target = build_fleet(config).gpu_nodes[0].name
    faults = [parse_forced(f"{code}@{at}:{target}") for code, at in (("G1", 100), ("G7", 300))]
    sim = Simulation(config, faults)
    node = sim.fleet.gpu_nodes[0]
    xids = [e for e in sim.events() if isinstance(e, XidEvent) and e.node == node.name]
    assert {e.xid for e in xids} >= {79, 119, 154}
    known = {
        normalize_pci(pci): GpuInfo(index, uuid)
        for index, (pci, uuid) in enumerate(zip(node.pci_bus_ids, node.uuids, strict=True))
    }
    log = tmp_path / "kern.log"
    settings = SourcesSettings(
        cluster=node.cluster,
        node=node.name,
        pool=node.pool,
        zone=node.zone,
        state_dir=str(tmp_path),
    )
    source = XidSource(settings, path=log, gpus=known, clock=lambda: T0 / 1000)
    got: list[Event] = []
    with KernelLogWriter(log, node.name) as writer:
        for n, event in enumerate(xids):
            writer.write_xid(event)
            if n == len(xids) // 2:
                batch = source.poll()
                source.commit(batch.position)
                got += batch.events
                writer.rotate()
    got += source.poll().events
    source.close()
    expected = [
        msgspec.structs.replace(
            e,
            source="kernel_log",
            job=None,  # a kernel log does not name jobs
            pci_bus_id=normalize_pci(node.pci_bus_ids[e.gpu_index or 0]),
        )
        for e in xids
    ]
    assert got == expected


# --- every kernel-log format: line → (xid, bus id, ts; None = the fallback) -----------------

T_2024 = 1_717_410_121_000  # 2024-06-03T10:22:01Z
T_2025 = 1_748_946_121_000  # the same day and time in the year of FALLBACK (classic syslog)
X = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

FORMATS = [
    ("dmesg plain", f"[ 1234.567890] {X}", 79, "0000:3b:00", None),
    ("dmesg -T", f"[Mon Jun  3 10:22:01 2024] {X}", 79, "0000:3b:00", T_2024),
    ("dmesg --ctime", f"[Mon Jun 03 10:22:01 2024] {X}", 79, "0000:3b:00", T_2024),
    ("dmesg -T, French", f"[lun. juin  3 10:22:01 2024] {X}", 79, "0000:3b:00", None),
    (
        "dmesg --decode --time-format iso",
        f"kern  :err   : 2024-06-03T10:22:01,123456+00:00 {X}",
        79,
        "0000:3b:00",
        T_2024 + 123,
    ),
    ("dmesg --decode", f"kern  :warn  : [ 1234.567890] {X}", 79, "0000:3b:00", None),
    ("dmesg --time-format reltime", f"[Jun 3 10:22] {X}", 79, "0000:3b:00", None),
    ("dmesg --time-format delta", f"[  +0.000123] {X}", 79, "0000:3b:00", None),
    ("journalctl short", f"Jun 03 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", T_2025),
    (
        "journalctl short-precise",
        f"Jun 03 10:22:01.250000 gpu-1 kernel: {X}",
        79,
        "0000:3b:00",
        T_2025 + 250,
    ),
    ("journalctl short-iso", f"2024-06-03T10:22:01+0000 gpu-1 kernel: {X}", 79, "0000:3b:00", T_2024),
    (
        "journalctl short-iso-precise",
        f"2024-06-03T12:22:01.500000+02:00 gpu-1 kernel: {X}",
        79,
        "0000:3b:00",
        T_2024 + 500,
    ),
    ("journalctl short-full", f"Mon 2024-06-03 10:22:01 UTC gpu-1 kernel: {X}", 79, "0000:3b:00", T_2024),
    ("journalctl short-full, CEST", f"Mon 2024-06-03 12:22:01 CEST gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("journalctl short-unix", f"1717410121.750000 gpu-1 kernel: {X}", 79, "0000:3b:00", T_2024 + 750),
    ("journalctl short-monotonic", f"[ 1234.567890] gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("journalctl, French locale", f"juin 03 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("journalctl, German locale", f"Mär 03 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("journalctl, German May", f"Mai 03 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("journalctl, Russian locale", f"июн 03 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", None),
    ("syslog RFC 3164", f"Jun  3 10:22:01 gpu-1 kernel: [ 1234.567890] {X}", 79, "0000:3b:00", T_2025),
    ("syslog RFC 3164 with PRI", f"<3>Jun  3 10:22:01 gpu-1 kernel: {X}", 79, "0000:3b:00", T_2025),
    (
        "rsyslog RFC 3339",
        f"2024-06-03T10:22:01.000000+00:00 gpu-1 kernel: [ 1234.567890] {X}",
        79,
        "0000:3b:00",
        T_2024,
    ),
    ("syslog RFC 5424", f"<3>1 2024-06-03T10:22:01Z gpu-1 kernel - - - {X}", 79, "0000:3b:00", T_2024),
    ("bare kernel: [uptime]", f"kernel: [ 1234.567890] {X}", 79, "0000:3b:00", None),
    ("kernel: without uptime", f"kernel: {X}", 79, "0000:3b:00", None),
    ("indented continuation", f"    {X}", 79, "0000:3b:00", None),
    ("tab-indented", f"\t{X}", 79, "0000:3b:00", None),
    ("/dev/kmsg record", f"3,1234,5678901,-;{X}", 79, "0000:3b:00", None),
    ("bus PCI:dddd:bb:dd.f", "NVRM: Xid (PCI:0000:3b:00.0): 13, pid=5, name=a", 13, "0000:3b:00", None),
    ("bus PCI:bb:dd, no domain", "NVRM: Xid (PCI:3b:00): 13, pid=5, name=a", 13, "0000:3b:00", None),
    ("bus bb:dd.f, no PCI: nor domain", "NVRM: Xid (3b:00.0): 13", 13, "0000:3b:00", None),
    ("bus 8-digit domain", "NVRM: Xid (PCI:00000000:3B:00.0): 13", 13, "0000:3b:00", None),
    ("bus old driver, no PCI:", "NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007", 3, "0000:01:00", None),
    ("bus non-zero domain", "NVRM: Xid (PCI:0018:01:00): 119, pid='N/A', Timeout", 119, "0018:01:00", None),
    (
        "NVLink5 sub-codes",
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 "
        "(0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "0018:01:00",
        None,
    ),
    (
        "NVLink5 with pid and name",
        "NVRM: Xid (PCI:0000:1b:00): 145, pid=77, name=torchrun, RLW_REMAP  Nonfatal  XC1 i2 "
        "Link 17 (0x00000004 0x00000001 0x00000000 0x00000000)",
        145,
        "0000:1b:00",
        None,
    ),
]


@pytest.mark.parametrize(
    ("line", "xid", "pci", "ts"),
    [row[1:] for row in FORMATS],
    ids=[row[0] for row in FORMATS],
)
def test_every_format_is_read(line: str, xid: int, pci: str, ts: int | None) -> None:
    parsed = parse_lines([line + "\n"], ID, fallback_ts_ms=FALLBACK, gpus={})
    assert parsed.bad == []
    [event] = parsed.events
    assert isinstance(event, XidEvent)
    assert (event.xid, event.pci_bus_id, event.ts) == (xid, pci, FALLBACK if ts is None else ts)
    assert event.message == line[line.index("NVRM:") :]  # the code's text, sub-codes included


def test_nvlink5_sub_codes_stay_in_the_message() -> None:
    event = parse_line(FORMATS[-1][1], ID, fallback_ts_ms=FALLBACK)
    assert isinstance(event, XidEvent)
    assert (event.pid, event.process) == (77, "torchrun")
    assert "RLW_REMAP  Nonfatal  XC1 i2 Link 17 (0x00000004" in event.message


@pytest.mark.parametrize(
    "line",
    [
        "Jun 03 10:22:01 gpu-1 kernel: NVRM: Xid (PCI:0000:3b:00 13, truncated by the ring buf",
        "kern  :err   : 2024-06-03T10:22:01,123456+00:00 NVRM: Xid (PCI:0000:3b:00): ??",
        "[ 1234.567890] NVRM: Xid: something the driver never printed",
        "    NVRM:  Xid (PCI:0000:3b): 79",
        "[ 1234.567890] NVRM: GPU has fallen off the bus.",  # no bus id: still a lost GPU
        "kernel: NVRM: GPU 0000:3b:00.0: the GPU has Fallen Off The Bus",
    ],
)
def test_a_garbled_nvrm_xid_line_is_dead_lettered_with_the_line(line: str) -> None:
    parsed = parse_lines([line + "\n"], ID, fallback_ts_ms=FALLBACK, gpus={})
    assert parsed.events == []
    [bad] = parsed.bad
    assert bad.raw == (line + "\n").encode()
    assert "expected" in str(bad.error)


def test_fallen_off_the_bus_without_an_xid_is_an_inferred_xid_79() -> None:
    lines = [
        "[ 100.000001] NVRM: GPU at PCI:0000:3b:00: GPU-15704b32-f531-14ce-0530-1ac21e4b68e6\n",
        "[ 100.000002] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n",
        "[ 100.000003] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n",
    ]
    parsed = parse_lines(lines, ID, fallback_ts_ms=FALLBACK, gpus={})
    assert parsed.bad == []
    assert len(parsed.events) == 2  # no Xid line at all: each is one (the worker merges them)
    event = parsed.events[0]
    assert isinstance(event, XidEvent)
    assert (event.xid, event.pci_bus_id, event.uuid) == (
        79,
        "0000:3b:00",
        "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",
    )
    assert "inferred" in event.message and "fallen off the bus" in event.message


def test_old_driver_announcements_without_pci_teach_the_uuid() -> None:
    lines = [
        "kernel: NVRM: GPU at 0000:3b:00: GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24\n",
        "kernel: NVRM: GPU Board Serial Number: 1652220012345\n",
        "kernel: NVRM: GPU at 3c:00.0: GPU-aaaaaaaa-9f0d-44a1-8e52-0c7f3a9d1b24\n",
        "kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, DBE\n",
        "kernel: NVRM: Xid (3c:00): 31\n",
    ]
    parsed = parse_lines(lines, ID, fallback_ts_ms=FALLBACK, gpus={})
    assert parsed.bad == []
    assert [(e.xid, e.uuid) for e in parsed.events if isinstance(e, XidEvent)] == [
        (48, "GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24"),
        (31, "GPU-aaaaaaaa-9f0d-44a1-8e52-0c7f3a9d1b24"),
    ]


def test_the_tailer_does_not_count_fallen_off_the_bus_twice_across_polls(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    source = _source(tmp_path, log, [T0 / 1000])
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert [x for _, x, _ in _read(source)] == [79]
    with log.open("a") as out:
        out.write("[ 1.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n")
    assert _read(source) == []
    source.close()
