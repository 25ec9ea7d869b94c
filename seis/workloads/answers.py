"""GSM8K answer extraction and comparison (shared by gold parsing and model-output scoring)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number: optional sign and `$`, digits with proper thousands commas (so "1,2,3" is not 123), optional
# decimals. Not preceded by a word char or `.`, so "3-5" gives 3 and 5 (not -5) and "x2" gives nothing.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<neg>-\s?)?\$?\s?(?P<neg2>-)?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
)
_MARKER = "####"


def normalize_number(text: str) -> str | None:
    """'1,000' -> '1000', '$18.00' -> '18', '-0.50' -> '-0.5', '18.' -> '18'; None if not a number."""
    m = _NUMBER.search(text.strip())
    if m is None:
        return None
    return _canonical(m)


def _canonical(m: re.Match[str]) -> str | None:
    raw = m.group("num").replace(",", "")
    try:
        value = Decimal(raw)
    except InvalidOperation:  # pragma: no cover - the regex only admits valid decimals
        return None
    if m.group("neg") or m.group("neg2"):
        value = -value
    if value == value.to_integral_value():
        return str(int(value))  # "18.0" -> "18", "-0" -> "0"
    return format(value.normalize(), "f")  # "2.50" -> "2.5", no exponent


def extract_answer(text: str) -> str | None:
    """The number after the last `####` that has one, else the last number in the text, normalised."""
    segments = text.split(_MARKER)
    for seg in reversed(segments[1:]):
        m = _NUMBER.search(seg)
        if m is not None:
            return _canonical(m)
    matches = list(_NUMBER.finditer(text))
    return _canonical(matches[-1]) if matches else None


def is_correct(pred_text: str, gold_answer: str) -> bool:
    """True when the extracted prediction equals the gold number (gold may be '18' or a '... #### 18' text)."""
    pred = extract_answer(pred_text)
    gold = extract_answer(gold_answer)
    return pred is not None and gold is not None and Decimal(pred) == Decimal(gold)
