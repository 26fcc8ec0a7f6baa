"""`fleetpulse sql`: ad-hoc SQL or a canned analysis over the Parquet lake, as a table, CSV or JSON.

    fleetpulse sql "SELECT pool, count(*) FROM utilization GROUP BY pool"
    fleetpulse sql --query cost_of_idle --since 24h --pool train --format csv
    fleetpulse sql --list

--since/--until/--pool/--bucket are bound to $since/$until/$pool/$bucket in the query (canned
or not), never pasted into it; --param NAME=VALUE binds any other $NAME as text
(`fleetpulse sql --query why_not_removed --param target=node-1`). A question asked per pool,
zone or accelerator model is one query with --param by (`--query utilization_timeline --param
by=zone`, `--query mtbf --param by=accelerator`); the names of the per-dimension queries it
replaced still run, as aliases (utilization_by_pool, mtbf_by_model, ...). --since takes a duration
before --until (24h, 7d) or a time; --until defaults to the end of the newest data in the
lake, so a replayed or simulated day reads the same as a live one.

Ad-hoc SQL runs with your own rights: DuckDB can read and write any file you can (read_csv,
COPY ... TO, ATTACH). Canned analyses (--query), `report` and `lake status` run locked: no
file outside the lake, no network, no SET enable_external_access, lock_configuration on.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, TextIO

from pipeline.config import Settings
from pipeline.lake.query import (
    CannedQuery,
    Lake,
    QueryError,
    Result,
    adhoc_query,
    canned_queries,
    parse_duration,
    require_lake,
)
from pipeline.lake.query import parse_time as parse_iso

_MAX_CELL = 60
_WINDOW = ("since", "until", "pool", "bucket")  # parameters with options of their own


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sql",
        help="query the Parquet lake with DuckDB (ad hoc or a canned analysis)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", nargs="?", help="SQL to run over the lake's views")
    parser.add_argument("--query", "-q", metavar="NAME", help="run the canned analysis NAME")
    parser.add_argument("--list", action="store_true", help="list the canned analyses")
    add_window_arguments(parser)
    parser.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                        help="bind $NAME to VALUE (text), e.g. --param target=node-1")
    parser.add_argument("--format", "-f", choices=("table", "csv", "json"), default="table")
    parser.set_defaults(handler=_handle)


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lake", help="lake folder (default: lake.path from the config)")
    parser.add_argument("--since", help="start: a duration before --until (24h, 7d) or a time")
    parser.add_argument("--until", help="end: a time (UTC if no zone) or 'now' "
                        "(default: end of the newest data in the lake)")
    parser.add_argument("--pool", help="only this pool")
    parser.add_argument("--bucket", help="time bucket of timelines (default 1h)")


def window_params(args: argparse.Namespace, lake: Lake | None) -> dict[str, Any]:
    """--since/--until/--pool/--bucket as query parameters (None where not given); `lake`
    (for the newest data) may be None when --until is given."""
    until = None
    if args.until:
        until = (datetime.now(UTC).replace(tzinfo=None) if args.until == "now"
                 else parse_iso(args.until))
    since = None
    if args.since:
        if args.since[0].isdigit() and args.since[-1] in "smhd":
            latest = lake.latest() if lake is not None and until is None else None
            anchor = until or latest or datetime.now(UTC).replace(tzinfo=None)
            since, until = _before(anchor, args.since), anchor
        else:
            since = parse_iso(args.since)
    bucket = parse_duration(args.bucket) if args.bucket else None
    return {"since": since, "until": until, "pool": args.pool, "bucket": bucket}


def fetch_window(args: argparse.Namespace) -> tuple[dict[str, Any] | None,
                                                  tuple[datetime, datetime] | None]:
    """The window when --until (and --since) fix it without the lake, and its range: what an
    Iceberg lake then fetches of utilization (Lake's fetch_range). (None, None) otherwise."""
    if not args.until:
        return None, None
    window = window_params(args, None)
    since, until = window["since"], window["until"]
    return window, ((since, until) if since is not None and until is not None else None)


def _before(anchor: datetime, duration: str) -> datetime:
    """`anchor` minus --since's duration; a duration reaching before the year 1 is an error."""
    try:
        return anchor - parse_duration(duration)
    except OverflowError:
        raise QueryError(
            f"--since {duration}: reaches back before the year 1; give a shorter duration "
            "(like 30d) or a start time (like 2026-01-01T00:00Z)"
        ) from None


def _handle(args: argparse.Namespace, settings: Settings) -> int:
    if args.list:
        _print_list(sys.stdout)
        return 0
    if bool(args.text) == bool(args.query):
        raise QueryError("give either SQL text or --query NAME (see --list)")
    # a canned analysis runs locked like `report`; ad-hoc SQL has the user's own rights
    root = require_lake(args.lake or settings.lake.path, settings.lake)
    window, fetch = fetch_window(args) if args.query else (None, None)
    with Lake(root, settings.lake, locked=bool(args.query), fetch_range=fetch) as lake:
        query = _query(args)
        window = window or window_params(args, lake)
        given = {k: v for k, v in window.items() if v is not None}
        given |= _named_params(args.param)
        result = lake.sql(query.sql, lake.bind(query, given))
    write_result(result, args.format, sys.stdout)
    if args.format == "table":
        print(f"({len(result.rows)} rows, {result.seconds:.3f} s)", file=sys.stderr)
    return 0


def _named_params(pairs: list[str]) -> dict[str, str]:
    """--param NAME=VALUE as text parameters; the window's own have their options."""
    named: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise QueryError(f"--param {pair!r}: expected NAME=VALUE, e.g. target=node-1")
        if name in _WINDOW:
            raise QueryError(f"--param {name}: give --{name} instead (it is parsed as one)")
        named[name] = value
    return named


def _query(args: argparse.Namespace) -> CannedQuery:
    if args.query:
        query = canned_queries().get(args.query)
        if query is None:
            raise QueryError(f"no canned query {args.query!r}: see fleetpulse sql --list")
        return query
    return adhoc_query(args.text)


def _print_list(out: TextIO) -> None:
    for query in canned_queries().values():
        if query.alias_of is not None:
            fixed = " ".join(f"--param {k}={v}" for k, v in query.fixed.items())
            out.write(f"{query.name}  [= --query {query.alias_of} {fixed}]\n")
            continue
        params = " ".join(_option(query, p) for p in query.params if p != "idle_pct")
        out.write(f"{query.name}  [{params}]\n    {query.question}\n")


def _option(query: CannedQuery, param: str) -> str:
    if param in _WINDOW:
        return f"--{param}"
    allowed = query.choices.get(param)
    return f"--param {param}={'|'.join(allowed)}" if allowed else f"--param {param}=…"


def write_result(result: Result, fmt: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(json.dumps([{k: plain(v) for k, v in r.items()} for r in result.records()],
                             indent=2) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([[_text(v) for v in row] for row in result.rows])
    else:
        out.write(format_table(result))


def format_table(result: Result) -> str:
    cells = [[_text(v)[:_MAX_CELL] for v in row] for row in result.rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(result.columns)]
    numeric = [all(isinstance(row[i], int | float | Decimal) or row[i] is None
                   for row in result.rows) for i in range(len(result.columns))]
    buffer = io.StringIO()

    def line(values: list[str]) -> None:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        buffer.write("  ".join(parts).rstrip() + "\n")

    line(result.columns)
    line(["-" * w for w in widths])
    for row in cells:
        line(row)
    return buffer.getvalue()


def plain(value: Any) -> Any:
    """A JSON-ready value: times as ISO 8601 UTC, decimals as floats, lists and maps kept."""
    if isinstance(value, datetime):
        return value.isoformat() + ("Z" if value.tzinfo is None else "")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return format(value, ".6f").rstrip("0").rstrip(".") if abs(value) < 1e15 else str(value)
    if isinstance(value, list | dict):
        return json.dumps(plain(value))
    return str(value)
