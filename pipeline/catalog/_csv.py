"""Shared CSV reading for the catalog data files.

The data files ship inside the package, so they are read through
``importlib.resources`` rather than a path relative to the source tree: that is
what keeps them readable from a wheel or a zip import.
"""

import csv
from collections.abc import Sequence
from importlib import resources
from typing import TypeVar

_PACKAGE = __name__.rpartition(".")[0]

T = TypeVar("T", bound=str)


class Row:
    """One CSV data row, with the file and line it came from for error messages."""

    __slots__ = ("_fields", "where")

    def __init__(self, fields: dict[str, str], where: str) -> None:
        self._fields = fields
        self.where = where

    def text(self, column: str) -> str:
        return self._fields[column]

    def integer(self, column: str) -> int:
        value = self._fields[column]
        try:
            return int(value)
        except ValueError:
            msg = f"{self.where}: column {column!r} must be an integer, got {value!r}"
            raise ValueError(msg) from None

    def number(self, column: str) -> float:
        value = self._fields[column]
        try:
            return float(value)
        except ValueError:
            msg = f"{self.where}: column {column!r} must be a number, got {value!r}"
            raise ValueError(msg) from None

    def boolean(self, column: str) -> bool:
        # Strict on purpose: a typo such as "ture" must not silently read as False.
        value = self._fields[column]
        if value == "true":
            return True
        if value == "false":
            return False
        msg = f"{self.where}: column {column!r} must be 'true' or 'false', got {value!r}"
        raise ValueError(msg)

    def choice(self, column: str, allowed: Sequence[T]) -> T:
        # Returning the matching element of `allowed` (not `value`) keeps the
        # Literal type without a cast.
        value = self._fields[column]
        for option in allowed:
            if option == value:
                return option
        msg = f"{self.where}: column {column!r} must be one of {list(allowed)}, got {value!r}"
        raise ValueError(msg)


def read_rows(filename: str, columns: Sequence[str]) -> list[Row]:
    """Read a packaged CSV file; lines starting with '#' and blank lines are skipped.

    The header must list exactly `columns` (order included), and every row must
    have one value per column, so a shifted or missing cell fails at load time.
    """
    text = resources.files(_PACKAGE).joinpath(filename).read_text(encoding="utf-8")
    numbered = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not numbered:
        msg = f"{filename}: no header line"
        raise ValueError(msg)
    header = _split(numbered[0][1])
    if header != list(columns):
        msg = f"{filename}: header must be {list(columns)}, got {header}"
        raise ValueError(msg)
    rows = []
    for number, line in numbered[1:]:
        where = f"{filename}:{number}"
        cells = _split(line)
        if len(cells) != len(header):
            msg = f"{where}: expected {len(header)} cells, got {len(cells)}"
            raise ValueError(msg)
        rows.append(Row(dict(zip(header, cells, strict=True)), where))
    return rows


def _split(line: str) -> list[str]:
    # One physical line is one record: quoted cells may hold commas but not
    # newlines, which keeps the line numbers in error messages exact.
    return [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True))]
