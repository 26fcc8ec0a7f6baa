"""The README's "Reliability" table, written from what the fault scenarios measured.

Each scenario test calls `record(suite, scenario, figures)`; the figures land as one JSON file
per scenario under `out/reliability/` (or `$RELIABILITY_DIR`). After a test run,
`python -m tests.faults.reliability` rewrites the README section between the markers from those
files, so the table is never typed by hand. Suites: "input" (hostile or faulty records, the
fail-safe issue), "control" (the control path: maintenance notices, control records,
principals, the actuator and people, alert delivery), "poison" (undecodable records in every
consumer), "lake" (corrupt Parquet files) and "infrastructure" (broker, process, network and disk faults), the last split into
families (FAMILIES), and "control" by what it guards (CONTROL_FAMILIES), each table with the
columns its scenarios measure.

`--keep` keeps the README's rows of scenarios this run did not measure (a `make test` run
refreshes the short scenarios and keeps the slow ones `make faults` measured last).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from pipeline import docs_markers

ROOT = Path(__file__).resolve().parents[2]
MARKER = "reliability"  # the README section between <!-- reliability:start/end -->
SUITES = ("input", "control", "poison", "lake", "infrastructure")
# infrastructure scenarios by family (first match), so each table has its own columns
CONTROL_FAMILIES = (
    ("the chart's processes", r"^the chart's processes"),  # tests/e2e/test_chart_harness.py
    ("principals", r"own principal"),
    ("alert delivery", r"receiver"),
    ("the actuator and people", r"forged (drains|cordons)|cordons in one pool|slice|drain|person"),
    ("maintenance and control records", r"."),
)
FAMILIES = (
    ("process crashes", r"^SIGKILL"),
    ("broker outages", r"^broker"),
    ("network faults", r"latency|connection|partitioned"),
    ("full disk", r"^disk full"),
    ("replays", r"reset|without its checkpoint"),
    ("scaling", r"^scale"),
    ("backpressure", r"^backpressure"),
)


def results_dir() -> Path:
    return Path(os.environ.get("RELIABILITY_DIR", ROOT / "out" / "reliability"))


def record(suite: str, scenario: str, figures: dict[str, int | float | str]) -> None:
    """Keep one scenario's measured figures (called by the scenario tests)."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    # "+1 day" and "-1 day" are two scenarios: keep the signs apart in the file name
    named = f"{suite}-{scenario}".lower().replace("+", " plus ").replace("-1", " minus 1")
    slug = re.sub(r"[^a-z0-9]+", "-", named).strip("-")
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    document = {"suite": suite, "scenario": scenario, "figures": figures}
    (folder / f"{slug}.json").write_text(json.dumps(document, indent=1) + "\n")


def load(folder: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def render(documents: list[dict[str, object]]) -> str:
    """Markdown: one table per suite (per family for infrastructure), columns the union of
    its rows' figure names."""
    parts: list[str] = []
    for title, rows in _tables(documents):
        shown = {str(r["scenario"]): _shown(r["figures"]) for r in rows}  # type: ignore[arg-type]
        columns: list[str] = []
        for figures in shown.values():
            columns += [name for name in figures if name not in columns]
        parts.append(f"**{title}**\n")
        parts.append("| scenario | " + " | ".join(columns) + " |")
        parts.append("|---" * (len(columns) + 1) + "|")
        for scenario, figures in sorted(shown.items()):
            cells = [_cell(figures.get(c, "")) for c in columns]
            parts.append(f"| {scenario} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _shown(figures: dict[str, object]) -> dict[str, object]:
    """Figures by the name their column shows ("peak_lag" and "peak lag" are one column)."""
    return {name.replace("_", " "): value for name, value in figures.items()}


def _tables(documents: list[dict[str, object]]) -> list[tuple[str, list[dict[str, object]]]]:
    """(title, rows) per suite in SUITES order; infrastructure per family in FAMILIES order."""
    tables: list[tuple[str, list[dict[str, object]]]] = []
    for suite in SUITES:
        rows = [d for d in documents if d["suite"] == suite]
        families = {"infrastructure": FAMILIES, "control": CONTROL_FAMILIES}.get(suite)
        if families is None:
            tables.append((f"{suite.capitalize()} faults", rows))
            continue
        for family in [*(f for f, _ in families), "other"]:
            mine = [r for r in rows if _family(str(r["scenario"]), families) == family]
            tables.append((f"{suite.capitalize()} faults: {family}", mine))
    return [(title, rows) for title, rows in tables if rows]


def _family(scenario: str, families: tuple[tuple[str, str], ...] = FAMILIES) -> str:
    return next((f for f, pattern in families if re.search(pattern, scenario)), "other")


def parse(table: str) -> list[dict[str, object]]:
    """The documents a rendered section shows (figures as their cells' text; an empty cell is
    a figure the scenario did not measure): `render`'s inverse, for `--keep`."""
    documents: list[dict[str, object]] = []
    suite, columns = "", []
    for line in table.splitlines():
        title = re.fullmatch(r"\*\*(\w+) faults(?:: .*)?\*\*", line.strip())
        if title:
            suite, columns = title[1].lower(), []
        elif line.startswith("| scenario |"):
            columns = [c.strip() for c in line.strip().strip("|").split("|")[1:]]
        elif line.startswith("| ") and suite and columns:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            figures = {c: v for c, v in zip(columns, cells[1:], strict=True) if v != ""}
            documents.append({"suite": suite, "scenario": cells[0], "figures": figures})
    return documents


def merged(kept: list[dict[str, object]], fresh: list[dict[str, object]]) -> list[dict[str, object]]:
    """`fresh` and every row of `kept` whose (suite, scenario) `fresh` has not measured."""
    measured = {(d["suite"], d["scenario"]) for d in fresh}
    return [*fresh, *(d for d in kept if (d["suite"], d["scenario"]) not in measured)]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def rewrite_readme(readme: Path, table: str) -> None:
    try:
        docs_markers.rewrite_section(readme, MARKER, table)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    keep = "--keep" in (sys.argv[1:] if argv is None else argv)
    documents = load(results_dir())
    if not documents:
        print(f"no scenario results under {results_dir()}; run the tests in tests/faults first")
        return 1
    readme = ROOT / "README.md"
    if keep:
        documents = merged(parse(docs_markers.read_section(readme, MARKER)), documents)
    rewrite_readme(readme, render(documents))
    print(f"README.md: reliability tables from {len(documents)} scenarios in {results_dir()}"
          + (" and the README's other rows" if keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
