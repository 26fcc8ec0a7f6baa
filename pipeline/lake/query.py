"""DuckDB over the Parquet lake: one view per table (sql/*.sql) and canned analyses
(sql/analyses/*.sql, one question per file).

No DuckDB database file is kept: each `Lake` is an in-memory DuckDB that reads the Parquet files
the sink has renamed into place, so readers never block the writer. The files to read are listed
here in Python (`visible_files`), which hides files a compaction has already merged; they reach
DuckDB through its Python API, never pasted into SQL text. Each table first appears as
`stored_<table>`: every stored row, with every column of its current schema (NULL where old
files lack one); then as `raw_<table>`: each row once (see below); the view in sql/<table>.sql
builds on that.

Each row once: a crash replay rewrites the same files, and the sink skips records at offsets
the lake already holds (a consumer-group reset to an earlier offset; pipeline/sinks/
lake/sink.py). An ingest adapter restarted without its checkpoint sends the same records
again at new offsets: for the tables it fills (xid, capacity) and the small ones (actions,
alerts), `raw_<table>` keeps one row per `TableSpec.key` (the id, else the whole row), so every
query counts such a record once. See README.md, "Lake".

A file that cannot be read (pipeline/lake/check.py) is left out of the views and named in
a warning (`Lake.skipped`); queries answer over the rest. If a query fails on damage the cheap
check cannot see (data pages behind an intact footer), the files are read in full to find the
damaged one, which is then left out too, and the query runs again.

Query parameters are always bound (`$since`, `$until`, `$pool`, `$bucket`, `$idle_pct`).

A question asked of several dimensions is one query with a parameter whose values its header
lists (`-- param by: pool, zone, accelerator`, the first the default; the query picks the
column with DuckDB's `COLUMNS(lambda c: c = $by)`, so the column keeps its name), never one file
per dimension. The names of the files it replaced stay, as aliases with the value set
(`-- alias utilization_by_pool: by=pool`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from pipeline.catalog import accelerator_prices, xid_catalog
from pipeline.catalog.accelerators import accelerator_types
from pipeline.config import LakeSettings
from pipeline.errors import FleetPulseError
from pipeline.lake import iceberg_rollup
from pipeline.lake.check import QUARANTINE_DIR, check_file, readable_files
from pipeline.lake.iceberg_read import IcebergSource
from pipeline.lake.tables import TABLES, TableSpec
from pipeline.lake.writer import partition_dirs, visible_files

_PARAM = re.compile(r"\$([a-z_]+)\b")
_SQL_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("ms"): "TIMESTAMP",
    pa.list_(pa.string()): "VARCHAR[]",
    pa.map_(pa.string(), pa.string()): "MAP(VARCHAR, VARCHAR)",
}
# Tables a Lake with a fetch_range fetches from Iceberg for that range only: utilization, the
# big one, which every canned query reads only within since..until (the others are read whole:
# some queries look back before `since`, e.g. the state a node was in).
PRUNED = frozenset({"utilization"})
_RETRIES = 5  # a compaction may delete a file between our listing and DuckDB opening it
# Errors in the query itself: no lake file is to blame, so none is looked for.
_QUERY_FAULTS = (
    duckdb.ParserException, duckdb.SyntaxException, duckdb.BinderException,
    duckdb.CatalogException, duckdb.ConversionException, duckdb.OutOfRangeException,
    duckdb.NotImplementedException, duckdb.TypeMismatchException,
)
log = logging.getLogger(__name__)


class QueryError(FleetPulseError):
    """A query could not run: unknown name, missing parameter, or a DuckDB error."""


@dataclass(frozen=True)
class CannedQuery:
    name: str
    question: str
    sql: str
    params: tuple[str, ...]  # the $names the SQL binds
    # a parameter's allowed values (the first is its default), from `-- param NAME: a, b`
    choices: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # an alias: the query it names (`alias_of`) and the values it sets, from `-- alias`
    fixed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    alias_of: str | None = None
    aliases: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    seconds: float = 0.0

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def canned_queries() -> dict[str, CannedQuery]:
    """Every canned analysis by name (the file name without .sql), in name order, and the
    aliases of each (the old names of a question asked per dimension)."""
    folder = resources.files("pipeline.sql") / "analyses"
    queries = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            query = _parse_canned(entry.name.removesuffix(".sql"), entry.read_text())
            queries[query.name] = query
            for alias, values in query.aliases.items():
                queries[alias] = replace(query, name=alias, fixed=values, alias_of=query.name,
                                         aliases={})
    return dict(sorted(queries.items()))


def _parse_canned(name: str, text: str) -> CannedQuery:
    where = f"sql/analyses/{name}.sql"
    question = ""
    body: list[str] = []
    choices: dict[str, tuple[str, ...]] = {}
    aliases: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-- question:"):
            question = stripped.removeprefix("-- question:").strip()
        elif stripped.startswith("-- param "):
            param, values = _header(where, stripped.removeprefix("-- param "))
            choices[param] = tuple(v.strip() for v in values.split(","))
        elif stripped.startswith("-- alias "):
            alias, setting = _header(where, stripped.removeprefix("-- alias "))
            param, _, value = setting.partition("=")
            aliases[alias] = {param.strip(): value.strip()}
        elif stripped.startswith("--") and question and not body and not choices:
            question += " " + stripped.removeprefix("--").strip()
        elif not stripped.startswith("--"):
            body.append(line)
    if not question:
        raise QueryError(f"{where}: expected a '-- question:' comment")
    sql = "\n".join(body).strip().rstrip(";")
    params = tuple(dict.fromkeys(_PARAM.findall(sql)))
    for alias, settings in aliases.items():
        for param, value in settings.items():
            allowed = ", ".join(choices.get(param, ())) or "no values"
            if value not in choices.get(param, ()):
                raise QueryError(f"{where}: alias {alias}: expected {param} to be one of "
                                 f"{allowed}, got {value!r}")
    return CannedQuery(name=name, question=question, sql=sql, params=params, choices=choices,
                       aliases=aliases)


def _header(where: str, text: str) -> tuple[str, str]:
    """`NAME: rest` of a `-- param` or `-- alias` line."""
    name, sep, rest = text.partition(":")
    if not sep or not name.strip().isidentifier():
        raise QueryError(f"{where}: expected '-- param NAME: a, b' or '-- alias NAME: p=v', "
                         f"got {text!r}")
    return name.strip(), rest.strip()


def adhoc_query(text: str) -> CannedQuery:
    """Ad-hoc SQL as a query whose $parameters bind like a canned one's."""
    sql = text.strip().rstrip(";")
    return CannedQuery("ad hoc", "", sql, tuple(dict.fromkeys(_PARAM.findall(sql))))


def parse_duration(text: str) -> timedelta:
    """'90s', '15m', '24h', '7d' → timedelta."""
    match = re.fullmatch(r"(\d+)\s*([smhd])", text.strip())
    if match is None:
        raise QueryError(f"duration {text!r}: expected a number and a unit, like 15m, 24h or 7d")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match[2]]
    try:
        return timedelta(**{unit: int(match[1])})
    except OverflowError:
        raise QueryError(f"duration {text!r} is too long: like 15m, 24h or 7d") from None


def parse_time(text: str) -> datetime:
    """An ISO 8601 time ('2026-01-01T12:00', zone optional, UTC assumed) → naive UTC datetime."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise QueryError(f"time {text!r}: expected ISO 8601, like 2026-01-01T12:00Z") from None
    return when.astimezone(UTC).replace(tzinfo=None) if when.tzinfo else when


def require_lake(root: Path | str, settings: LakeSettings | None = None) -> Path:
    """`root` as a Path when it holds a lake: at least one Parquet file of a table (readable
    or not, or quarantined). A folder holding none is a QueryError naming the folder and what
    was expected: `sql`, `report` and `lake status` answered such a folder (a typo, the wrong
    --lake) with empty results and exit 0, a report dated 1970."""
    root = Path(root)
    if settings is not None and settings.uri:  # the Iceberg tables: their catalog decides
        return root
    if not root.is_dir():
        raise QueryError(f"lake folder {root} does not exist (see lake.path or --lake)")
    for name in TABLES:
        if any(any(d.glob("*.parquet")) for d in partition_dirs(root, name)):
            return root
    if any((root / QUARANTINE_DIR).rglob("*.parquet")):
        return root
    raise QueryError(
        f"{root} holds no lake: expected Parquet files under <table>/date=YYYY-MM-DD/hour=HH/ "
        f"for one of {', '.join(TABLES)} (written by `fleetpulse sink lake` or "
        "`fleetpulse demo`); check --lake or lake.path"
    )


class Lake:
    """A read-only DuckDB view of the lake at `root`. Open one per query session."""

    def __init__(
        self, root: Path | str, settings: LakeSettings | None = None, *, locked: bool = True,
        fetch_range: tuple[datetime, datetime] | None = None,
    ) -> None:
        self.root = Path(root)
        self.settings = settings or LakeSettings()
        # Iceberg only: the big table (PRUNED) is fetched for the days of this range only;
        # a query bound to a range outside it fetches the rest (bind)
        self.fetch_range = fetch_range if self.settings.uri else None
        # lake.uri set: the Iceberg tables (pipeline/lake/iceberg.py), not the folder
        self._iceberg: IcebergSource | None = None
        if self.settings.uri:
            self._iceberg = IcebergSource(self.settings)
        elif not self.root.is_dir():
            raise QueryError(f"lake folder {self.root} does not exist (see lake.path or --lake)")
        self.skipped: dict[Path, str] = {}  # unreadable files left out of the views, and why
        self._files: dict[str, list[Path]] = {}  # the files each raw_<table> reads
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET TimeZone = 'UTC'")
        if locked:
            self._lock()
        self._register_reference_tables()
        self._register_tables()

    def _lock(self) -> None:
        """Our own queries (report, canned analyses, lake status) read the lake's files and
        nothing else: no other file, no network, no extension, and no SET that undoes it.
        Ad-hoc `fleetpulse sql` opens with locked=False: the user's own rights. The lake
        folder stays allowed for writes too (DuckDB has no read-only directory), so a COPY
        into it would pass; our queries have none, and their parameters are bound."""
        lake = str(self.root.resolve()) + "/"
        dirs = [lake]
        if self._iceberg is not None:  # the local copies of the Iceberg tables' files
            dirs = [str(self._iceberg.cache.resolve()) + "/"]
        self.con.execute("SET allowed_directories = $dirs", {"dirs": dirs})
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run any SQL over the views; `params` are bound to `$name` placeholders."""
        started = time.perf_counter()
        moved = 0
        while True:  # each turn returns, raises, or has one more file listed anew or left out
            try:
                cursor = self.con.execute(query, dict(params) if params else None)
                columns = [d[0] for d in cursor.description] if cursor.description else []
                rows = cursor.fetchall() if cursor.description else []
                return Result(columns, rows, time.perf_counter() - started)
            except duckdb.CatalogException as exc:
                raise QueryError(self._unknown_name(exc)) from None
            except _QUERY_FAULTS as exc:
                raise QueryError(_first_line(exc)) from None
            except duckdb.IOException as exc:
                moved += 1
                if moved == _RETRIES:
                    raise QueryError(
                        f"lake files kept changing under the query: {_first_line(exc)}"
                    ) from None
                time.sleep(0.02 * moved)
                self._register_tables()  # a compaction moved files: list them again
            except duckdb.Error as exc:
                if not self._find_damaged(str(exc)):
                    raise QueryError(_first_line(exc)) from None
                self._register_tables()

    def views(self) -> list[str]:
        """The names a query can read: the lake's tables and the reference tables."""
        rows = self.con.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE NOT starts_with(table_name, 'raw_') AND NOT starts_with(table_name, 'stored_') "
            "ORDER BY table_name"
        ).fetchall()
        return [str(row[0]) for row in rows]

    def _unknown_name(self, exc: duckdb.Error) -> str:
        """DuckDB's first line and its "Did you mean" hint; for an unknown table, then every
        view there is (DuckDB suggests only the nearest name, which may not be the one meant)."""
        lines = [line for line in str(exc).splitlines() if line.strip()]
        hint = next((line for line in lines if line.startswith("Did you mean")), "")
        message = " ".join(filter(None, [lines[0] if lines else str(exc), hint]))
        if "Table with name" not in message:  # an unknown function or type: views don't help
            return message
        return f"{message} The lake has: {', '.join(self.views())}."

    def run(self, name: str, **params: Any) -> Result:
        """Run a canned analysis. since/until default to the last 24 h of data in the lake."""
        query = canned_queries().get(name)
        if query is None:
            raise QueryError(f"no canned query {name!r}: try one of {', '.join(canned_queries())}")
        bound = self.bind(query, params)
        if (self._iceberg is not None and (query.alias_of or query.name) == "utilization_timeline"
                and iceberg_rollup.usable(bound, self.settings.rollup_min_range_s)):
            self._register_rollup(self._iceberg)  # a long range: the hourly rollup
            return self.sql(iceberg_rollup.TIMELINE_SQL, iceberg_rollup.timeline_params(bound))
        return self.sql(query.sql, bound)

    def _register_rollup(self, source: IcebergSource) -> None:
        """The view `utilization_hourly` (pipeline/lake/iceberg_rollup.py): the rollup's rows
        for the days it has up to date, the raw rows aggregated for the others."""
        paths, days = source.rollup()
        good = []
        for path in paths:  # a damaged copy is left out: its days count as not rolled up
            reason = self.skipped.get(path) or check_file(path)
            if reason is None:
                good.append(path)
            else:
                self._skip(path, reason)
        if good:
            rollup = self.con.read_parquet([str(p) for p in good])
        else:
            rollup = self.con.from_arrow(iceberg_rollup.ROLLUP_SCHEMA.empty_table())
        rollup.create_view("stored_utilization_hourly", replace=True)
        counts = pa.table({
            "day": pa.array([datetime.strptime(d, "%Y-%m-%d").date() for d in days], pa.date32()),
            "rows": pa.array(list(days.values()), pa.int64()),
        })
        self.con.from_arrow(counts).create_view("utilization_days", replace=True)
        for statement in iceberg_rollup.reader_views_sql():
            self.con.execute(statement)

    def bind(self, query: CannedQuery, given: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters `query` uses, from `given` or defaults; unknown ones are errors."""
        takes = [p for p in query.params if p not in query.fixed]
        extra = {k for k, v in given.items() if v is not None} - set(takes)
        if extra & set(query.fixed):
            fixed = ", ".join(f"{k}={v}" for k, v in query.fixed.items())
            raise QueryError(f"query {query.name!r} is {query.alias_of!r} with {fixed}; "
                             f"run {query.alias_of!r} to choose {', '.join(sorted(extra))}")
        if extra:
            raise QueryError(f"query {query.name!r} takes no {', '.join(sorted(extra))}; "
                             f"it takes {', '.join(takes) or 'no parameters'}")
        until = given.get("until") or self.latest() or datetime.now(UTC).replace(tzinfo=None)
        defaults = {
            "until": until,
            "since": until - timedelta(hours=24),
            "pool": None,
            "bucket": timedelta(hours=1),
            "idle_pct": self.settings.idle_util_pct,
            "target": None,  # why_not_removed: every target's
        }
        defaults |= {param: allowed[0] for param, allowed in query.choices.items()}
        values = {**defaults, **{k: v for k, v in given.items() if v is not None}, **query.fixed}
        if self.fetch_range is not None and not _within(values, self.fetch_range):
            self.fetch_range = None  # the whole table, as an unpruned Lake reads it
            self._register_tables()
        missing = [p for p in query.params if p not in values]
        if missing:
            raise QueryError(f"query {query.name!r} needs {', '.join(missing)}")
        for param, allowed in query.choices.items():
            if values.get(param) not in allowed:
                raise QueryError(f"query {query.name!r}: expected {param} to be one of "
                                 f"{', '.join(allowed)}, got {values.get(param)!r}")
        return {p: values[p] for p in query.params}

    def latest(self) -> datetime | None:
        """End of the newest utilization window or event in the lake (the default `until`)."""
        result = self.sql(
            "SELECT max(t) FROM (SELECT max(window_start + to_seconds(window_s)) AS t "
            "FROM utilization UNION ALL SELECT max(ts) FROM findings "
            "UNION ALL SELECT max(ts) FROM node_state)"
        )
        latest = result.rows[0][0] if result.rows else None
        return latest if isinstance(latest, datetime) else None

    def earliest(self) -> datetime | None:
        """Start of the oldest utilization window or event in the lake."""
        result = self.sql(
            "SELECT min(t) FROM (SELECT min(window_start) AS t FROM utilization "
            "UNION ALL SELECT min(ts) FROM findings UNION ALL SELECT min(ts) FROM node_state)"
        )
        earliest = result.rows[0][0] if result.rows else None
        return earliest if isinstance(earliest, datetime) else None

    def tables(self) -> dict[str, int]:
        """Visible files per table."""
        if self._iceberg is not None:
            return {name: len(self._iceberg.data_files(spec)) for name, spec in TABLES.items()}
        return {name: len(visible_files(self.root, name)) for name in TABLES}

    # --- registration ----------------------------------------------------------------------

    def _register_tables(self) -> None:
        for attempt in range(_RETRIES):
            try:
                for spec in TABLES.values():
                    self._raw_relation(spec).create_view(f"stored_{spec.name}", replace=True)
                    self.con.execute(_once_sql(spec))
                for spec in TABLES.values():
                    self.con.execute(_view_sql(spec.name))
                return
            except duckdb.IOException as exc:
                if attempt == _RETRIES - 1:
                    raise QueryError(f"lake files kept changing while listed: {exc}") from None
                time.sleep(0.02 * attempt)
            except duckdb.Error as exc:  # DuckDB refused a footer that pyarrow read: name it
                raise QueryError(f"cannot open the lake: {_first_line(exc)}") from None

    def _raw_relation(self, spec: TableSpec) -> duckdb.DuckDBPyRelation:
        if self._iceberg is not None:
            return self._iceberg_relation(self._iceberg, spec)
        paths, bad = readable_files(self.root, spec.name)
        for damaged in bad:
            self._skip(damaged.path, damaged.reason)
        self._files[spec.name] = paths
        files = [str(path) for path in paths]
        if not files:
            empty = self.con.from_arrow(spec.schema.empty_table())
            partitions = "NULL::DATE AS date, NULL::BIGINT AS hour"
            return empty.project(f"{_projection(spec, set())}, {partitions}")
        relation = self.con.read_parquet(files, hive_partitioning=True, union_by_name=True)
        found = set(relation.columns)
        extras = [c for c in ("date", "hour") if c in found]
        return relation.project(", ".join([_projection(spec, found), *extras]))

    def _iceberg_relation(self, source: IcebergSource, spec: TableSpec) -> duckdb.DuckDBPyRelation:
        """The table's current data files, from their local copies (IcebergSource), read as
        the local lake's are; `date` and `hour` are computed from the time column."""
        days = _fetch_days(self.fetch_range) if spec.name in PRUNED else None
        paths = []
        for path in source.local_files(spec, days):  # a damaged copy is left out, as locally
            reason = self.skipped.get(path) or check_file(path)
            if reason is None:
                paths.append(path)
            else:
                self._skip(path, reason)
        for path, reason in source.unfetchable.items():  # gone from the bucket, or refused
            self._skip(path, reason)
        self._files[spec.name] = paths
        files = [str(path) for path in paths]
        first = f'"{spec.columns[0].name}"'
        if not files:
            empty = self.con.from_arrow(spec.schema.empty_table())
            return empty.project(f"{_projection(spec, set())}, "
                                 "NULL::DATE AS date, NULL::BIGINT AS hour")
        relation = self.con.read_parquet(files, hive_partitioning=False, union_by_name=True)
        partitions = f"CAST({first} AS DATE) AS date, hour({first})::BIGINT AS hour"
        return relation.project(f"{_projection(spec, set(relation.columns))}, {partitions}")

    def _skip(self, path: Path, reason: str) -> None:
        if path not in self.skipped:
            self.skipped[path] = reason
            log.warning("warning: skipped unreadable lake file %s: %s", path, reason)

    def _find_damaged(self, error: str) -> bool:
        """After a failed read: read the files in full to find the damaged ones (the files the
        error names first). True if one was found (and is left out from now on)."""
        listed = [path for paths in self._files.values() for path in paths]
        named = [path for path in listed if str(path) in error]
        if listed and not named:
            log.warning("warning: a query failed (%s); reading every lake file in full to find "
                        "a damaged one", _first_line(error))
        for group in (named, listed):
            found = False
            for path in group:
                with contextlib.suppress(FileNotFoundError):
                    reason = check_file(path, deep=True)
                    if reason is not None:
                        self._skip(path, reason)
                        found = True
            if found:
                return True
        return False

    def _register_reference_tables(self) -> None:
        self.con.from_arrow(self._prices()).create_view("raw_prices", replace=True)
        self.con.from_arrow(_xid_arrow()).create_view("raw_xid_catalog", replace=True)
        accelerators = _accelerators_arrow()
        self.con.from_arrow(accelerators).create_view("raw_accelerator_types", replace=True)
        for name in ("prices", "xid_catalog", "accelerator_types"):
            self.con.execute(_view_sql(name))

    def _prices(self) -> pa.Table:
        # Config overrides come first: the first matching row wins, as in prices.csv.
        rows = [(pattern, pattern, usd, "config [lake.prices]", "")
                for pattern, usd in sorted(self.settings.prices.items())]
        rows += [(p.accelerator, p.model_match, p.usd_per_hour, p.source, p.as_of)
                 for p in accelerator_prices()]
        names = ["accelerator", "model_match", "usd_per_hour", "source", "as_of"]
        columns = [list(values) for values in zip(*rows, strict=True)] if rows else [[]] * 5
        table = pa.table(dict(zip(names, columns, strict=True)))
        return table.append_column("priority", pa.array(range(len(rows)), pa.int32()))


def _fetch_days(fetch_range: tuple[datetime, datetime] | None
                ) -> tuple[datetime, datetime] | None:
    """What an Iceberg reader fetches of a PRUNED table for queries of `fetch_range`: from an
    hour before its start (capacity_headroom reads the hour before `until`) to its end."""
    if fetch_range is None:
        return None
    since, until = fetch_range
    return (min(since, until - timedelta(hours=1)), until)


def _within(values: Mapping[str, Any], fetch_range: tuple[datetime, datetime]) -> bool:
    """Whether a query bound to `values` reads no PRUNED rows outside `fetch_range` (every
    canned query reads utilization only within since..until)."""
    since, until = values.get("since"), values.get("until")
    if not (isinstance(since, datetime) and isinstance(until, datetime)):
        return False
    return fetch_range[0] <= since and until <= fetch_range[1]


def _projection(spec: TableSpec, found: set[str]) -> str:
    parts = []
    for field in spec.schema:
        if field.name in found:
            parts.append(f'"{field.name}"')
        else:
            parts.append(f'NULL::{_SQL_TYPES[field.type]} AS "{field.name}"')
    return ", ".join(parts)


def _first_line(error: BaseException | str) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _once_sql(spec: TableSpec) -> str:
    """`raw_<table>`: the stored rows; for a table kept once in the views, one per key (any
    of the copies: they are the same record), or distinct whole rows for one without a key."""
    name = spec.name
    if not spec.once_in_views:
        return f"CREATE OR REPLACE VIEW raw_{name} AS SELECT * FROM stored_{name}"
    if not spec.key:
        return f"CREATE OR REPLACE VIEW raw_{name} AS SELECT DISTINCT * FROM stored_{name}"
    key = ", ".join(f'"{column}"' for column in spec.key)
    return (f"CREATE OR REPLACE VIEW raw_{name} AS SELECT * FROM stored_{name} "
            f"QUALIFY row_number() OVER (PARTITION BY {key}) = 1")


def _view_sql(name: str) -> str:
    return (resources.files("pipeline.sql") / f"{name}.sql").read_text()


def _accelerators_arrow() -> pa.Table:
    """catalog/accelerators.csv: canonical types, families, peak dense bf16 TFLOPS (issue 37)."""
    rows = accelerator_types()
    return pa.table({
        "type": [r.type for r in rows],
        "kind": [r.kind for r in rows],
        "match": [r.match for r in rows],
        "family": [r.family for r in rows],
        "bf16_tflops": [r.bf16_tflops for r in rows],
        "source": [r.source for r in rows],
        "priority": pa.array(range(len(rows)), pa.int32()),
    })


def _xid_arrow() -> pa.Table:
    entries = sorted(xid_catalog().values(), key=lambda e: e.code)
    return pa.table({
        "xid": pa.array([e.code for e in entries], pa.int32()),
        "mnemonic": [e.mnemonic for e in entries],
        "description": [e.description for e in entries],
        "severity": [e.severity for e in entries],
        "fatal": [e.fatal for e in entries],
        "action": [e.action for e in entries],
        "application": [e.application for e in entries],
    })


def run_canned(root: Path | str, name: str, settings: LakeSettings | None = None,
               **params: Any) -> Result:
    """Open the lake, run one canned analysis, close it (with since and until given, an
    Iceberg lake fetches the utilization of those days only)."""
    since, until = params.get("since"), params.get("until")
    window = ((since, until) if isinstance(since, datetime) and isinstance(until, datetime)
              else None)
    with Lake(root, settings, fetch_range=window) as lake:
        return lake.run(name, **params)


def run_sql(root: Path | str, query: str, settings: LakeSettings | None = None,
            params: Mapping[str, Any] | None = None) -> Result:
    with Lake(root, settings) as lake:
        return lake.sql(query, params)


__all__: Sequence[str] = (
    "CannedQuery", "Lake", "QueryError", "Result", "adhoc_query", "canned_queries",
    "parse_duration", "parse_time", "run_canned", "run_sql",
)
