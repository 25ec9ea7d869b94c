"""Keys never leave the process: every string SEIS writes for an LLM session (transcript, report, notes, CLI
output) goes through a Redactor holding the secret values found in the environment, plus key-shaped patterns."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_NAME = re.compile(r"(API_KEY|AUTH_TOKEN|ACCESS_TOKEN|SECRET|PASSWORD|_TOKEN$|_KEY$)", re.IGNORECASE)
# Shapes of common provider keys, caught even when the value came from somewhere other than the environment.
KEY_PATTERNS = (re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}"), re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
                re.compile(r"\b(?:ghp|gho|github_pat|hf)_[A-Za-z0-9_]{16,}"))
MIN_SECRET_LEN = 8  # shorter values ("1", "true") would redact ordinary text


class Redactor:
    def __init__(self, secrets: Iterable[str] = (), environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        values = {v for k, v in env.items() if SECRET_NAME.search(k) and v}
        values |= {s for s in secrets if s}
        # Longest first, so a key containing another secret is replaced whole.
        self._secrets = sorted((v for v in values if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)

    def text(self, s: str) -> str:
        for secret in self._secrets:
            if secret in s:
                s = s.replace(secret, "[REDACTED]")
        for pattern in KEY_PATTERNS:
            s = pattern.sub("[REDACTED]", s)
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
