"""Kernel-log text of NVRM Xid lines, in the formats of reference/data-shapes.md §2.1.

`NVRM: Xid (PCI:<dddd:bb:dd>): <code>, pid=<pid|'<unknown>'>, name=<process|<unknown>>, <text>`;
a few codes print without pid/name (63, 119 print pid only; 79, 120, 154 neither).
"""

from __future__ import annotations

import numpy as np

from pipeline.wire.codec import normalize_pci

RECOVERY_ACTIONS = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required"}


def xid_text(code: int, rng: np.random.Generator, detail: str = "") -> str:
    """The free text after the pid/name part for `code` (register values drawn from `rng`)."""
    hexword = f"{int(rng.integers(0, 1 << 32)):08x}"
    gpc, tpc, sm = (int(rng.integers(0, n)) for n in (8, 9, 2))
    texts = {
        13: f"Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): Out Of Range Address",
        31: f"Ch 0000{hexword[:4]}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_"
        f"{int(rng.integers(0, 16))} faulted @ 0x7f{hexword}_00000000. Fault is of type "
        "FAULT_PDE ACCESS_TYPE_VIRT_READ",
        43: f"Ch 0000{hexword[:4]}",
        45: f"Ch 0000{hexword[:4]}",
        46: "",
        48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        f"at partition {int(rng.integers(0, 16))}, subpartition {int(rng.integers(0, 2))}.",
        63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
        64: "Row Remapper: Failed to mark a row for remapping. The GPU requires a reset and "
        "may need to be replaced.",
        74: f"NVLink: fatal error detected on link {int(rng.integers(0, 18))}"
        f"(0x0, 0x0, 0x{int(rng.integers(1, 16)) << 16:x}, 0x0, 0x0, 0x0, 0x0)",
        79: "GPU has fallen off the bus.",
        94: "Contained: SM (0x1). RST: No, D-RST: No",
        95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119: "Timeout waiting for RPC from GSP! Expected function 76 (GSP_RM_CONTROL) "
        f"(0x20802a02 0x{int(rng.integers(1, 256)):x}).",
        120: f"GSP kernel exception: store access page fault (cause:0xf) @ pc:0x{hexword}, "
        "partition:4#0",
    }
    return detail or texts.get(code, "")


def xid_line(
    code: int,
    pci_bus_id: str,
    text: str,
    pid: int | None,
    process: str | None,
) -> str:
    """One kernel-log line; `pci_bus_id` may be in DCGM or kernel form."""
    bdf = normalize_pci(pci_bus_id)
    head = f"NVRM: Xid (PCI:{bdf}): {code}"
    if code in (79, 120, 154):
        parts = [head]
    elif code in (63, 119):
        parts = [head, f"pid={pid if pid is not None else repr('N/A')}"]
    else:
        shown_pid = str(pid) if pid is not None else "'<unknown>'"
        parts = [head, f"pid={shown_pid}", f"name={process or '<unknown>'}"]
    if code == 46 and not text:
        return head
    return ", ".join([*parts, text]) if text else ", ".join(parts)


def recovery_text(old: int, new: int) -> str:
    return (
        f"GPU recovery action changed from 0x{old:x} ({RECOVERY_ACTIONS[old]}) "
        f"to 0x{new:x} ({RECOVERY_ACTIONS[new]})"
    )
