"""The README's generated sections: only the text between a section's markers changes, a
rewrite is idempotent, and a document without (or with broken) markers is refused with an error
that says what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import summary
from pipeline.docs_markers import markers, replace_section, rewrite_section
from tests.faults import reliability

START, END = markers("bench")
# prose around the section: anything but the markers themselves
PROSE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200).filter(
    lambda text: "<!--" not in text
)


def document(head: str, body: str, tail: str) -> str:
    return f"{head}{START}\n{body}\n{END}{tail}"


@given(head=PROSE, old=PROSE, new=PROSE, tail=PROSE)
def test_only_the_marked_section_changes(head: str, old: str, new: str, tail: str) -> None:
    rewritten = replace_section(document(head, old, tail), "bench", new)
    assert rewritten == document(head, new, tail)
    assert rewritten.startswith(head + START) and rewritten.endswith(END + tail)


@given(head=PROSE, old=PROSE, new=PROSE, tail=PROSE)
def test_a_rewrite_is_idempotent(head: str, old: str, new: str, tail: str) -> None:
    once = replace_section(document(head, old, tail), "bench", new)
    assert replace_section(once, "bench", new) == once


def test_another_sections_markers_are_left_alone() -> None:
    other_start, other_end = markers("reliability")
    text = f"a\n{other_start}\nkept\n{other_end}\nb\n{START}\nold\n{END}\nc\n"
    rewritten = replace_section(text, "bench", "new")
    assert f"{other_start}\nkept\n{other_end}" in rewritten
    assert f"{START}\nnew\n{END}" in rewritten


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("no markers at all\n", "got 0 start and 0 end"),
        (f"{START}\nonly a start\n", "got 1 start and 0 end"),
        (f"{END}\nend first\n{START}\n", "got 1 start and 1 end marker\\(s\\) in the wrong order"),
        (f"{START}\n{START}\ntwice\n{END}\n", "got 2 start and 1 end"),
    ],
)
def test_missing_or_broken_markers_are_refused(text: str, got: str) -> None:
    with pytest.raises(ValueError, match=f"expected one {START} followed by one {END}, {got}"):
        replace_section(text, "bench", "body")


def test_the_file_is_named_and_left_unchanged_when_markers_are_missing(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no section here\n")
    with pytest.raises(ValueError, match=r"README\.md: expected one <!-- bench:start -->"):
        rewrite_section(readme, "bench", "table")
    assert readme.read_text() == "# no section here\n"


def test_the_bench_sections_are_written_from_the_result_files(tmp_path: Path) -> None:
    time_start, time_end = markers("bench-time")
    det_start, det_end = markers("bench-detection")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{START}\nstale\n{END}\n\n{det_start}\nstale 19/19\n{det_end}\n"
                      f"between\n{time_start}\nstale 1.0 M\n{time_end}\n\n### after\n")
    assert summary.write_readme(readme) is True
    text = readme.read_text()
    rows, machines = summary.collect(quick=False)
    sections = summary.readme_sections()
    assert f"{START}\n{summary.results_markdown(rows, machines)}\n{END}" in text
    assert f"{det_start}\n{sections['bench-detection']}\n{det_end}\nbetween\n" in text
    assert f"{time_start}\n{sections['bench-time']}\n{time_end}" in text
    assert "stale" not in text
    assert text.startswith("intro\n\n") and text.endswith("\n\n### after\n")
    assert summary.write_readme(readme) is False  # nothing new: the file is not touched


def test_a_missing_prose_marker_leaves_the_readme_untouched(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    original = f"intro\n{START}\nstale\n{END}\n"  # no bench-time / bench-detection markers
    readme.write_text(original)
    with pytest.raises(ValueError, match="bench-"):
        summary.write_readme(readme)
    assert readme.read_text() == original


def test_the_reliability_table_keeps_its_section_and_exit(tmp_path: Path) -> None:
    start, end = markers(reliability.MARKER)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{start}\nold\n{end}\ny\n")
    table = reliability.render([{"suite": "lake", "scenario": "s", "figures": {"lost": 0}}])
    reliability.rewrite_readme(readme, table)
    assert readme.read_text() == f"x\n{start}\n{table}\n{end}\ny\n"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="reliability:start"):
        reliability.rewrite_readme(readme, table)


def _doc(suite: str, scenario: str, **figures: object) -> dict[str, object]:
    return {"suite": suite, "scenario": scenario, "figures": figures}


def test_reliability_infrastructure_rows_are_split_by_family_with_their_own_columns() -> None:
    table = reliability.render([
        _doc("infrastructure", "SIGKILL of the worker, restarted", lost=0, kill_after_s=3),
        _doc("infrastructure", "broker stopped 10 s mid-stream", lost=0, outage_s=10),
        _doc("infrastructure", "something new", lost=0),
        _doc("lake", "truncated", lost=0),
    ])
    titles = [line for line in table.splitlines() if line.startswith("**")]
    assert titles == ["**Lake faults**", "**Infrastructure faults: process crashes**",
                      "**Infrastructure faults: broker outages**", "**Infrastructure faults: other**"]
    crashes = table.split("process crashes**")[1].split("**")[0]
    assert "kill after s" in crashes and "outage s" not in crashes


def test_reliability_keep_reads_the_readme_rows_back_and_fresh_rows_win() -> None:
    old = [_doc("infrastructure", "broker stopped 60 s mid-stream", lost="0", outage_s="60.00"),
           _doc("infrastructure", "SIGKILL of the worker, restarted", lost="0", kill_after_s="3"),
           _doc("input", "host clock +1 day", cordons="0")]
    shown = reliability.render(old)
    assert reliability.render(reliability.parse(shown)) == shown
    fresh = [_doc("infrastructure", "SIGKILL of the worker, restarted", lost=0, kill_after_s=5)]
    rows = reliability.merged(reliability.parse(shown), fresh)
    assert sorted(str(r["scenario"]) for r in rows) == sorted(str(r["scenario"]) for r in old)
    table = reliability.render(rows)
    assert "| SIGKILL of the worker, restarted | 0 | 5 |" in table
    assert "| broker stopped 60 s mid-stream | 0 | 60.00 |" in table
    assert table.count("kill after s") == 1
