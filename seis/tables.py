"""Every table SEIS prints or writes, rendered in one place, by tabulate (which pandas' to_markdown uses too).

    markdown(header, rows)      a pipe table, for .md files and orchestrator artifacts
    plain(header, rows)         columns under a dash rule, for terminals and the gate's report.md
    frame_markdown(df, ".1f")   a DataFrame as a pipe table, its numbers formatted (what DataFrame.to_markdown gives)

    printable(text)             untrusted text made safe to show on a terminal, in a log or in a markdown cell

Cells of markdown() and plain() are text: numbers are not parsed again ("1.50" stays "1.50"), every column is
left-aligned, None is an empty cell. A markdown cell is one line with its `|` escaped, so a cell quoting an error
or a file name cannot end its row early or add one; it shows no link, image, HTML or entity either; a cell of either
kind holds no control character (printable).
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

Rows = Iterable[Sequence[object]]


_KEPT = {"\t", " "}


def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def printable(text: object, multiline: bool = True) -> str:
    """Text an agent or a candidate engine controls (a report, a file name, an engine's error or stderr), made safe
    for an operator's terminal, a log line or a table cell: every control character (C0, DEL, C1: ESC and so CSI
    and OSC sequences, a carriage return, a backspace), format character (the bidi overrides and isolates U+202A-E
    and U+2066-9, zero-width ones), line or paragraph separator and lone surrogate is shown as a visible escape
    (ESC as `\\x1b`, a carriage return as `\\x0d`, U+202E as `\\u202e`), so the text cannot move the cursor,
    clear or rewrite what is on the screen, set the clipboard, make a hyperlink or reorder what a line shows. A tab
    stays, and so does a newline where `multiline` (else it is escaped too); everything else is left as it is."""
    text = str(text)
    plain = text.replace("\t", "").replace("\n", "") if multiline else text.replace("\t", "")
    if plain.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in _KEPT or (multiline and ch == "\n")
                   or unicodedata.category(ch) == "Zs" else _escape(ch) for ch in text)


# What could make a markdown cell more than text: a backslash (which would undo the escapes), a link or image
# (`[`, `]`), HTML or an autolink (`<`), an entity (`&#x202e;` is a bidi override once rendered).
_MD_ACTIVE = re.compile(r"([\\\[\]<&])")


def md_cell(value: object) -> str:
    """One markdown table cell: line breaks as spaces, what markdown would act on (`|`, a link or image, HTML, an
    entity) escaped, and what a terminal would act on shown as escapes (printable)."""
    text = printable(str(value).replace("\r\n", " ").replace("\n", " "), multiline=False)
    return _MD_ACTIVE.sub(r"\\\1", text).replace("|", "\\|")


def markdown(header: Sequence[object], rows: Rows) -> str:
    from tabulate import tabulate

    cells = [[md_cell("" if v is None else v) for v in row] for row in rows]
    return tabulate(cells, headers=[md_cell(h) for h in header], tablefmt="pipe", disable_numparse=True)


def plain(header: Sequence[object], rows: Rows, align: Sequence[str] | None = None) -> str:
    """Columns two spaces apart, the header over a rule of dashes, no trailing spaces; `align` ("left", "right")
    per column, left where not given."""
    from tabulate import tabulate

    return tabulate([[printable(v, multiline=False) if isinstance(v, str) else v for v in r] for r in rows],
                    headers=[printable(h, multiline=False) for h in header], tablefmt="simple",
                    disable_numparse=True, colalign=align)


def frame_markdown(df: pd.DataFrame, floatfmt: str | Sequence[str] = "g") -> str:
    """The frame without its index; text cells as in markdown(), numbers through floatfmt (one, or one per
    column)."""
    from tabulate import tabulate

    text = df.map(lambda v: md_cell(v) if isinstance(v, str) else v)
    return tabulate(text, headers="keys", tablefmt="pipe", showindex=False, floatfmt=floatfmt)
