"""The session report every agent writes: markdown sections plus one machine-readable ```seis-session block.

    # Session <chain>/<NNN> — <agent>
    ## Summary      ## Changes      ## Lessons      (the agent's words)
    ## Measurements (the gate fills it)
    ```seis-session
    {"version": 1, "chain": ..., "session": ..., "agent": ..., "applied": [...], "adopted": [...],
     "failed": [...], "rejected": [...], "verdict": null}
    ```

Everything the agent wrote comes first and is `neutralise`d (it cannot hold a seis-session fence or a seis marker),
so the harness's part is the tail: the one measurements marker, the gate's table, the one block. After the gate,
`stamp_verdict` writes the verdict (and, when rejected, the changes into "rejected") and the measured table;
`split_report` separates the agent's text from that tail for prompts. `lineage` reads a chain's reports back: what
was retained, what failed, what was rejected.
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
MEASUREMENTS_HEADING = "## Measurements"
_BLOCK = re.compile(r"```" + BLOCK_LANG + r"[ \t]*\n(.*?)\n```", re.DOTALL)
# What agent text must not carry: a fence opening a seis-session block (any fence, any case, spaces allowed: the
# last block wins in parse_session_block) and a harness marker comment (stamp_verdict and split_report find the
# gate's table by it).
# Tried only where a run of fence characters starts, and without backtracking into it (possessive): tried at every
# character of a run it scanned the rest of it, O(n^2) steps, hours for 1 MiB of backticks inside re's C code.
_AGENT_FENCE = re.compile(r"(?<![`~])([`~]{3,}+[ \t]*+)(?=" + BLOCK_LANG + ")", re.IGNORECASE)
_AGENT_MARKER = re.compile(r"<!--(?=\s*seis:)", re.IGNORECASE)


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


def neutralise(text: str) -> str:
    """Agent-written text may quote the harness's syntax but must never be read as it: a ```seis-session fence
    becomes ```agent-quoted-seis-session, a `<!-- seis:` marker `<!-- agent-quoted seis:`. Only inserts, so no
    new match can form."""
    return _AGENT_MARKER.sub("<!-- agent-quoted", _AGENT_FENCE.sub(r"\1agent-quoted-", text))


def render_report(block: SessionBlock, summary: str, changes: list[str], lessons: list[str]) -> str:
    bullets = lambda items: "\n".join(f"- {neutralise(x)}" for x in items) if items else "- none"  # noqa: E731
    # The agent's sections first, the harness's (measurements, block) last: no agent text after the marker.
    return (f"# Session {block.chain}/{block.session:03d} — {block.agent}\n\n"
            f"## Summary\n\n{neutralise(summary.strip())}\n\n"
            f"## Changes\n\n{bullets(changes)}\n\n"
            f"## Lessons\n\n{bullets(lessons)}\n\n"
            f"{MEASUREMENTS_HEADING}\n\n{MEASUREMENTS_MARK}\n{MEASUREMENTS_TODO}\n\n"
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
    """Write the gate's verdict into the block (rejected -> its changes become 'rejected') and the measurements.

    Both go where the harness put them: the last block, and the last marker before it (render_report writes the
    agent's text before both, so a marker an agent planted cannot be the one filled)."""
    block = parse_session_block(markdown, strict=True)
    rejected = block.rejected
    if verdict == "rejected":
        rejected = tuple(dict.fromkeys(rejected + block.changes()))
    new = replace(block, verdict=verdict, rejected=rejected)
    start, end = list(_BLOCK.finditer(markdown))[-1].span()
    head, tail = markdown[:start], render_block(new).rstrip("\n") + markdown[end:]
    if measurements is not None:
        filled = f"{MEASUREMENTS_MARK}\n{measurements.strip()}"
        mark = head.rfind(MEASUREMENTS_MARK)
        if mark < 0:  # no marker: a Measurements section just before the block, which stays last
            head = head.rstrip("\n") + f"\n\n{MEASUREMENTS_HEADING}\n\n{filled}\n\n"
        elif head.startswith(f"{MEASUREMENTS_MARK}\n{MEASUREMENTS_TODO}", mark):
            head = head[:mark] + filled + head[mark + len(MEASUREMENTS_MARK) + 1 + len(MEASUREMENTS_TODO):]
        else:
            head = head[:mark] + filled + "\n" + head[mark + len(MEASUREMENTS_MARK):]
    return head + tail


def split_report(markdown: str) -> tuple[str, str | None]:
    """(the agent's text, the harness's measurements) of a report in render_report's layout, by the harness's
    positions: one block, at the end; one marker, under the Measurements heading, with no heading between it and
    the block. Anything else (an older layout with Lessons after the table, a second marker or block, text after
    the block) gives (the whole report, None): then nothing in it can be told apart from the agent's words."""
    blocks = list(_BLOCK.finditer(markdown))
    if len(blocks) != 1 or markdown[blocks[0].end():].strip() or markdown.count(MEASUREMENTS_MARK) != 1:
        return markdown, None
    start, mark = blocks[0].start(), markdown.find(MEASUREMENTS_MARK)
    agent = markdown[:mark].rstrip()
    table = markdown[mark + len(MEASUREMENTS_MARK):start].strip()
    if mark > start or not agent.endswith(f"\n{MEASUREMENTS_HEADING}") or re.search(r"^\s*#", table, re.MULTILINE):
        return markdown, None
    return agent[:-len(MEASUREMENTS_HEADING)].rstrip() + "\n", table


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
