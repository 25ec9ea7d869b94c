"""Strings an LLM session passes on must be encodable as UTF-8: the SDKs encode every request as UTF-8 JSON, and
the transcript, the report and the notes are UTF-8 files. Two sources hand SEIS strings that are not: a file name
that is not UTF-8 (os.listdir gives its bytes as lone surrogates, '\\udcff') in a tool result, and a model's reply
(JSON may spell half of a surrogate pair, '\\ud83d', and json.loads takes it). One such character made the next
write raise: the session ended as an 'API error', or the run stopped where report.md is written."""
from __future__ import annotations

from typing import Any


def valid_unicode(v: Any) -> Any:
    """v with every lone surrogate in its strings (dict keys included, at any depth of lists and dicts) written as
    its visible escape ('\\udcff'); everything else as it is."""
    if isinstance(v, str):
        if v.isascii():
            return v
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(v, dict):
        return {valid_unicode(k): valid_unicode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [valid_unicode(x) for x in v]
    if isinstance(v, tuple):
        return tuple(valid_unicode(x) for x in v)
    return v
