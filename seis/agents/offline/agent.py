"""A deterministic agent with no network: it applies transformations from its library.

Policy, in order:
1. read the lineage from the inherited reports; never retry what failed or was rejected in it;
2. at a sync, adopt what peers retained (their reports' retained changes, and library transformations found in
   their code), unless already in this engine or blocked, each once what it needs is in (adopted first);
3. otherwise apply the next untried transformation, the library ranked by each entry's expected speedup (its
   meta's measured prior), what a fresh E0 can take rotated by the chain index (so chains explore different
   things first), until the budget's max_transformations apply or max_attempts are spent.
A transformation is tried only once its prerequisites are in the engine, and not at all once one that supersedes
it is.
"""
from __future__ import annotations

import time
from pathlib import Path

from ...engine_import import ENGINE_TEMPLATE
from ...workspace import Workspace
from ..report import SessionBlock, lineage, render_report
from ..types import Adoption, AgentResult, Failure, SessionContext
from .library import Transformation, load_library
from .merge import apply_transformation, present_in


def exploration_order(names: list[str], chain_index: int, supersedes: dict[str, tuple[str, ...]] | None = None,
                      gains: dict[str, float] | None = None, needs: dict[str, tuple[str, ...]] | None = None
                      ) -> list[str]:
    """The library ranked by expected gain (ties by name), the entries a fresh E0 can take rotated by the chain
    index among their ranked places so that chains start in different places; an entry that needs others (`needs`)
    keeps its ranked place, so it is tried as soon as they are in. A transformation comes before those it
    supersedes (trying the lesser one first would block the greater: their patches conflict)."""
    gains, needs = gains or {}, needs or {}
    order = sorted(names, key=lambda n: (-gains.get(n, 1.0), n))
    roots = [i for i, n in enumerate(order) if not needs.get(n)]
    if roots:
        k = chain_index % len(roots)
        turned = [order[i] for i in roots[k:] + roots[:k]]
        for i, name in zip(roots, turned):
            order[i] = name
    for _ in range(len(order)):  # until no move is left: moving one entry can put it behind what it supersedes
        moved = False
        for name, lesser in (supersedes or {}).items():
            if name not in order:
                continue
            earlier = [n for n in lesser if n in order and order.index(n) < order.index(name)]
            if earlier:
                order.remove(name)
                order.insert(min(order.index(n) for n in earlier), name)
                moved = True
        if not moved:
            break
    return order


class OfflineAgent:
    name = "offline"

    def __init__(self, library: tuple[Transformation, ...] | None = None, base_dir: str | Path = ENGINE_TEMPLATE):
        self.library = {t.name: t for t in (library if library is not None else load_library())}
        self.base_dir = Path(base_dir)  # E0: what every library patch was made against

    def _peer_retained(self, workspace: Workspace, context: SessionContext) -> list[tuple[str, str]]:
        """(transformation, peer chain) pairs a peer retained, in a stable order, first peer wins."""
        seen: dict[str, str] = {}
        for peer in sorted(context.peers, key=lambda p: p.chain):
            names = set(lineage(peer.reports).retained)
            code = workspace.peers.get(peer.chain, peer.engine_dir)
            names |= present_in(code, self.base_dir, self.library)
            for n in sorted(names & self.library.keys()):
                seen.setdefault(n, peer.chain)
        return sorted(seen.items())

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        start = time.perf_counter()
        history = lineage(context.inherited_reports)
        blocked = set(history.blocked)
        present = present_in(workspace.root, self.base_dir, self.library)
        applied: list[str] = []
        adopted: list[Adoption] = []
        failed: list[Failure] = []
        attempted: list[str] = []
        skipped_peer: list[str] = []

        def ready(name: str) -> bool:
            t = self.library[name]
            superseded = any(name in self.library[p].supersedes for p in present)
            return set(t.prerequisites) <= present and not superseded

        def attempt(name: str) -> bool:
            attempted.append(name)
            result = apply_transformation(workspace.root, self.base_dir, self.library[name])
            if result.outcome == "applied":
                present.add(name)
                return True
            if result.outcome == "present":  # content-equal already (counted as present, not as a change)
                present.add(name)
                return False
            failed.append(Failure(name, result.detail))
            blocked.add(name)
            return False

        pending = self._peer_retained(workspace, context) if context.is_sync else []
        progress = True
        while progress:  # again after an adoption: a peer's change that needs it (sorted before it) is ready now
            progress, waiting = False, []
            for name, chain in pending:
                if name in present:
                    continue
                if name in blocked:
                    skipped_peer.append(f"`{name}` (from {chain}): failed or rejected earlier in this chain")
                    continue
                if not ready(name):
                    waiting.append((name, chain))
                    continue
                if attempt(name):
                    adopted.append(Adoption(name, chain))
                progress = progress or name in present  # adopted, or found in the engine already
            pending = waiting
        skipped_peer += [f"`{name}` (from {chain}): its prerequisites are missing or it is superseded"
                         for name, chain in pending]

        budget = context.budget
        if not adopted:
            supersedes = {n: t.supersedes for n, t in self.library.items() if t.supersedes}
            gains = {n: t.expected_speedup for n, t in self.library.items()}
            needs = {n: t.prerequisites for n, t in self.library.items()}
            order = exploration_order(list(self.library), context.chain_index, supersedes, gains, needs)
            progress = True
            while progress:  # again after a change: what it made ready (a dependent of it) may come earlier
                progress = False
                for name in order:
                    if len(applied) >= budget.max_transformations or len(attempted) >= budget.max_attempts:
                        break
                    if name in present or name in blocked or not ready(name):
                        continue
                    if attempt(name):
                        applied.append(name)
                        progress = True

        status = "edited" if applied or adopted else ("failed" if failed else "no_change")
        block = SessionBlock(context.chain, context.session, self.name, tuple(applied), tuple(adopted),
                             tuple(f.name for f in failed))
        report = self._report(block, status, history, failed, skipped_peer)
        notes = (f"applied={applied} adopted={[(a.name, a.from_chain) for a in adopted]} "
                 f"failed={[f.name for f in failed]}")
        return AgentResult(self.name, status, report, notes, tuple(applied), tuple(attempted), tuple(adopted),
                           tuple(failed), wall_s=round(time.perf_counter() - start, 3))

    def _report(self, block: SessionBlock, status: str, history, failed: list[Failure],
                skipped_peer: list[str]) -> str:
        t = self.library
        summary = []
        if block.adopted:
            summary.append("Adopted from peers: " + ", ".join(f"`{a.name}` ({a.from_chain})" for a in block.adopted)
                           + ".")
        if block.applied:
            summary.append("Applied " + ", ".join(f"`{n}`" for n in block.applied) + " from the offline library.")
        if status == "no_change":
            summary.append("Nothing left to try: every library transformation is in the engine or blocked.")
        if status == "failed":
            summary.append("Every transformation tried failed to apply; the engine is unchanged.")
        changes = [t[n].describe() + f" Expected: {t[n].expected_effect.strip()}" for n in block.changes()]
        lessons = [f"`{f.name}` did not apply: {f.reason}" for f in failed] + skipped_peer
        if history.blocked:
            lessons.append("Not retried (failed or rejected earlier in this chain): "
                           + ", ".join(f"`{n}`" for n in sorted(history.blocked)) + ".")
        for n in block.changes():
            if t[n].gpu_only:
                lessons.append(f"`{n}` changes CUDA-only code: only the gate's GPU run exercises it.")
        return render_report(block, " ".join(summary), changes, lessons)
