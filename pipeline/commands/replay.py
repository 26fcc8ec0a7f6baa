"""`fleetpulse replay FILE...`: what would FleetPulse have done with this history? (dry run)

    fleetpulse simulate --to jsonl --out run1 --duration 1800 --inject G1@600
    fleetpulse replay run1/events.jsonl --inventory run1/inventory.jsonl
    fleetpulse replay gpu.jsonl xid.jsonl --json > what-if.json
    fleetpulse replay run1/events.jsonl --out what-if/

Each FILE holds input topic values as JSON lines (what `simulate --to jsonl` writes, or a dump
of the input topics); several files are merged by event time. The records run through detect,
health and policy in one process, no Kafka, every action a dry run. With --inventory (JSON
lines or a JSON array of inventory/1 values, as `inventory load` reads) the inventory is fed
first and enforced: budgets count its members and a target it does not know is never removed.

The report: actions (all dry run), findings, proposals the policy withheld with the rule that
held them, and dead letters (bad lines, refused records) with their reason. A bad line is a
dead letter, never an error. --json prints one document with those lists and their counts;
--out DIR writes them as DIR/actions.jsonl, findings.jsonl, withheld.jsonl,
withheld_records.jsonl (the withheld/1 records: every rule that held a proposal, and drops),
dead_letters.jsonl and DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec

from pipeline.config import Settings
from pipeline.runtime.replay import ReplayResult, replay
from pipeline.sources.inventory_file import load_inventory

_SHOWN = 20
_PROGRESS_EVERY_S = 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="run recorded topic values through the pipeline, dry run: what would it have done",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="JSONL recordings")
    parser.add_argument(
        "--inventory", type=Path, metavar="FILE", help="inventory file, fed first and enforced"
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="also write the lists as JSONL")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the summary"
    )
    parser.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    inventory = None if args.inventory is None else load_inventory(args.inventory)
    if inventory is None and not settings.inventory.enforce:
        print(
            "fleetpulse replay: no inventory (--inventory FILE): pools, zones and budgets come "
            "from telemetry",
            file=sys.stderr,
        )
    elif inventory is None:
        print(
            "fleetpulse replay: no --inventory FILE: membership comes from the recording's own "
            "inventory records once one arrives; until then pools, zones and budgets come from "
            "telemetry (caps sized by the largest fleet seen)",
            file=sys.stderr,
        )
    result = replay(settings, args.files, inventory, _Progress())
    if args.inventory is not None:
        result.inventory_file = str(args.inventory)
    if args.out is not None:
        _write(args.out, result)
    if args.json:
        sys.stdout.write(json.dumps(result.document(), indent=1) + "\n")
    else:
        _summary(result, args.out)
    return 0


class _Progress:
    """A line on stderr every few seconds, for files that take a while."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int, lines: int) -> None:
        now = time.monotonic()
        if now - self.last < _PROGRESS_EVERY_S:
            return
        self.last = now
        share = 100 * done / total if total else 100.0
        print(
            f"replay: {share:.0f}% ({lines:,} lines, {now - self.started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )


def _write(out: Path, result: ReplayResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    for name, rows in result.lists().items():
        with (out / f"{name}.jsonl").open("wb") as handle:
            for row in rows:
                handle.write(encoder.encode(row) + b"\n")
    summary = {k: v for k, v in result.document().items() if k not in result.lists()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def _summary(result: ReplayResult, out: Path | None) -> None:
    inventory = (
        f"inventory {result.inventory_file} ({result.inventory_records} records, enforced)"
        if result.inventory_file
        else "no inventory"
    )
    print(f"Replayed {result.lines:,} lines from {len(result.files)} file(s), {inventory}.")
    print(f"\nActions (dry run): {len(result.actions)}")
    for action in result.actions[:_SHOWN]:
        target = action.target
        print(
            f"  {_when(action.ts)}  {action.kind:8} {target.cluster}/{target.name} "
            f"(pool {target.pool})  {action.reason.summary}"
        )
    _more(len(result.actions))
    checks = Counter(finding.check for finding in result.findings)
    found = ", ".join(f"{check} {n}" for check, n in checks.most_common(8))
    print(f"\nFindings: {len(result.findings)}" + (f"  ({found})" if found else ""))
    rules = Counter(held.rule for held in result.withheld.values())
    ruled = ", ".join(f"{rule} {n}" for rule, n in sorted(rules.items()))
    print(f"\nWithheld proposals: {len(result.withheld)}" + (f"  ({ruled})" if ruled else ""))
    for held in list(result.withheld.values())[:_SHOWN]:
        later = "acted later" if held.acted else "never acted"
        when = _when(held.first_ts)
        print(f"  {when}  {held.kind:8} {held.target}  held by {held.rule}, {later}")
    _more(len(result.withheld))
    print(f"\nDead letters: {len(result.dead_letters)}")
    for letter in result.dead_letters[:_SHOWN]:
        print(f"  {letter.file}:{letter.line}  {letter.error}")
    _more(len(result.dead_letters))
    if out is not None:
        print(f"\nWrote {out}/actions.jsonl, findings.jsonl, withheld.jsonl, "
              "withheld_records.jsonl, dead_letters.jsonl, summary.json")


def _more(count: int) -> None:
    if count > _SHOWN:
        print(f"  … and {count - _SHOWN} more (--json or --out DIR for all)")


def _when(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts / 1000))
