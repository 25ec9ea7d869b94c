"""What a session inherits: reports of earlier sessions and, at a sync, peers' engines and reports."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Verdict = Literal["retained", "rejected"]
_CHAIN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_chain_id(chain: str) -> str:
    # Chain ids become directory names (peers/<chain>/, runs/.../chains/<chain>/).
    if not isinstance(chain, str) or not _CHAIN_ID.match(chain):
        raise ValueError(f"chain id {chain!r} must be letters, digits, '_', '.' or '-' (not starting with a sign)")
    return chain


@dataclass(frozen=True)
class Report:
    """One finished session's report (markdown with a ```seis-session block) and the gate's verdict on it."""

    chain: str
    session: int
    markdown: str
    verdict: Verdict | None = None  # None: not gated (yet)

    def __post_init__(self) -> None:
        check_chain_id(self.chain)
        if not isinstance(self.session, int) or self.session < 0:
            raise ValueError(f"report session index must be an integer >= 0, got {self.session!r}")
        if self.verdict not in (None, "retained", "rejected"):
            raise ValueError(f"report verdict must be 'retained', 'rejected' or None, got {self.verdict!r}")

    @property
    def file_name(self) -> str:
        return f"{self.chain}-{self.session:03d}.md"

    def to_dict(self) -> dict:
        return {"chain": self.chain, "session": self.session, "markdown": self.markdown, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict) -> "Report":
        return cls(d["chain"], int(d["session"]), d["markdown"], d.get("verdict"))


@dataclass(frozen=True)
class PeerMaterial:
    """A peer chain's latest retained engine tree and its reports, shared at a sync."""

    chain: str
    engine_dir: Path
    reports: tuple[Report, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_chain_id(self.chain)
        object.__setattr__(self, "engine_dir", Path(self.engine_dir))
        object.__setattr__(self, "reports", tuple(self.reports))

    def to_dict(self) -> dict:
        return {"chain": self.chain, "engine_dir": str(self.engine_dir),
                "reports": [r.to_dict() for r in self.reports]}

    @classmethod
    def from_dict(cls, d: dict) -> "PeerMaterial":
        return cls(d["chain"], Path(d["engine_dir"]), tuple(Report.from_dict(r) for r in d.get("reports", ())))
