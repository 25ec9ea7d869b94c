"""Keys never leave the process: every string SEIS writes for an LLM session (transcript, report, notes, tool
results sent back to the model, CLI output) goes through a Redactor holding the secret values found in the
environment, in plain and encoded forms (secrets.py), plus key-shaped patterns."""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from .secrets import KEY_PATTERNS, MIN_SECRET_LEN, REDACTED, SECRET_NAME, SecretSet, secret_values

__all__ = ["KEY_PATTERNS", "MIN_SECRET_LEN", "SECRET_NAME", "Redactor"]


class Redactor:
    def __init__(self, secrets: Iterable[str] = (), environ: Mapping[str, str] | None = None):
        self.secrets = secret_values(environ, secrets)
        self._set = SecretSet(self.secrets)

    def text(self, s: str) -> str:
        if not isinstance(s, str) or not s:
            return s
        s = self._set.redact(s)
        if not s.isascii():  # a key shape in fullwidth or other compatibility characters: shown in plain letters
            folded = unicodedata.normalize("NFKC", s)
            if any(p.search(folded) for p in KEY_PATTERNS):
                s = folded
        for pattern in KEY_PATTERNS:
            s = pattern.sub(REDACTED, s)
        return s

    def value(self, v: Any) -> Any:
        """Redact every string inside a JSON-like value (dict keys included)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, Mapping):
            return {self.value(k): self.value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        return v
