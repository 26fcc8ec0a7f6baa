"""The hourly utilization rollup of the Iceberg lake (`<lake.namespace>.utilization_hourly`).

One row per hour (of `window_start`), cluster, pool, zone, accelerator and `allocated`: the
windows, device-hours, utilization- and memory-hours (util_mean and mem_used_frac times the
window's hours) and the peak, i.e. the sums every utilization timeline is made of. A year of
10,000 GPUs is about 1.5 M raw rows an hour against a few thousand rollup rows.

`fleetpulse lake compact` keeps it (`refresh`): a day is rolled up again when the utilization
rows its day partition holds (from the manifests: no data read) differ from the `day_rows`
its rollup rows record, so late rows and replays are picked up; compaction keeps the count.
Readers (pipeline/lake/query.py) answer `utilization_timeline` over a range of at least
lake.rollup_min_range_s from the view `utilization_hourly`: the rollup's rows for the days
whose count still matches, and the same aggregation of the raw rows for the other days. So a
stale or missing rollup changes the cost of a query, never its answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from pipeline.lake.tables import TABLES

ROLLUP_TABLE = "utilization_hourly"
SOURCE_TABLE = "utilization"
ROLLUP_SCHEMA = pa.schema([
    ("hour", pa.timestamp("us")),
    ("cluster", pa.string()),
    ("pool", pa.string()),
    ("zone", pa.string()),
    ("accelerator", pa.string()),
    ("allocated", pa.bool_()),
    ("windows", pa.int64()),
    ("device_hours", pa.float64()),
    ("util_hours", pa.float64()),
    ("util_max", pa.float64()),
    ("mem_hours", pa.float64()),
    ("day_rows", pa.int64()),  # the utilization rows of the hour's day when it was rolled up
])
KEYS = "cluster, pool, zone, accelerator, allocated"
# The hourly aggregation of raw utilization rows ({source}: a relation with its columns). The
# rollup is built with it and readers use it for days the rollup lacks: one definition.
HOURLY_SQL = f"""
SELECT date_trunc('hour', window_start) AS hour, {KEYS},
       count(*)::BIGINT AS windows,
       sum(window_s::DOUBLE / 3600) AS device_hours,
       sum(util_mean * (window_s::DOUBLE / 3600)) AS util_hours,
       max(util_max) AS util_max,
       sum(mem_used_frac * (window_s::DOUBLE / 3600)) AS mem_hours
FROM {{source}}
GROUP BY ALL
"""
# Partial aggregates (one per data file) merged into one row per key.
MERGE_SQL = f"""
SELECT hour, {KEYS}, sum(windows)::BIGINT AS windows, sum(device_hours) AS device_hours,
       sum(util_hours) AS util_hours, max(util_max) AS util_max, sum(mem_hours) AS mem_hours
FROM partials
GROUP BY ALL
"""
# utilization_timeline (sql/analyses/utilization_timeline.sql) over hourly rows: the same
# columns and rounding. The whole hours of the range ($inner_since..$inner_until) come from
# utilization_hourly, the part-hours at its ends from the raw rows (aggregated the same way).
_EDGES = """(SELECT * FROM utilization
        WHERE window_start >= $since AND window_start < $until
          AND NOT (window_start >= $inner_since AND window_start < $inner_until))"""
TIMELINE_SQL = f"""
SELECT time_bucket($bucket, hour) AS bucket,
       COLUMNS(lambda c: c = $by),
       round(sum(device_hours), 3) AS device_hours,
       round(sum(util_hours) / sum(device_hours), 2) AS util_mean_pct,
       round(max(util_max), 2) AS util_peak_pct,
       round(100 * coalesce(sum(device_hours) FILTER (WHERE allocated), 0) / sum(device_hours), 2)
           AS allocated_pct,
       round(100 * sum(mem_hours) / sum(device_hours), 2) AS mem_used_pct
FROM (
    SELECT * FROM utilization_hourly WHERE hour >= $inner_since AND hour < $inner_until
    UNION ALL
    {HOURLY_SQL.format(source=_EDGES)}
)
WHERE $pool IS NULL OR pool = $pool
GROUP BY ALL
ORDER BY 1, 2
"""
HOUR = timedelta(hours=1)


def rolled_up_days(rows: pa.Table) -> dict[str, int]:
    """The `day_rows` each day of the rollup (`rows`: its hour and day_rows) was built from."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        found = con.from_arrow(rows).aggregate(
            "strftime(CAST(hour AS DATE), '%Y-%m-%d') AS day, max(day_rows) AS n").fetchall()
    finally:
        con.close()
    return {str(day): int(n) for day, n in found}


def aggregate_files(keys: list[str], filesystem: Any) -> pa.Table:
    """The hourly rows of the utilization files `keys` (S3 keys), one file at a time (a day of
    a big fleet does not fit in memory at once), merged."""
    spec = TABLES[SOURCE_TABLE]
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        partials = []
        for key in keys:
            rows = ds.dataset(key, format="parquet", filesystem=filesystem).to_table(
                columns=[f.name for f in spec.schema
                         if f.name in {"window_start", "window_s", "cluster", "pool", "zone",
                                       "accelerator", "allocated", "util_mean", "util_max",
                                       "mem_used_frac"}])
            con.register("raw", rows)
            partials.append(con.sql(HOURLY_SQL.format(source="raw")).to_arrow_table())
            con.unregister("raw")
        if not partials:
            return ROLLUP_SCHEMA.empty_table().drop_columns(["day_rows"])
        con.register("partials", pa.concat_tables(partials))
        merged = con.sql(MERGE_SQL).to_arrow_table()
    finally:
        con.close()
    return merged


def day_filter(start: datetime) -> str:
    """`hour` within the day that starts at `start` (a pyiceberg row filter)."""
    end = start + timedelta(days=1)
    return f"hour >= '{_iso(start)}' AND hour < '{_iso(end)}'"


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")


def usable(params: Mapping[str, Any], min_range_s: int) -> bool:
    """Whether utilization_timeline with `params` may read the rollup: a range of at least
    `min_range_s`, in buckets of whole hours."""
    since, until, bucket = params.get("since"), params.get("until"), params.get("bucket")
    if not (isinstance(since, datetime) and isinstance(until, datetime)
            and isinstance(bucket, timedelta)):
        return False
    return (bucket >= HOUR and bucket % HOUR == timedelta(0)
            and (until - since).total_seconds() >= max(min_range_s, 2 * 3600))


def timeline_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """TIMELINE_SQL's parameters: utilization_timeline's and the whole hours within
    since..until (inner_since, inner_until)."""
    since, until = params["since"], params["until"]
    floor = until.replace(minute=0, second=0, microsecond=0)
    ceil = since.replace(minute=0, second=0, microsecond=0)
    if ceil < since:
        ceil += HOUR
    return {**params, "inner_since": ceil, "inner_until": floor}


def reader_views_sql() -> list[str]:
    """The DuckDB views over `stored_utilization_hourly` (the rollup's files),
    `utilization_days` (day, rows: the current raw rows per day) and the `utilization` view:
    `utilization_hourly`: rollup rows of the days it has up to date (or that the raw table no
    longer holds), the raw rows aggregated for the rest."""
    columns = f"hour, {KEYS}, windows, device_hours, util_hours, util_max, mem_hours"
    return [
        "CREATE OR REPLACE VIEW rollup_fresh_days AS "
        "SELECT DISTINCT CAST(h.hour AS DATE) AS day FROM stored_utilization_hourly h "
        "LEFT JOIN utilization_days d ON CAST(h.hour AS DATE) = d.day "
        "WHERE d.rows IS NULL OR h.day_rows = d.rows",  # none: the raw day is past retention
        f"CREATE OR REPLACE VIEW utilization_hourly AS "
        f"SELECT {columns} FROM stored_utilization_hourly "
        f"WHERE CAST(hour AS DATE) IN (SELECT day FROM rollup_fresh_days) "
        f"UNION ALL SELECT {columns} FROM ("
        + HOURLY_SQL.format(
            source="(SELECT * FROM utilization WHERE CAST(window_start AS DATE) "
                   "NOT IN (SELECT day FROM rollup_fresh_days))")
        + ")",
    ]
