"""The README's "Reliability" table, written from what the fault scenarios measured.

Each scenario test calls `record(suite, scenario, figures)`; the figures land as one JSON file
per scenario under `out/reliability/` (or `$RELIABILITY_DIR`). After a test run,
`python -m tests.faults.reliability` rewrites the README section between the markers from those
files, so the table is never typed by hand. Suites: "input" (hostile or faulty records, the
fail-safe issue), "poison" (undecodable records in every consumer), "lake" (corrupt Parquet
files) and "infrastructure" (broker, process, network and disk faults).
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
SUITES = ("input", "poison", "lake", "infrastructure")


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
    """Markdown: one table per suite, columns the union of that suite's figure names."""
    parts: list[str] = []
    for suite in SUITES:
        rows = [d for d in documents if d["suite"] == suite]
        if not rows:
            continue
        columns: list[str] = []
        for row in rows:
            for name in row["figures"]:  # type: ignore[attr-defined]
                if name not in columns:
                    columns.append(name)
        parts.append(f"**{suite.capitalize()} faults**\n")
        parts.append("| scenario | " + " | ".join(c.replace("_", " ") for c in columns) + " |")
        parts.append("|---" * (len(columns) + 1) + "|")
        for row in sorted(rows, key=lambda r: str(r["scenario"])):
            figures = row["figures"]
            cells = [_cell(figures.get(c, "")) for c in columns]  # type: ignore[attr-defined]
            parts.append(f"| {row['scenario']} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def rewrite_readme(readme: Path, table: str) -> None:
    try:
        docs_markers.rewrite_section(readme, MARKER, table)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc


def main() -> int:
    documents = load(results_dir())
    if not documents:
        print(f"no scenario results under {results_dir()}; run the tests in tests/faults first")
        return 1
    rewrite_readme(ROOT / "README.md", render(documents))
    print(f"README.md: reliability table from {len(documents)} scenarios in {results_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
