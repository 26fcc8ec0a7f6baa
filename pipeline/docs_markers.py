"""Rewrite the generated part of a Markdown document, between two HTML comment markers.

The README's measured tables and paragraphs (benchmarks, reliability) are written by scripts
from result files, never by hand: each script owns the text between `<!-- NAME:start -->` and
`<!-- NAME:end -->` and leaves everything outside untouched, so prose around a section survives
every rewrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of the section called `name`."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_section(text: str, name: str, body: str) -> str:
    """`text` with the section `name` holding `body`; ValueError if its markers are missing,
    repeated or out of order (a half-marked document must not lose the text after a marker)."""
    start, end = markers(name)
    found = (text.count(start), text.count(end))
    if found != (1, 1) or text.index(start) > text.index(end):
        raise ValueError(
            f"expected one {start} followed by one {end}, got {found[0]} start and "
            f"{found[1]} end marker(s)" + (" in the wrong order" if found == (1, 1) else "")
        )
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def read_section(path: Path, name: str) -> str:
    """The text between the markers of `name` in the file at `path` ("" when they are missing:
    nothing generated there yet)."""
    start, end = markers(name)
    text = path.read_text()
    if start not in text or end not in text:
        return ""
    return text.partition(start)[2].partition(end)[0]


def rewrite_section(path: Path, name: str, body: str) -> bool:
    """Put `body` between the markers of `name` in the file at `path`; True if it changed."""
    return rewrite_sections(path, {name: body})


def rewrite_sections(path: Path, bodies: Mapping[str, str]) -> bool:
    """Put each body between the markers of its name in the file at `path`, in one write (all
    or none: a missing marker leaves the file as it was); True if it changed."""
    text = updated = path.read_text()
    try:
        for name, body in bodies.items():
            updated = replace_section(updated, name, body)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if updated == text:
        return False
    path.write_text(updated)
    return True
