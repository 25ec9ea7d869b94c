"""Create a session workspace from a parent engine tree, with inherited reports and peers' material beside it.

Layout of a workspace (the engine tree is everything but reports/ and peers/):

    <dest>/engine/ CONTRACT.md NOTES*.md ...   copied from the parent (what the agent edits)
    <dest>/reports/<chain>-<NNN>.md           inherited reports, oldest first, plus index.json
    <dest>/peers/<chain>/                      a peer's engine tree, with its reports under reports/
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .materials import PeerMaterial, Report
from .tree import TreeError, copy_tree, tree_hash

REPORTS_DIR = "reports"
PEERS_DIR = "peers"


@dataclass(frozen=True)
class Workspace:
    root: Path                       # the engine tree the agent edits (engine/ lives here)
    parent_dir: Path                 # where it was copied from (diff base)
    parent_hash: str                 # tree_hash of the parent at copy time
    reports: tuple[Path, ...] = ()   # inherited report files, oldest first
    peers: dict[str, Path] = field(default_factory=dict, hash=False)  # chain -> peers/<chain>/ (engine tree)

    @property
    def reports_dir(self) -> Path:
        return self.root / REPORTS_DIR

    @property
    def peers_dir(self) -> Path:
        return self.root / PEERS_DIR

    @property
    def laid_out(self) -> tuple[Path, ...]:
        """The session material the harness laid out here (reports/, and peers/ at a sync): shown read-only to the
        agent, so none of it is the agent's output, nor counts against its limits. A peers/ the agent made where
        the harness laid none out is the agent's own."""
        return (self.reports_dir,) + ((self.peers_dir,) if self.peers else ())

    def diff(self) -> str:
        from .diff import diff_workspace
        return diff_workspace(self.parent_dir, self.root)

    def tree_hash(self) -> str:
        return tree_hash(self.root)

    def changed(self) -> bool:
        return self.tree_hash() != self.parent_hash


def _write_reports(dest: Path, reports: list[Report] | tuple[Report, ...]) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    ordered = sorted(reports, key=lambda r: (r.session, r.chain))
    paths, index = [], []
    for r in ordered:
        path = dest / r.file_name
        if path.exists():
            raise ValueError(f"two reports for {r.chain} session {r.session}")
        path.write_text(r.markdown, encoding="utf-8")
        paths.append(path)
        index.append({"file": r.file_name, "chain": r.chain, "session": r.session, "verdict": r.verdict})
    # index.json: the verdicts in machine-readable form, next to the markdown an agent reads.
    (dest / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return paths


def prepare_workspace(parent_dir: str | Path, dest: str | Path, inherited_reports: list[Report] = (),
                      peers: list[PeerMaterial] = ()) -> Workspace:
    """Copy the parent's engine tree into dest (new or empty), then lay out reports and peers beside it."""
    parent, dest = Path(parent_dir).resolve(), Path(dest)
    if not (parent / "engine" / "__init__.py").is_file():
        raise TreeError(f"parent {parent} has no engine package (engine/__init__.py)")
    chains = [p.chain for p in peers]
    if len(set(chains)) != len(chains):
        raise ValueError(f"peer chains must be distinct, got {chains}")
    parent_hash = tree_hash(parent)
    copy_tree(parent, dest)
    dest = dest.resolve()
    report_paths = _write_reports(dest / REPORTS_DIR, list(inherited_reports))
    peer_dirs: dict[str, Path] = {}
    for peer in sorted(peers, key=lambda p: p.chain):
        pdir = dest / PEERS_DIR / peer.chain
        copy_tree(peer.engine_dir, pdir)
        _write_reports(pdir / REPORTS_DIR, list(peer.reports))
        peer_dirs[peer.chain] = pdir
    return Workspace(dest, parent, parent_hash, tuple(report_paths), peer_dirs)
