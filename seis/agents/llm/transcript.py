"""transcript.jsonl: every prompt, model turn, tool call and result of a session, one JSON object a line,
appended as it happens (a crash leaves what came before) and redacted before it touches the disk."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .redact import Redactor
from .text import valid_unicode


class Transcript:
    def __init__(self, path: Path | None, redactor: Redactor):
        self.path = path
        self.redactor = redactor
        self.t0 = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")  # one session, one transcript: a rerun replaces it

    def log(self, kind: str, **data: Any) -> None:
        if self.path is None:
            return
        event = {"t": round(time.monotonic() - self.t0, 3), "type": kind, **data}
        try:
            line = json.dumps(valid_unicode(self.redactor.value(_plain(event))), ensure_ascii=False, default=str)
        except (RecursionError, ValueError) as e:
            # A reply's own structure (nested past the stack's depth, an integer past Python's digit limit) must
            # not end the session from here, where the loop is not guarded: the event is noted, not written.
            line = json.dumps({"t": event["t"], "type": kind,
                               "unrecorded": f"{type(e).__name__}: {str(e)[:200]}"})
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def _plain(v: Any) -> Any:
    """SDK objects (pydantic models) as plain JSON values."""
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
