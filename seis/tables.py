"""Every table SEIS prints or writes, rendered in one place, by tabulate (which pandas' to_markdown uses too).

    markdown(header, rows)      a pipe table, for .md files and orchestrator artifacts
    plain(header, rows)         columns under a dash rule, for terminals and the gate's report.md
    frame_markdown(df, ".1f")   a DataFrame as a pipe table, its numbers formatted (what DataFrame.to_markdown gives)

Cells of markdown() and plain() are text: numbers are not parsed again ("1.50" stays "1.50"), every column is
left-aligned, None is an empty cell. A markdown cell is one line with its `|` escaped, so a cell quoting an error
or a file name cannot end its row early or add one.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

Rows = Iterable[Sequence[object]]


def md_cell(value: object) -> str:
    """One markdown table cell: a `|` escaped, line breaks as spaces."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown(header: Sequence[object], rows: Rows) -> str:
    from tabulate import tabulate

    cells = [[md_cell("" if v is None else v) for v in row] for row in rows]
    return tabulate(cells, headers=[md_cell(h) for h in header], tablefmt="pipe", disable_numparse=True)


def plain(header: Sequence[object], rows: Rows, align: Sequence[str] | None = None) -> str:
    """Columns two spaces apart, the header over a rule of dashes, no trailing spaces; `align` ("left", "right")
    per column, left where not given."""
    from tabulate import tabulate

    return tabulate([list(r) for r in rows], headers=list(header), tablefmt="simple", disable_numparse=True,
                    colalign=align)


def frame_markdown(df: pd.DataFrame, floatfmt: str | Sequence[str] = "g") -> str:
    """The frame without its index; text cells as in markdown(), numbers through floatfmt (one, or one per
    column)."""
    from tabulate import tabulate

    text = df.map(lambda v: md_cell(v) if isinstance(v, str) else v)
    return tabulate(text, headers="keys", tablefmt="pipe", showindex=False, floatfmt=floatfmt)
