"""Tables that fit the terminal they are printed on.

Some columns must never be cut: a run id is what a person copies into the next command. Left
alone, rich narrows the columns that may wrap, and when that is not enough it narrows every
column alike, run ids too. So a table here is built for a width: the columns that matter least
are left out until the others fit whole, and the one-line text columns (a note, an issue
title) take what is left, ending in an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from orchestrator.control.plain import safe

Cell = str | Text
"""A cell's content; a string is shown as it is, never read as rich markup."""


@dataclass(frozen=True)
class Column:
    header: str
    justify: JustifyMethod = "left"
    drop: int = 0
    """When the width runs short, columns are left out highest `drop` first; 0: never."""
    shrink_to: int | None = None
    """None: shown whole, never wrapped. A number: a one-line text column that gives way down
    to this many characters before a column is left out for it, then is cut with an ellipsis."""


BORDER_AND_PADDING = 3
"""Characters a column takes beside its content: a space either side and one border line (the
table's last border line is counted once more)."""


def fitted_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, width: int | None, **options: Any
) -> Table:
    """A rich `Table` of `rows` within `width` characters (None: every column, as wide as it
    needs); `options` go to `Table` (title, caption, …). Its title stays on one line as far as
    the width allows."""
    least = [_least_width(column, [row[i] for row in rows]) for i, column in enumerate(columns)]
    kept = list(range(len(columns)))
    if width is not None:
        for i in sorted((i for i in kept if columns[i].drop), key=lambda i: -columns[i].drop):
            if 1 + sum(least[k] + BORDER_AND_PADDING for k in kept) <= width:
                break
            kept.remove(i)
    title = options.get("title")
    if title is not None:
        title_width = Text(str(title)).cell_len
        options.setdefault("min_width", title_width if width is None else min(width, title_width))
    table = Table(**options)
    for i in kept:
        column = columns[i]
        table.add_column(column.header, justify=column.justify, no_wrap=column.shrink_to is None)
    for row in rows:
        table.add_row(*(_shown(row[i], columns[i]) for i in kept))
    return table


def _least_width(column: Column, cells: list[Cell]) -> int:
    """What the column needs of the width to stay in the table: its widest line (the header's
    included), or less for a text column that may shrink."""
    widest = max(
        Text(line).cell_len
        for cell in (column.header, *cells)
        for line in (cell.plain if isinstance(cell, Text) else cell).split("\n")
    )
    return widest if column.shrink_to is None else min(widest, column.shrink_to)


def _shown(cell: Cell, column: Column) -> Text:
    if isinstance(cell, str):
        cell = safe(cell)  # a cell may quote an issue, a model or a repository
    if column.shrink_to is None:
        return Text(cell) if isinstance(cell, str) else cell
    one_line = Text(" ".join(cell.split())) if isinstance(cell, str) else cell.copy()
    one_line.no_wrap, one_line.overflow = True, "ellipsis"
    return one_line


def counted(number: int, noun: str) -> str:
    """`1 run`, `0 runs`, `2 runs`: a count and its noun (one whose plural takes an s)."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
