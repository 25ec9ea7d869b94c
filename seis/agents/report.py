"""The session report every agent writes: markdown sections plus one machine-readable ```seis-session block.

    # Session <chain>/<NNN> — <agent>
    ## Summary      ## Changes      ## Measurements (the gate fills it)      ## Lessons
    ```seis-session
    {"version": 1, "chain": ..., "session": ..., "agent": ..., "applied": [...], "adopted": [...],
     "failed": [...], "rejected": [...], "verdict": null}
    ```

After the gate, `stamp_verdict` writes the verdict (and, when rejected, the changes into "rejected") and the
measured table. `lineage` reads a chain's reports back: what was retained, what failed, what was rejected.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from ..workspace import Report, Verdict
from .types import Adoption

BLOCK_LANG = "seis-session"
MEASUREMENTS_MARK = "<!-- seis:measurements -->"
MEASUREMENTS_TODO = "_Left for the gate to fill._"
_BLOCK = re.compile(r"```" + BLOCK_LANG + r"[ \t]*\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class SessionBlock:
    chain: str
    session: int
    agent: str
    applied: tuple[str, ...] = ()
    adopted: tuple[Adoption, ...] = ()
    failed: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    verdict: Verdict | None = None
    version: int = 1

    def changes(self) -> tuple[str, ...]:
        """Everything this session put into the engine (new and adopted)."""
        return self.applied + tuple(a.name for a in self.adopted)

    def to_json(self) -> dict:
        return {"version": self.version, "chain": self.chain, "session": self.session, "agent": self.agent,
                "applied": list(self.applied), "adopted": [{"name": a.name, "from_chain": a.from_chain}
                                                           for a in self.adopted],
                "failed": list(self.failed), "rejected": list(self.rejected), "verdict": self.verdict}

    @classmethod
    def from_json(cls, d: dict) -> "SessionBlock":
        def names(key: str) -> tuple[str, ...]:
            value = d.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"'{key}' must be a list of names")
            return tuple(value)

        adopted = tuple(Adoption(a["name"], a["from_chain"]) if isinstance(a, dict) else Adoption(a, "?")
                        for a in d.get("adopted", []))
        verdict = d.get("verdict")
        if verdict not in (None, "retained", "rejected"):
            raise ValueError(f"verdict must be retained, rejected or null, got {verdict!r}")
        return cls(str(d["chain"]), int(d["session"]), str(d.get("agent", "?")), names("applied"), adopted,
                   names("failed"), names("rejected"), verdict, int(d.get("version", 1)))


def render_block(block: SessionBlock) -> str:
    return f"```{BLOCK_LANG}\n{json.dumps(block.to_json(), indent=1, sort_keys=True)}\n```\n"


def render_report(block: SessionBlock, summary: str, changes: list[str], lessons: list[str]) -> str:
    bullets = lambda items: "\n".join(f"- {x}" for x in items) if items else "- none"  # noqa: E731
    return (f"# Session {block.chain}/{block.session:03d} — {block.agent}\n\n"
            f"## Summary\n\n{summary.strip()}\n\n"
            f"## Changes\n\n{bullets(changes)}\n\n"
            f"## Measurements\n\n{MEASUREMENTS_MARK}\n{MEASUREMENTS_TODO}\n\n"
            f"## Lessons\n\n{bullets(lessons)}\n\n"
            f"{render_block(block)}")


def parse_session_block(markdown: str, strict: bool = False) -> SessionBlock | None:
    """The last seis-session block of a report; None if there is none (or it is malformed and not strict)."""
    matches = _BLOCK.findall(markdown)
    if not matches:
        if strict:
            raise ValueError(f"no ```{BLOCK_LANG} block in the report")
        return None
    try:
        return SessionBlock.from_json(json.loads(matches[-1]))
    except (ValueError, KeyError, TypeError) as e:
        if strict:
            raise ValueError(f"malformed {BLOCK_LANG} block: {e}") from None
        return None


def stamp_verdict(markdown: str, verdict: Verdict, measurements: str | None = None) -> str:
    """Write the gate's verdict into the block (rejected -> its changes become 'rejected') and the measurements."""
    block = parse_session_block(markdown, strict=True)
    rejected = block.rejected
    if verdict == "rejected":
        rejected = tuple(dict.fromkeys(rejected + block.changes()))
    new = replace(block, verdict=verdict, rejected=rejected)
    spans = list(_BLOCK.finditer(markdown))
    start, end = spans[-1].span()
    out = markdown[:start] + render_block(new).rstrip("\n") + markdown[end:]
    if measurements is not None:
        filled = f"{MEASUREMENTS_MARK}\n{measurements.strip()}"
        if f"{MEASUREMENTS_MARK}\n{MEASUREMENTS_TODO}" in out:
            out = out.replace(f"{MEASUREMENTS_MARK}\n{MEASUREMENTS_TODO}", filled, 1)
        elif MEASUREMENTS_MARK in out:
            out = out.replace(MEASUREMENTS_MARK, filled, 1)
        else:
            out = out.rstrip("\n") + f"\n\n## Measurements\n\n{filled}\n"
    return out


@dataclass(frozen=True)
class Lineage:
    """A chain's history as read from its reports."""

    retained: frozenset[str] = frozenset()   # in sessions the gate retained
    failed: frozenset[str] = frozenset()     # did not apply / broke while editing
    rejected: frozenset[str] = frozenset()   # applied, but the gate rejected the session
    unreadable: tuple[str, ...] = field(default_factory=tuple)  # reports without a usable block

    @property
    def blocked(self) -> frozenset[str]:
        """Never to be tried again in this lineage."""
        return self.failed | self.rejected


def lineage(reports: list[Report] | tuple[Report, ...]) -> Lineage:
    retained, failed, rejected, unreadable = set(), set(), set(), []
    for r in sorted(reports, key=lambda r: (r.session, r.chain)):
        block = parse_session_block(r.markdown)
        if block is None:
            unreadable.append(r.file_name)
            continue
        verdict = r.verdict or block.verdict  # the gate's record wins over what the markdown says
        failed |= set(block.failed)
        rejected |= set(block.rejected)
        if verdict == "rejected":
            rejected |= set(block.changes())
        elif verdict == "retained":
            retained |= set(block.changes())
    return Lineage(frozenset(retained), frozenset(failed), frozenset(rejected), tuple(unreadable))
