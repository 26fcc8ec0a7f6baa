"""`fleetpulse report`: one self-contained HTML file about the fleet over a period.

Charts (inline SVG, pipeline/report/charts.py): fleet utilization over time per pool, health
changes and actions over time, XIDs by node × time, capacity headroom, cost of idle. Tables: top
offenders, open actions, TPU slice availability, degraded ICI links, cost per useful
accelerator-hour, MTBF per pool, quota headroom, the prices used; then Capacity
(pipeline/report/capacity.py: the snapshot per zone and type, any crunch, targets out of service
too long) with the accelerator types compared, reservations, the quota outlook and time back in
service. The tables come from the canned
analyses in sql/analyses, so the report and `fleetpulse sql --query …` never disagree. A row that
names a node or slice links to that target's section at the end (its findings, actions, why
proposals were not acted on, utilization and XIDs over the window, from _TARGET_SQL); a target's
utilization is one row for all its devices (a 64-chip slice was 64 rows), naming the least used
device. Tables are for people: headers in words (the query's column name stays in `data-column`),
numbers rounded by what they are (percentages to 0.1, dollars to the cent, counts with thousands
separators), names in natural order (node-2 before node-10) where the query leaves a tie, and long
text wrapped so that no table is wider than the page.

The page runs one small inline script that checks each chart drew something and counts script
errors, and writes the result into the DOM (`<body data-charts-rendered=… data-errors=…>`, and
`data-rendered` on each figure) so a headless browser test can read it with --dump-dom.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from html import escape
from pathlib import Path
from typing import Any

from pipeline.config import CapacitySettings, LakeSettings
from pipeline.lake.query import Lake, Result
from pipeline.report.capacity import capacity_section, free_over_time_chart
from pipeline.report.charts import (
    PALETTE,
    Marker,
    Part,
    Series,
    bar_chart,
    heatmap,
    line_chart,
    timeline_chart,
)

CHARTS = ("utilization", "health", "xid", "capacity", "cost", "capacity_time")
HEATMAP_ROWS = 25
ACTION_COLORS = {"cordon": "#e15759", "drain": "#b07aa1", "uncordon": "#59a14f"}
_BUCKETS = [timedelta(minutes=m) for m in (5, 15, 30, 60, 180, 360, 720, 1440)]


def pick_bucket(since: datetime, until: datetime) -> timedelta:
    """The smallest bucket that keeps a timeline at or under ~48 bars."""
    span = until - since
    return next((b for b in _BUCKETS if span / b <= 48), _BUCKETS[-1])


def write_report(root: Path | str, out: Path | str, settings: LakeSettings | None = None,
                 since: datetime | None = None, until: datetime | None = None,
                 pool: str | None = None, capacity: CapacitySettings | None = None) -> Path:
    """Render the report for the lake at `root` into `out`; returns the path written."""
    out = Path(out)
    with Lake(root, settings) as lake:
        html = build_report(lake, since, until, pool, capacity)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out


def build_report(lake: Lake, since: datetime | None = None, until: datetime | None = None,
                 pool: str | None = None, capacity: CapacitySettings | None = None) -> str:
    """`capacity`: the [capacity] settings of the Capacity section (its crunch rules)."""
    until = until or lake.latest() or datetime(1970, 1, 2)
    if since is None:
        # the last day, or less when the lake holds less: no empty half-chart
        first = lake.earliest()
        since = until - timedelta(hours=24)
        if first is not None and first > since:
            since = first - (first - datetime(1970, 1, 1)) % timedelta(hours=1)
    bucket = pick_bucket(since, until)
    params: dict[str, Any] = {"since": since, "until": until, "pool": pool, "bucket": bucket}

    def run(name: str) -> Result:
        query_params = {k: v for k, v in params.items() if k in _params_of(name)}
        return lake.run(name, **query_params)

    offenders, open_actions = run("top_offenders"), run("open_actions")
    slices, ici = run("tpu_slice_availability"), run("ici_degraded_links")
    sections = [
        _summary(run("fleet_summary"), since, until, pool),
        _figure("utilization", "Fleet utilization over time, per pool",
                _utilization(run("utilization_by_pool"), since, until)),
        _figure("health", "Health changes (bars, by state entered) and actions (triangles)",
                _health(run("health_timeline"), run("actions_timeline"), bucket, since, until)),
        _figure("xid", f"XID errors by node × {_human(bucket)} (top {HEATMAP_ROWS} nodes)",
                _xid(run("xid_heatmap"), since, until, bucket)),
        _figure("capacity", "Capacity headroom now, per zone and accelerator (devices)",
                _capacity(run("capacity_headroom"))),
        _figure("cost", "Cost of idle at list price, per pool and accelerator (USD)",
                _cost(run("cost_of_idle"))),
        _table("Top offenders", _natural_ties(offenders, "target_name"), link=_target_link),
        _table("Open actions", _natural_ties(open_actions, "target_name"),
               hide=("action_id", "target_kind"), link=_target_link),
        _table("TPU slice availability", _natural_ties(slices, "slice"), link=_slice_link),
        _table("Degraded ICI links", _natural_ties(ici, "slice"), link=_slice_link),
        _table("Cost per useful accelerator-hour (list price / utilization achieved)",
               run("cost_per_useful_hour")),
        _table("MTBF per pool (node- or slice-hours per failure)", run("mtbf_by_pool")),
        _table("Quota headroom", run("quota_headroom")),
        capacity_section(lake, until, capacity),
        _figure("capacity_time", "Healthy free devices over time, per region and accelerator "
                "type (the capacity stage's last snapshot in each bucket; a lake without "
                "snapshots: free at some point in the bucket, not out of service at its end)",
                free_over_time_chart(run("capacity_timeline"), since, until)),
        _table("Accelerator types compared (cost per useful device-hour, per useful bf16 "
               "PFLOP-hour, and per job step where jobs publish step times)",
               run("accelerator_roi")),
        _table("Reservations", run("reservations")),
        _table("Quota outlook (usage trend over the window)", run("quota_outlook")),
        _table("Time back in service (minutes)", run("time_back_in_service")),
        _table("Prices used (on-demand list prices per accelerator-hour)",
               lake.sql("SELECT accelerator, usd_per_hour, source, as_of FROM prices "
                        "ORDER BY priority")),
        _targets(lake, _linked(offenders, open_actions, slices, ici), since, until),
    ]
    if lake.skipped:  # last: a query may have found a damaged file on the way
        sections.insert(0, _skipped(lake.skipped))
    return _page(f"FleetPulse report {since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} UTC",
                 sections)


def _params_of(name: str) -> tuple[str, ...]:
    from pipeline.lake.query import canned_queries

    return canned_queries()[name].params


def _human(bucket: timedelta) -> str:
    minutes = int(bucket.total_seconds() // 60)
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def _utilization(result: Result, since: datetime, until: datetime) -> str:
    by_pool: dict[str, list[tuple[datetime, float]]] = {}
    for row in result.records():
        by_pool.setdefault(row["pool"], []).append((row["bucket"], row["util_mean_pct"] or 0.0))
    series = [Series(pool, points) for pool, points in sorted(by_pool.items())]
    return line_chart("utilization", "Mean utilization per pool", series, since, until)


def _health(states: Result, actions: Result, bucket: timedelta, since: datetime,
            until: datetime) -> str:
    rows = states.records()
    buckets = sorted({r["bucket"] for r in rows})
    names = [s for s in ("healthy", "suspect", "degraded", "cordoned", "draining", "repairing",
                         "probation") if any(r["state"] == s for r in rows)]
    index = {b: i for i, b in enumerate(buckets)}
    stacks = {name: [0.0] * len(buckets) for name in names}
    for r in rows:
        stacks.setdefault(r["state"], [0.0] * len(buckets))[index[r["bucket"]]] += r["transitions"]
    markers = [
        Marker(a["ts"], f"{a['ts']:%Y-%m-%d %H:%M} {a['kind']} {a['target_name']}"
               f"{' (dry run)' if a['dry_run'] else ''}: {a['reason_summary'] or ''}",
               "#999999" if a["dry_run"] else ACTION_COLORS.get(a["kind"], "#4e79a7"))
        for a in actions.records()
    ]
    return timeline_chart("health", "Health and actions", buckets, bucket, stacks, markers,
                          since, until)


def _xid(result: Result, since: datetime, until: datetime, bucket: timedelta) -> str:
    rows = result.records()
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["node"]] = totals.get(r["node"], 0) + r["events"]
    nodes = sorted(totals, key=lambda n: (-totals[n], natural_key(n)))[:HEATMAP_ROWS]
    columns, at = [], since - (since - datetime(1970, 1, 1)) % bucket
    while at < until:
        columns.append(at)
        at += bucket
    values = {(r["node"], r["bucket"]): float(r["events"]) for r in rows if r["node"] in nodes}
    labels = {(r["node"], r["bucket"]): f"XID {r['codes']}" for r in rows}
    return heatmap("xid", "XID events by node and time", nodes, columns, values, labels)


def _capacity(result: Result) -> str:
    rows = result.records()
    labels = [f"{r['zone']} · {r['accelerator']}" for r in rows]
    parts = [Part("out of service", "#e15759", [r["out_of_service"] for r in rows]),
             Part("allocated", "#4e79a7", [r["allocated"] for r in rows]),
             Part("free", "#59a14f", [r["free"] for r in rows])]
    return bar_chart("capacity", "Devices per zone and accelerator", labels, parts)


def _cost(result: Result) -> str:
    rows = [r for r in result.records() if r["usd_per_hour"] is not None]
    labels = [f"{r['pool']} · {r['accelerator']}" for r in rows]
    parts = [
        Part("idle while allocated", PALETTE[1], [r["idle_allocated_cost_usd"] for r in rows]),
        Part("idle, unallocated", PALETTE[9],
             [r["idle_cost_usd"] - r["idle_allocated_cost_usd"] for r in rows]),
    ]
    return bar_chart("cost", "Cost of idle", labels, parts, "$")


def _summary(result: Result, since: datetime, until: datetime, pool: str | None) -> str:
    row = result.records()[0] if result.rows else {}
    cards = "".join(
        f'<div class="card"><div class="value">{escape(_cell(row.get(key), key))}</div>'
        f'<div class="label">{escape(label)}</div></div>'
        for key, label in (("devices", "devices"), ("device_hours", "device-hours"),
                           ("util_mean_pct", "mean utilization %"),
                           ("allocated_pct", "allocated %"),
                           ("idle_allocated_hours", "idle allocated hours"),
                           ("findings", "unhealthy findings"), ("actions", "actions"),
                           ("xid_events", "XID events"), ("alerts_fired", "alerts fired"))
    )
    scope = f"pool {escape(pool)}" if pool else "all pools"
    return (f"<p class=\"period\">{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC, {scope}"
            f"</p><div class=\"cards\">{cards}</div>")


def _skipped(skipped: dict[Path, str]) -> str:
    items = "".join(f"<li><code>{escape(str(path))}</code>: {escape(reason)}</li>"
                    for path, reason in sorted(skipped.items()))
    return (f'<section data-table="skipped-files" class="skipped"><h2>{len(skipped)} unreadable '
            "lake files skipped (their rows are not in this report)</h2>"
            f"<ul>{items}</ul></section>")


def _figure(name: str, caption: str, svg: str) -> str:
    return (f'<figure data-chart="{name}" data-rendered="no"><figcaption>{escape(caption)}'
            f"</figcaption>{svg}</figure>")


Link = Callable[[dict[str, Any]], tuple[str, str, str] | None]


def _table(title: str, result: Result, hide: tuple[str, ...] = (), link: Link | None = None
           ) -> str:
    """A table; `link` says which cell of a row names a target, and so links to its section."""
    shown = [i for i, c in enumerate(result.columns) if c not in hide]
    head = "".join(_th(result.columns[i]) for i in shown)
    rows = []
    for row, record in zip(result.rows, result.records(), strict=True):
        target = link(record) if link else None
        cells = []
        for i in shown:
            text = escape(_cell(row[i], result.columns[i]))
            if target and result.columns[i] == target[0]:
                text = f'<a href="#{anchor(target[1], target[2])}">{text}</a>'
            cells.append(_td(text, row[i]))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    body = "".join(rows)
    if not result.rows:
        body = f'<tr><td colspan="{len(shown)}" class="none">none</td></tr>'
    name = title.split(" (")[0].lower().replace(" ", "-")
    return (f'<section data-table="{escape(name)}"><h2>{escape(title)}</h2>'
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div></section>")


def _th(column: str) -> str:
    return f'<th data-column="{escape(column)}">{escape(_header(column))}</th>'


def _td(text: str, value: Any) -> str:
    """A cell: numbers right-aligned and kept whole; a time may break between its date and
    clock; text may wrap, a long name after its dots, slashes, colons and underscores."""
    if isinstance(value, datetime):
        return f'<td class="time">{text}</td>'
    if _numeric(value):
        return f'<td class="num">{text}</td>'
    return f"<td>{_breakable(text)}</td>"


def _breakable(html: str) -> str:
    """Escaped text with a break opportunity after . / : _ in words too long to fit a cell."""
    return re.sub(r"[^\s<>]{20,}", lambda m: re.sub(r"([./:_])", r"\1<wbr>", m.group(0)), html)


def anchor(kind: str, name: str) -> str:
    """The id of a target's section: readable where the name is, unique where it is not."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    if clean != name:  # two names may clean to one: keep them apart
        clean += "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"target-{kind}-{clean}"


def _target_link(row: dict[str, Any]) -> tuple[str, str, str] | None:
    if row.get("target_kind") and row.get("target_name"):
        return "target_name", row["target_kind"], row["target_name"]
    return None


def _slice_link(row: dict[str, Any]) -> tuple[str, str, str] | None:
    return ("slice", "slice", row["slice"]) if row.get("slice") else None


def _linked(*results: Result) -> list[tuple[str, str]]:
    """Every (kind, name) a table row links to, in the order the tables name them."""
    seen: dict[tuple[str, str], None] = {}
    for result in results:
        for row in result.records():
            target = _target_link(row) or _slice_link(row)
            if target:
                seen[(target[1], target[2])] = None
    return list(seen)


# Per-target detail for the sections table rows link to, over the report's window. $names:
# the targets' names (nodes and slices); a node's rows match `node`, a slice's match `slice`.
DETAIL_ROWS = 20
_TARGET_SQL = {
    "state": """
        SELECT target_kind, target_name, any_value(target_pool) AS pool,
               any_value(target_zone) AS zone, arg_max(state, ts) AS state_now
        FROM node_state
        WHERE ts < $until AND list_contains($names, target_name)
        GROUP BY ALL""",
    "findings": """
        SELECT target_kind, target_name, ts, "check", severity, entity_kind, device, message,
               count(*) OVER (PARTITION BY target_kind, target_name) AS total
        FROM findings
        WHERE NOT healthy AND "check" <> 'heartbeat' AND ts >= $since AND ts < $until
          AND list_contains($names, target_name)
        QUALIFY row_number() OVER (PARTITION BY target_kind, target_name ORDER BY ts DESC)
                <= $limit
        ORDER BY ts DESC""",
    "actions": """
        SELECT target_kind, target_name, ts, kind, dry_run, reason_summary,
               count(*) OVER (PARTITION BY target_kind, target_name) AS total
        FROM actions
        WHERE ts >= $since AND ts < $until AND list_contains($names, target_name)
        QUALIFY row_number() OVER (PARTITION BY target_kind, target_name ORDER BY ts DESC)
                <= $limit
        ORDER BY ts DESC""",
    # why not: each proposal's latest withheld/1 record (the rule holding it, or its drop)
    "withheld": """
        WITH latest AS (
            SELECT target_kind, target_name, ts, kind, reason, detail
            FROM withheld
            WHERE ts >= $since AND ts < $until AND list_contains($names, target_name)
            QUALIFY row_number() OVER (PARTITION BY proposal_id ORDER BY ts DESC) = 1)
        SELECT *, count(*) OVER (PARTITION BY target_kind, target_name) AS total
        FROM latest
        QUALIFY row_number() OVER (PARTITION BY target_kind, target_name ORDER BY ts DESC)
                <= $limit
        ORDER BY ts DESC""",
    # one row per target, all its devices: a 64-chip slice was 64 rows
    "utilization": """
        WITH device AS (
            SELECT CASE WHEN list_contains($names, slice) THEN 'slice' ELSE 'node' END
                       AS target_kind,
                   CASE WHEN list_contains($names, slice) THEN slice ELSE node END
                       AS target_name,
                   node, device, any_value(accelerator) AS accelerator, sum(hours) AS hours,
                   sum(util_mean * hours) / nullif(sum(hours), 0) AS util,
                   max(util_max) AS util_max,
                   coalesce(sum(hours) FILTER (WHERE allocated), 0) AS allocated_hours
            FROM utilization
            WHERE window_start >= $since AND window_start < $until
              AND (list_contains($names, slice) OR list_contains($names, node))
            GROUP BY ALL)
        SELECT target_kind, target_name, any_value(accelerator) AS accelerator,
               count(DISTINCT node) AS nodes, count(*) AS devices,
               sum(hours) AS device_hours,
               sum(util * hours) / nullif(sum(hours), 0) AS util_mean_pct,
               max(util_max) AS util_max_pct,
               first(CASE WHEN target_kind = 'slice' THEN node || ' #' || device
                          ELSE '#' || device END ORDER BY util, node, device) AS lowest_device,
               min(util) AS util_lowest_pct,
               100 * sum(allocated_hours) / nullif(sum(hours), 0) AS allocated_pct
        FROM device
        GROUP BY target_kind, target_name""",
    "xids": """
        SELECT 'node' AS target_kind, node AS target_name, xid, any_value(mnemonic) AS mnemonic,
               count(*) AS events, string_agg(DISTINCT gpu_index::VARCHAR, ',') AS gpus,
               min(ts) AS first_seen, max(ts) AS last_seen,
               count(*) OVER (PARTITION BY node) AS total
        FROM xid
        WHERE ts >= $since AND ts < $until AND list_contains($names, node)
        GROUP BY node, xid
        ORDER BY events DESC, xid""",
}


def _targets(lake: Lake, targets: list[tuple[str, str]], since: datetime, until: datetime
             ) -> str:
    """One section per target a table row links to: what happened to it over the window."""
    if not targets:
        return ""
    names = sorted({name for _, name in targets})
    params = {"since": since, "until": until, "names": names, "limit": DETAIL_ROWS}
    found = {
        part: _by_target(lake.sql(sql, {k: v for k, v in params.items() if f"${k}" in sql}))
        for part, sql in _TARGET_SQL.items()
    }
    sections = "".join(_target_section(kind, name, found) for kind, name in targets)
    return f'<section data-table="targets"><h2>Nodes and slices</h2>{sections}</section>'


def _by_target(result: Result) -> dict[tuple[str, str], Result]:
    """Split a result by (target_kind, target_name), dropping those two columns."""
    keep = [i for i, c in enumerate(result.columns) if c not in ("target_kind", "target_name")]
    kind_at, name_at = result.columns.index("target_kind"), result.columns.index("target_name")
    split: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in result.rows:
        split.setdefault((row[kind_at], row[name_at]), []).append(tuple(row[i] for i in keep))
    columns = [result.columns[i] for i in keep]
    return {key: Result(columns, rows) for key, rows in split.items()}


def _target_section(kind: str, name: str, found: dict[str, dict[tuple[str, str], Result]]
                    ) -> str:
    empty = Result([], [])
    state = found["state"].get((kind, name), empty).records()
    about = state[0] if state else {}
    facts = ", ".join(f"{label} {escape(_cell(about[key]))}" for key, label in
                      (("pool", "pool"), ("zone", "zone"), ("state_now", "state now"))
                      if about.get(key))
    parts = []
    for part, title in (("findings", "Unhealthy findings"), ("actions", "Actions"),
                        ("withheld", "Not acted on (withheld)"),
                        ("utilization", "Utilization (all devices)"), ("xids", "XIDs")):
        if part == "xids" and kind != "node":
            continue  # XIDs are NVIDIA GPU errors: a TPU slice has none
        parts.append(_detail(part, title, found[part].get((kind, name), empty)))
    return (f'<section class="target" id="{anchor(kind, name)}" '
            f'data-target="{escape(kind)}:{escape(name)}"><h3>{escape(kind)} {escape(name)}</h3>'
            f'<p class="period">{facts or "no health state recorded"}</p>{"".join(parts)}'
            "</section>")


def _detail(part: str, title: str, result: Result) -> str:
    """A target's small table; says how many rows there were in all when it shows fewer."""
    total = result.records()[0].get("total", len(result.rows)) if result.rows else 0
    shown = [i for i, c in enumerate(result.columns) if c != "total"]
    more = f" (latest {len(result.rows)} of {total})" if total > len(result.rows) else ""
    head = "".join(_th(result.columns[i]) for i in shown)
    body = "".join("<tr>" + "".join(_td(escape(_cell(row[i], result.columns[i])), row[i])
                                    for i in shown) + "</tr>"
                   for row in result.rows) or '<tr><td class="none">none</td></tr>'
    return (f'<div data-part="{part}"><h4>{escape(title)}{more}</h4><div class="scroll">'
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div></div>")


# Column names as people read them; the rest are worded by _header's rules.
_HEADERS = {
    "target_kind": "kind", "target_name": "target", "target_pool": "pool",
    "target_zone": "zone", "util_mean_pct": "mean utilization %", "util_max_pct": "peak %",
    "util_lowest_pct": "least used device %", "lowest_device": "least used device",
    "usd_per_useful_hour": "USD per useful hour", "usd_per_hour": "USD per hour",
    "hours_open": "open (h)", "reason_summary": "reason", "quota_metric": "quota",
    "mtbf_hours": "MTBF (h)", "device_hours": "device-hours", "state_now": "state now",
    "as_of": "as of", "ts": "time", "fatal_xids": "fatal XIDs", "xids": "XIDs", "xid": "XID",
}
_WORDS = {"pct": "%", "usd": "USD", "xid": "XID", "xids": "XIDs", "ici": "ICI", "id": "ID",
          "mtbf": "MTBF", "tpu": "TPU", "gpu": "GPU", "gpus": "GPUs"}


def _header(column: str) -> str:
    """A column name in words: util_mean_pct -> "mean utilization %"."""
    if column in _HEADERS:
        return _HEADERS[column]
    return " ".join(_WORDS.get(word, word) for word in column.split("_"))


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts node-2 before node-10: runs of digits compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", text) if part)


def _natural_ties(result: Result, column: str) -> Result:
    """`result` with the rows that tie on every value but text (the query's sort keys among
    them) in natural order of `column`; the query's own order between them is kept."""
    if column not in result.columns or not result.rows:
        return result
    at = result.columns.index(column)

    def tie(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(v for v in row if not isinstance(v, str))

    rows: list[tuple[Any, ...]] = []
    run: list[tuple[Any, ...]] = []
    for row in [*result.rows, None]:
        if run and (row is None or tie(row) != tie(run[0])):
            rows += sorted(run, key=lambda r: natural_key(str(r[at])))
            run = []
        if row is not None:
            run.append(tuple(row))
    return Result(result.columns, rows, result.seconds)


def _cell(value: Any, column: str = "") -> str:
    """A value as a person reads it, rounded by what it is: a percentage or hours to 0.1,
    dollars to the cent, other numbers to about 3 figures, counts with separators."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float | Decimal):
        number = float(value)
        if column.endswith("_pct") or column.endswith("%"):
            return f"{number:,.1f}"
        if "usd" in column or column.endswith("_cost"):
            return f"{number:,.2f}"
        if "hours" in column or column.endswith("_h"):
            return f"{number:,.1f}"
        return f"{number:,.{0 if abs(number) >= 100 else 1 if abs(number) >= 10 else 2}f}"
    text = str(value)
    return text.replace(",", ", ") if "," in text and " " not in text else text


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}.period{color:#555}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0 8px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:110px}
.card .value{font-size:20px;font-weight:600}.card .label{font-size:12px;color:#666}
figure{margin:24px 0}figcaption{font-weight:600;margin-bottom:6px}
table{border-collapse:collapse;font-size:12px;max-width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top;
overflow-wrap:break-word}th{background:#f4f4f4;font-weight:600}td.none{color:#888}
td{max-width:28em}td.num{text-align:right;white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}h3{font-size:15px;margin:22px 0 2px}
h4{font-size:13px;margin:10px 0 4px}section.target{border-top:1px solid #ddd;margin-top:18px}
section.target:target{background:#fffbe6}
svg.chart{max-width:100%;height:auto}
"""

# Counts errors from the first moment, then marks each chart that drew marks (or says it has
# no data) once the document is ready; a test reads the result from the DOM.
_SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener('error', function () {
    errors += 1;
    if (document.body) { document.body.setAttribute('data-errors', String(errors)); }
  });
  function check() {
    var figures = document.querySelectorAll('figure[data-chart]'), rendered = 0;
    for (var i = 0; i < figures.length; i++) {
      var svg = figures[i].querySelector('svg.chart');
      var box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
      var marks = svg ? svg.querySelectorAll('.mark').length : 0;
      var empty = svg ? svg.querySelectorAll('.empty').length : 0;
      var ok = box.width > 0 && box.height > 0 && (marks > 0 || empty > 0);
      figures[i].setAttribute('data-rendered', ok ? (marks > 0 ? 'yes' : 'empty') : 'no');
      figures[i].setAttribute('data-marks', String(marks));
      if (ok) { rendered += 1; }
    }
    document.body.setAttribute('data-charts-rendered', String(rendered));
    document.body.setAttribute('data-charts', String(figures.length));
    document.body.setAttribute('data-errors', String(errors));
    window.fleetpulseReport = {charts: figures.length, rendered: rendered, errors: errors};
  }
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', check);
  } else { check(); }
})();
"""


def _page(title: str, sections: list[str]) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{_SCRIPT}</script></head>"
        f'<body data-errors="0" data-charts-rendered="0"><h1>{escape(title)}</h1>'
        + "".join(sections)
        + "</body></html>\n"
    )
