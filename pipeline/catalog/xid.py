"""NVIDIA XID catalog: what each XID code means and what FleetPulse does about it."""

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

from ._csv import read_rows

Severity = Literal["info", "warning", "critical"]
Action = Literal["none", "watch", "restart_app", "reset_gpu", "reboot", "replace"]

SEVERITIES: tuple[Severity, ...] = get_args(Severity)
ACTIONS: tuple[Action, ...] = get_args(Action)

_COLUMNS = (
    "code",
    "mnemonic",
    "description",
    "bucket",
    "severity",
    "fatal",
    "action",
    "application",
    "source",
)


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One row of xid.csv; see the header of that file for the column meanings."""

    code: int
    mnemonic: str
    description: str
    bucket: str
    severity: Severity
    fatal: bool
    action: Action
    application: bool
    source: str


@functools.cache
def xid_catalog() -> MappingProxyType[int, XidEntry]:
    """All catalogued XIDs by code (read-only: the mapping is shared by every caller)."""
    entries: dict[int, XidEntry] = {}
    for row in read_rows("xid.csv", _COLUMNS):
        entry = XidEntry(
            code=row.integer("code"),
            mnemonic=row.text("mnemonic"),
            description=row.text("description"),
            bucket=row.text("bucket"),
            severity=row.choice("severity", SEVERITIES),
            fatal=row.boolean("fatal"),
            action=row.choice("action", ACTIONS),
            application=row.boolean("application"),
            source=row.text("source"),
        )
        if entry.code in entries:
            msg = f"{row.where}: duplicate XID code {entry.code}"
            raise ValueError(msg)
        entries[entry.code] = entry
    return MappingProxyType(entries)


def xid_info(code: int) -> XidEntry:
    """The catalog entry for `code`, or the conservative default for an unknown code."""
    entry = xid_catalog().get(code)
    return entry if entry is not None else unknown_xid(code)


def unknown_xid(code: int) -> XidEntry:
    """Default entry for a code the catalog lacks.

    An unknown XID is neither ignored nor allowed to cordon a node on its own:
    it is surfaced for a human (warning, watch) until someone adds a row.
    """
    return XidEntry(
        code=code,
        mnemonic="UNKNOWN",
        description=f"XID {code} is not in the FleetPulse catalog",
        bucket="UNLISTED",
        severity="warning",
        fatal=False,
        action="watch",
        application=False,
        source="default for unknown codes",
    )
