"""One readable line from a pydantic ValidationError, for every boundary that turns bad input into a clear error."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pydantic import ValidationError


def describe_errors(e: ValidationError, label: Callable[[str], str] = lambda field: field,
                    with_input: bool = False) -> str:
    """Each error after the field it names (`label` turns `a.b` into what the user typed, e.g. `--chains`), and with
    `with_input` the value given unless the message already says it; a cross-field error (no field) by its message."""
    parts = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if with_input and err["loc"] and (got := f"got {err.get('input')!r}") not in msg:
            msg = f"{msg}, {got}"
        parts.append(f"{label('.'.join(str(p) for p in err['loc']))}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)
