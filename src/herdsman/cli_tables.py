"""The command line's tables: wrapped to the terminal's width, plain when piped.

On a terminal a table is drawn by rich, which fits it to the width
(``COLUMNS``, else the terminal's own) by wrapping the long cells — a
reason, a path — inside their column instead of running past the edge.
Piped or redirected, it is plain text: one row a line, columns aligned by
spaces and never cut, an empty cell shown as ``-``, so ``grep``, ``awk``
and ``split()`` see one field per column (the last one, free text, may hold
spaces).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import Literal, TextIO

import attrs

__all__ = ["Column", "duration_text", "local_time", "print_table"]


@attrs.frozen
class Column:
    """A column's header, alignment, and whether its cells may wrap on a terminal."""

    header: str
    align: Literal["left", "right"] = "left"
    #: Short fixed cells (a status, a time) never wrap; free text and long
    #: names do, so the table fits the terminal.
    wrap: bool = False
    #: The narrowest a wrapping column gets on a narrow terminal (``None``:
    #: as rich shares the width out), e.g. 10 keeps a date whole above its time.
    min_width: int | None = None


def print_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], out: TextIO | None = None
) -> None:
    """Print ``rows`` under ``columns``: rich on a terminal, plain text otherwise."""
    stream = sys.stdout if out is None else out
    if stream.isatty():
        _rich_table(columns, rows, stream)
    else:
        stream.write(plain_table(columns, rows))


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """The table as aligned text, one row a line, every cell whole."""
    cells = [[_one_line(cell) for cell in row] for row in rows]
    widths = [
        max([len(column.header)] + [len(row[i]) for row in cells])
        for i, column in enumerate(columns)
    ]
    lines = []
    for row in [[c.header for c in columns], *cells]:
        shown = [
            cell.rjust(width) if column.align == "right" else cell.ljust(width)
            for cell, width, column in zip(row, widths, columns, strict=True)
        ]
        lines.append("  ".join(shown).rstrip() + "\n")
    return "".join(lines)


def _one_line(cell: str) -> str:
    return " ".join(cell.split()) or "-"


def _rich_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    from rich.console import Console  # noqa: PLC0415 - only a terminal needs it
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        box=None, pad_edge=False, collapse_padding=True, header_style="bold", show_edge=False
    )
    for column in columns:
        table.add_column(
            column.header,
            justify=column.align,
            no_wrap=not column.wrap,
            overflow="fold",
            min_width=column.min_width,
        )
    for row in rows:
        table.add_row(*(cell or "-" for cell in row))
    # highlight off: rich would colour numbers and paths by guesswork.
    Console(file=out, highlight=False).print(table)


def local_time(when: float) -> str:
    """``2026-12-01 15:20:03``: a time in the local zone, to the second."""
    return dt.datetime.fromtimestamp(when).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def duration_text(seconds: float) -> str:
    """``4.2s``, ``3m05s``, ``2h03m``: short, and sorted the way it reads."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
