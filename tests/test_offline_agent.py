"""The offline agent: library transformations by 3-way merge, lineage-aware policy, sync adoption, reports;
and every library transformation keeps E0's outputs (tiny-qwen3, CPU, engines in child processes)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seis.agents import (Agent, AgentResult, Budget, SessionBlock, SessionContext, lineage, parse_session_block,
                         render_report, stamp_verdict)
from seis.agents.offline import (OfflineAgent, apply_transformation, exploration_order, is_present, load_library,
                                 merge_transformation, present_in)
from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import PeerMaterial, Report, copy_tree, diff_workspace, prepare_workspace, tree_hash

LIBRARY = {t.name: t for t in load_library()}
NAMES = sorted(LIBRARY)
SUPERSEDES = {n: t.supersedes for n, t in LIBRARY.items() if t.supersedes}
GAINS = {n: t.expected_speedup for n, t in LIBRARY.items()}
NEEDS = {n: t.prerequisites for n, t in LIBRARY.items()}


def _ready_order(chain_index: int = 0) -> list[str]:
    """A chain's exploration order, less what needs another entry first (not ready in a fresh E0 copy)."""
    return [n for n in exploration_order(NAMES, chain_index, SUPERSEDES, GAINS, NEEDS) if not NEEDS[n]]


def _ws(tmp_path, name="ws", reports=(), peers=()):
    return prepare_workspace(ENGINE_TEMPLATE, tmp_path / name, list(reports), list(peers))


def _report(chain, session, agent="offline", verdict=None, **lists):
    block = SessionBlock(chain, session, agent, tuple(lists.get("applied", ())), failed=tuple(lists.get("failed", ())))
    return Report(chain, session, render_report(block, "s", [], []), verdict)


def test_library_has_real_entries():
    assert len(NAMES) >= 3
    for t in LIBRARY.values():
        assert t.rationale and t.expected_effect and t.target_files and t.verified
        assert all(f.startswith("engine/") for f in t.target_files)


@pytest.mark.parametrize("name, text, says", [
    ("meta.yaml", "name: [\n", "meta.yaml cannot be read: while parsing"),
    ("meta.yaml", "- a list\n", "meta.yaml holds a list, not a mapping"),
    ("meta.yaml", "just words\n", "meta.yaml holds a str, not a mapping"),
    ("meta.json", "{\"name\": ", "meta.json cannot be read: Expecting value"),
    ("meta.yaml", b"name: \xff\n", "meta.yaml cannot be read: 'utf-8' codec"),
])
def test_an_unreadable_meta_file_is_a_value_error_naming_it(tmp_path, name, text, says):
    """An operator's library (--agent-library) with a typo in one meta.yaml: load_library raised yaml's own error
    (or a TypeError for a meta that is no mapping), which `seis evolve`'s checks did not catch, so the run ended in
    a traceback instead of one line naming the file."""
    entry = tmp_path / "lib" / "t1"
    entry.mkdir(parents=True)
    (entry / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as info:
        load_library(tmp_path / "lib")
    assert f"{entry / name} " in str(info.value) and says in str(info.value), info.value


def test_applies_a_transformation_and_writes_the_report(tmp_path):
    ws = _ws(tmp_path)
    agent = OfflineAgent()
    assert isinstance(agent, Agent)
    result = agent.edit(ws, SessionContext("c0", 1))
    first = _ready_order()[0]
    assert result.status == "edited" and result.applied == (first,) and result.attempted == (first,)
    assert ws.changed() and diff_workspace(ENGINE_TEMPLATE, ws.root)
    assert is_present(ws.root, ENGINE_TEMPLATE, LIBRARY[first])
    md = result.report_markdown
    for section in ("## Summary", "## Changes", "## Measurements", "## Lessons"):
        assert section in md
    block = parse_session_block(md, strict=True)
    assert (block.chain, block.session, block.applied, block.verdict) == ("c0", 1, (first,), None)
    assert (result.tokens_in, result.tokens_out, result.cost_usd) == (0, 0, 0.0)
    assert AgentResult.from_dict(result.to_dict()) == result
    # Deterministic: the same inputs give the same engine.
    ws2 = _ws(tmp_path, "ws2")
    agent.edit(ws2, SessionContext("c0", 1))
    assert tree_hash(ws2.root) == tree_hash(ws.root)


def test_chains_explore_in_different_orders(tmp_path):
    firsts = {OfflineAgent().edit(_ws(tmp_path, f"w{i}"), SessionContext(f"c{i}", 1, chain_index=i)).applied[0]
              for i in range(len(NAMES))}
    # every chain starts somewhere else: anywhere but what is superseded or needs another entry first
    needs = {n for n, t in LIBRARY.items() if t.prerequisites}
    assert firsts == set(NAMES) - {n for lesser in SUPERSEDES.values() for n in lesser} - needs


def test_never_retries_what_failed_or_was_rejected(tmp_path):
    order = _ready_order()
    reports = [_report("c0", 1, failed=[order[0]]),
               _report("c0", 2, applied=[order[1]], verdict="rejected")]
    result = OfflineAgent().edit(_ws(tmp_path, reports=reports), SessionContext("c0", 3, inherited_reports=reports))
    assert result.applied == (order[2],) and set(result.attempted) == {order[2]}
    assert f"`{order[0]}`" in result.report_markdown.split("## Lessons")[1]
    # Everything tried or present: nothing left to do.
    everything = reports + [_report("c0", 3, failed=order[2:])]
    result = OfflineAgent().edit(_ws(tmp_path, "ws2"), SessionContext("c0", 4, inherited_reports=everything))
    assert result.status == "no_change" and result.attempted == ()


def test_adopts_what_a_peer_retained_at_a_sync(tmp_path):
    peer_dir = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer_dir)
    order = _ready_order()
    kept, blocked = order[-1], order[-2]
    for name in (kept, blocked):
        assert apply_transformation(peer_dir, ENGINE_TEMPLATE, LIBRARY[name]).outcome == "applied"
    peer = PeerMaterial("c1", peer_dir, (_report("c1", 1, applied=[kept, blocked], verdict="retained"),))
    own = [_report("c0", 1, failed=[blocked])]
    ws = _ws(tmp_path, reports=own, peers=[peer])
    result = OfflineAgent().edit(ws, SessionContext("c0", 2, inherited_reports=own, peers=(peer,)))
    assert result.status == "edited" and result.applied == ()
    assert [(a.name, a.from_chain) for a in result.adopted] == [(kept, "c1")]
    assert is_present(ws.root, ENGINE_TEMPLATE, LIBRARY[kept]) and not is_present(ws.root, ENGINE_TEMPLATE,
                                                                                   LIBRARY[blocked])
    block = parse_session_block(result.report_markdown)
    assert block.changes() == (kept,) and block.adopted[0].from_chain == "c1"
    # Once adopted, the next sync has nothing to take from that peer and explores instead.
    again = OfflineAgent().edit(ws, SessionContext("c0", 3, inherited_reports=own, peers=(peer,)))
    assert again.adopted == () and len(again.applied) == 1


def test_a_sync_adopts_a_peers_dependent_changes_with_their_prerequisites(tmp_path):
    """A peer retained triton-gemv, gate-up-silu-epilogue (which needs it) and batched-mlp-matmuls (which needs
    that one). Adoption went once through the names in alphabetical order, where each dependent comes before what
    it needs: only triton-gemv was taken, and the report said the other two could not be, their prerequisites
    missing, which the same session had just adopted. Each is taken once what it needs is in."""
    stack = ["triton-gemv", "gate-up-silu-epilogue", "batched-mlp-matmuls"]
    assert [LIBRARY[n].prerequisites for n in stack] == [(), ("triton-gemv",), ("gate-up-silu-epilogue",)]
    peer_dir = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer_dir)
    for name in stack:
        assert apply_transformation(peer_dir, ENGINE_TEMPLATE, LIBRARY[name]).outcome == "applied"
    peer = PeerMaterial("c1", peer_dir, (_report("c1", 1, applied=stack, verdict="retained"),))
    ws = _ws(tmp_path, peers=[peer])
    result = OfflineAgent().edit(ws, SessionContext("c0", 1, peers=(peer,)))
    assert [(a.name, a.from_chain) for a in result.adopted] == [(n, "c1") for n in stack]
    assert set(stack) <= present_in(ws.root, ENGINE_TEMPLATE, LIBRARY)
    assert "prerequisites are missing" not in result.report_markdown
    assert parse_session_block(result.report_markdown).changes() == tuple(stack)


def test_three_way_merge_keeps_other_changes_and_reports_conflicts(tmp_path):
    t = LIBRARY["decode-pinned-metadata"]
    ws = _ws(tmp_path)
    engine_py = ws.root / "engine" / "engine.py"
    # Already modified: another transformation in the same file plus a hand edit.
    assert apply_transformation(ws.root, ENGINE_TEMPLATE, LIBRARY["batched-scoring"]).outcome == "applied"
    engine_py.write_text(engine_py.read_text().replace('"""The offline engine', '"""(edited) The offline engine'))
    assert apply_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "applied"
    text = engine_py.read_text()
    assert "(edited) The offline engine" in text and "self._meta_host" in text and "tops[k] =" in text
    assert merge_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "present"
    # A workspace that rewrote the lines the patch changes: conflict, reported as failed, nothing written.
    ws2 = _ws(tmp_path, "ws2")
    path = ws2.root / "engine" / "engine.py"
    old = "packed = _tensor(list(zip(*cols)), self.device)"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, "packed = torch.tensor(cols).T.contiguous().to(self.device)"))
    before = tree_hash(ws2.root)
    assert merge_transformation(ws2.root, ENGINE_TEMPLATE, t).outcome == "conflict"
    ctx = SessionContext("c0", 1, budget=Budget(max_attempts=1))
    result = OfflineAgent(library=(t,)).edit(ws2, ctx)
    assert result.status == "failed" and result.failed[0].name == t.name and "conflict" in result.failed[0].reason
    assert tree_hash(ws2.root) == before
    assert parse_session_block(result.report_markdown).failed == (t.name,)


def test_entries_that_change_neighbouring_lines_are_each_present(tmp_path):
    """ngram-speculation adds a method right above the one overlapped-greedy-chunks rewrites. With both in the
    engine a 3-way merge of either conflicts (diff aligns the two changes into one hunk), yet each is present, in
    either order; with one of its added lines gone, it is not."""
    multistep, ngram, ahead = (LIBRARY[n] for n in ("greedy-multistep-decode", "ngram-speculation",
                                                      "overlapped-greedy-chunks"))
    for i, order in enumerate([(ngram, ahead), (ahead, ngram)]):
        ws = _ws(tmp_path, f"o{i}")
        for t in (multistep, *order):
            assert apply_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "applied", (i, t.name)
        for t in order:
            assert merge_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "present", (i, t.name)
        assert {multistep.name, ngram.name, ahead.name} <= present_in(ws.root, ENGINE_TEMPLATE, LIBRARY)
    multistep_py = ws.root / "engine" / "multistep.py"
    multistep_py.write_text(multistep_py.read_text().replace("        self.chunks_after += 1\n", ""))
    assert merge_transformation(ws.root, ENGINE_TEMPLATE, ahead).outcome != "present"
    assert is_present(ws.root, ENGINE_TEMPLATE, ngram)


def test_a_merge_neither_reads_nor_writes_through_a_link_in_the_workspace(tmp_path):
    """A workspace file or folder replaced by a link out of the tree (to host files that would merge cleanly) is a
    conflict: nothing outside is read into the workspace or written, and the link is left as it was."""
    import shutil
    outside = tmp_path / "outside"
    shutil.copytree(ENGINE_TEMPLATE / "engine", outside)
    before = tree_hash(outside)
    for target, t in (("engine/engine.py", "decode-pinned-metadata"), ("engine/kernels", "triton-gemv")):
        ws = _ws(tmp_path, f"ws-{t}")
        link = ws.root / target
        shutil.rmtree(link) if link.is_dir() else link.unlink()
        link.symlink_to(outside / Path(target).relative_to("engine"))
        for attempt in (merge_transformation, apply_transformation):
            result = attempt(ws.root, ENGINE_TEMPLATE, LIBRARY[t])
            assert result.outcome == "conflict" and "symlink" in result.detail, (t, result)
        assert not is_present(ws.root, ENGINE_TEMPLATE, LIBRARY[t]) and link.is_symlink()
    assert tree_hash(outside) == before


def test_stamped_verdicts_feed_the_lineage():
    md = _report("c0", 1, applied=["x"]).markdown
    rejected = stamp_verdict(md, "rejected", "| metric | value |\n| --- | --- |\n| tok/s | 1 |")
    assert "| tok/s | 1 |" in rejected and "Left for the gate" not in rejected
    assert parse_session_block(rejected).rejected == ("x",)
    kept = stamp_verdict(_report("c0", 2, applied=["y"]).markdown, "retained")
    history = lineage([Report("c0", 1, rejected), Report("c0", 2, kept), Report("c0", 3, "no block here")])
    assert history.rejected == {"x"} and history.retained == {"y"} and history.unreadable == ("c0-003.md",)
    # The gate's record (Report.verdict) wins over the markdown.
    assert lineage([Report("c0", 2, kept, verdict="rejected")]).rejected == {"y"}


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """Each transformation alone and all in sequence, applied to E0, vs E0 (tiny-qwen3, CPU)."""
    from seis.agents.offline.verify import verify
    return verify("tiny-qwen3", "cpu", work_dir=tmp_path_factory.mktemp("candidates"))


@pytest.mark.parametrize("candidate", NAMES + ["all"])
def test_library_transformation_keeps_e0_outputs(verified, candidate):
    r = verified["candidates"][candidate]
    assert r["greedy_equal"] and r["sampled_equal"] and r["score_top_ids_equal"]
    assert r["score_max_abs_diff"] == 0.0 and r["verify_max_abs_diff"] == 0.0


def _run_sync_chain(tmp_path, chains: int, sessions: int, sync_every: int) -> dict[str, set[str]]:
    """The offline agent's sessions of a sync-chain run in which every candidate is retained (what each chain's
    engine holds at the end); the protocol's sync rule: a fan-in before sessions N, 2N, ... (0-based)."""
    import shutil

    heads = {f"c{i}": ENGINE_TEMPLATE for i in range(chains)}
    reports: dict[str, list[Report]] = {c: [] for c in heads}
    for s in range(sessions):
        sync = s > 0 and s % sync_every == 0
        new_heads = {}
        for i, chain in enumerate(heads):
            peers = [PeerMaterial(c, heads[c], tuple(reports[c])) for c in heads if c != chain] if sync else []
            ws = prepare_workspace(heads[chain], tmp_path / f"{chain}-s{s}", reports[chain], peers)
            result = OfflineAgent().edit(ws, SessionContext(chain, s, chain_index=i,
                                                            inherited_reports=tuple(reports[chain]),
                                                            peers=tuple(peers)))
            reports[chain].append(Report(chain, s, result.report_markdown, "retained"))
            new_heads[chain] = tmp_path / f"{chain}-s{s}-engine"
            shutil.copytree(ws.root / "engine", new_heads[chain] / "engine")
        heads = new_heads
    return {c: present_in(d, ENGINE_TEMPLATE, LIBRARY) for c, d in heads.items()}


@pytest.mark.slow
def test_ranked_by_expected_speedup_the_issues_sync_chain_reaches_the_fast_stack(tmp_path):
    """3 chains x 10 sessions, sync every 5 (the seis/sync-chain deployment), every session retained: chains start
    from different entries among those with the largest measured gains, and at the end every chain holds the whole
    speed stack, speculation included (one engine fast with speculation off and on)."""
    order = exploration_order(NAMES, 0, SUPERSEDES, GAINS, NEEDS)
    assert [GAINS[n] for n in order] == sorted(GAINS.values(), reverse=True)  # no supersession reorders today
    firsts = [_ready_order(i)[0] for i in range(3)]
    assert len(set(firsts)) == 3 and firsts[0] == max((n for n in NAMES if not NEEDS[n]), key=GAINS.get)
    for i in range(3):  # what needs another entry keeps its ranked place in every chain
        assert [(j, n) for j, n in enumerate(exploration_order(NAMES, i, SUPERSEDES, GAINS, NEEDS)) if NEEDS[n]] \
            == [(j, n) for j, n in enumerate(order) if NEEDS[n]]
    held = _run_sync_chain(tmp_path, chains=3, sessions=10, sync_every=5)
    stack = {"triton-gemv", "prefill-cuda-graphs", "fused-qk-rope-store", "greedy-multistep-decode",
             "gate-up-silu-epilogue", "fused-decode-attention", "overlapped-greedy-chunks", "batched-mlp-matmuls",
             "bounded-greedy-head", "batched-bounded-greedy-head"}
    assert all(stack | {"ngram-speculation"} <= h for h in held.values()), held


def test_a_superseded_transformation_is_not_tried(tmp_path):
    superseding = [t for t in LIBRARY.values() if t.supersedes]
    assert superseding, "the library has an entry that supersedes another"
    t = superseding[0]
    budget = Budget(max_transformations=len(NAMES), max_attempts=len(NAMES))
    for i in range(len(NAMES)):  # every exploration order, trying everything it may
        w = _ws(tmp_path, f"v{i}")
        apply_transformation(w.root, ENGINE_TEMPLATE, t)
        result = OfflineAgent().edit(w, SessionContext(f"c{i}", 2, chain_index=i, budget=budget))
        assert result.attempted and not set(t.supersedes) & set(result.attempted)


def test_rebase_carries_a_patch_onto_a_changed_e0(tmp_path):
    from seis.agents.offline.library import Transformation
    from seis.agents.offline.rebase import rebase, unified_diff

    def copy(name):
        copy_tree(ENGINE_TEMPLATE, tmp_path / name)
        return tmp_path / name

    t = LIBRARY["batched-scoring"]
    old = copy("old")
    engine_py = old / "engine" / "engine.py"
    # a line of the patch's hunk context: changed, the stale patch cannot apply to today's E0
    line = "        scored = [i for i, r in enumerate(reqs) if r.forced is not None]\n"
    assert line in engine_py.read_text()
    engine_py.write_text(engine_py.read_text().replace(line, line[:-1] + "  # an older E0\n"))
    made_on_old = tmp_path / "old-patched"
    copy_tree(old, made_on_old)
    assert apply_transformation(made_on_old, ENGINE_TEMPLATE, t).outcome == "applied"  # t, carried onto old
    old_patch = unified_diff(old, {"engine/engine.py": (made_on_old / "engine" / "engine.py").read_bytes()})
    stale = Transformation(t.name, t.rationale, t.expected_effect, t.target_files, old_patch)
    assert merge_transformation(copy("e0"), ENGINE_TEMPLATE, stale).outcome == "error"
    carried = Transformation(t.name, t.rationale, t.expected_effect, t.target_files, rebase(stale, old_dir=old))
    a, b = copy("a"), copy("b")
    assert apply_transformation(a, ENGINE_TEMPLATE, carried).outcome == "applied"
    assert apply_transformation(b, ENGINE_TEMPLATE, t).outcome == "applied"
    assert tree_hash(a) == tree_hash(b)


def test_what_supersedes_is_explored_before_what_it_supersedes():
    sup = {"b-better": ("a-lesser",)}
    names = ["a-lesser", "b-better", "c", "d"]
    for i in range(len(names)):
        order = exploration_order(names, i, sup)
        assert sorted(order) == sorted(names) and order.index("b-better") < order.index("a-lesser")
    assert exploration_order(names, 2, sup) == ["c", "d", "b-better", "a-lesser"]  # otherwise the chain's rotation
    assert exploration_order(names, 0) == names
    # chains of supersession, listed in any order: the greatest comes first whatever the rotation
    chain = {"q-best": ("t-mid",), "t-mid": ("a-least",)}
    for sup in (chain, dict(reversed(chain.items()))):
        for i in range(4):
            order = exploration_order(["a-least", "q-best", "t-mid", "x"], i, sup)
            assert order.index("q-best") < order.index("t-mid") < order.index("a-least"), (i, order)


def _library_with_a_dependent(tmp_path, prerequisites=("triton-gemv",)):
    """A library folder: copies of triton-gemv and batched-scoring, and `gemv-note`, whose patch was made against
    E0 + triton-gemv: it edits a file triton-gemv creates and a line triton-gemv changed."""
    import shutil

    from seis.agents.offline.rebase import unified_diff
    from seis.agents.offline.verify import build_candidate

    root = tmp_path / "library"
    for name in ("triton-gemv", "batched-scoring"):
        shutil.copytree(LIBRARY[name].path, root / name)
    base = build_candidate(tmp_path / "made-on", [LIBRARY["triton-gemv"]])
    gemv, model = "engine/kernels/triton_gemv.py", "engine/model.py"
    new_gemv = (base / gemv).read_text().replace("GEMV_MAX_TOKENS = 2", "GEMV_MAX_TOKENS = 2  # noted")
    line = "hidden = ops.linear(attn_out, self.o_proj)"
    assert "GEMV_MAX_TOKENS = 2" in (base / gemv).read_text() and line in (base / model).read_text()
    assert line not in (ENGINE_TEMPLATE / model).read_text()  # a line triton-gemv wrote
    new_model = (base / model).read_text().replace(line, line + "  # noted")
    (root / "gemv-note").mkdir()
    (root / "gemv-note" / "patch.diff").write_text(unified_diff(base, {gemv: new_gemv.encode(),
                                                                      model: new_model.encode()}))
    (root / "gemv-note" / "meta.json").write_text(json.dumps({
        "name": "gemv-note", "rationale": "test", "expected_effect": "none", "target_files": [gemv, model],
        "prerequisites": list(prerequisites)}))
    return {t.name: t for t in load_library(root)}


def test_a_dependent_transformation_builds_on_its_prerequisites(tmp_path):
    lib = _library_with_a_dependent(tmp_path)
    note, gemv, scoring = lib["gemv-note"], lib["triton-gemv"], lib["batched-scoring"]
    # Onto E0 alone it does not apply (the file it edits does not exist there), and nothing is written.
    bare = _ws(tmp_path, "bare")
    before = tree_hash(bare.root)
    assert merge_transformation(bare.root, ENGINE_TEMPLATE, note).outcome == "conflict"
    assert tree_hash(bare.root) == before
    # With its prerequisite it merges, in any order with an unrelated transformation, to the same engine.
    trees = []
    for i, order in enumerate([(gemv, note, scoring), (scoring, gemv, note), (gemv, scoring, note)]):
        ws = _ws(tmp_path, f"o{i}")
        for t in order:
            assert apply_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "applied", (i, t.name)
        # the dependent's edit of a file triton-gemv created leaves triton-gemv present through it
        assert not is_present(ws.root, ENGINE_TEMPLATE, gemv) and is_present(ws.root, ENGINE_TEMPLATE, note)
        assert present_in(ws.root, ENGINE_TEMPLATE, lib) == set(lib)
        trees.append(tree_hash(ws.root))
    assert len(set(trees)) == 1
    text = (ws.root / "engine/kernels/triton_gemv.py").read_text()
    assert "GEMV_MAX_TOKENS = 2  # noted" in text and "  # noted" in (ws.root / "engine/model.py").read_text()
    # The agent tries it only once its prerequisite is in, whatever its exploration order.
    for i in range(3):
        ws = _ws(tmp_path, f"agent{i}")
        result = OfflineAgent(library=tuple(lib.values())).edit(
            ws, SessionContext("c0", 1, chain_index=i, budget=Budget(max_transformations=3, max_attempts=3)))
        assert not result.failed and "gemv-note" in result.applied
        assert result.applied.index("triton-gemv") < result.applied.index("gemv-note")


def test_a_prerequisite_cycle_is_an_error_not_a_merge(tmp_path):
    lib = _library_with_a_dependent(tmp_path, prerequisites=("gemv-note",))
    result = merge_transformation(_ws(tmp_path).root, ENGINE_TEMPLATE, lib["gemv-note"])
    assert result.outcome == "error" and "cycle" in result.detail


def test_a_tree_the_merge_cannot_take_is_a_conflict_never_an_error(tmp_path):
    """An inherited engine or a peer's is whatever its session left: a target file holding a NUL byte (git
    merge-file refuses binary files), a directory where a transformation creates a file, a file where it needs a
    directory. Each is a conflict the agent records and goes on from; each used to raise out of edit(), which
    stopped the run, and a resume met the same tree again."""
    import shutil
    t_bin, t_new, t_under = (LIBRARY[n] for n in ("decode-pinned-metadata", "prefill-cuda-graphs",
                                                   "greedy-multistep-decode"))
    cases = {"binary": (t_bin, lambda root: (root / "engine" / "engine.py").write_bytes(
                 b"\0" + (root / "engine" / "engine.py").read_bytes())),
             "dir": (t_new, lambda root: (root / "engine" / "prefill_graph.py" / "x").mkdir(parents=True)),
             "file": (t_under, lambda root: shutil.rmtree(root / "engine" / "kernels") or
                      (root / "engine" / "kernels").write_text("x = 1\n"))}
    for name, (t, plant) in cases.items():
        ws = _ws(tmp_path, name)
        plant(ws.root)
        before = tree_hash(ws.root)
        assert merge_transformation(ws.root, ENGINE_TEMPLATE, t).outcome == "conflict", name
        result = OfflineAgent(library=(t,)).edit(ws, SessionContext("c0", 1, budget=Budget(max_attempts=1)))
        assert result.status == "failed" and result.failed[0].name == t.name, (name, result.failed)
        assert tree_hash(ws.root) == before, name
    # A peer's tree holding such a file: the sync looks at it and goes on.
    peer_dir = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer_dir)
    (peer_dir / "engine" / "engine.py").write_bytes(b"\0")
    peer = PeerMaterial("c1", peer_dir, ())
    ws = _ws(tmp_path, "sync", peers=[peer])
    assert OfflineAgent().edit(ws, SessionContext("c0", 1, peers=(peer,))).status == "edited"


def test_a_transformation_that_cannot_write_one_of_its_files_changes_none(tmp_path, monkeypatch):
    """A write that fails midway (a full disk) left the files written before it in place: a tree holding half of an
    entry, which neither the report nor is_present described."""
    import builtins

    ws = _ws(tmp_path, "ws")
    before = tree_hash(ws.root)
    t = LIBRARY["triton-gemv"]
    assert len(merge_transformation(ws.root, ENGINE_TEMPLATE, t).files) > 1
    written = []
    real_fdopen = os.fdopen

    def failing_fdopen(fd, *args, **kwargs):
        written.append(fd)
        if len(written) == 2:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real_fdopen(fd, *args, **kwargs)
    monkeypatch.setattr(os, "fdopen", failing_fdopen)
    with pytest.raises(OSError, match="No space left"):
        apply_transformation(ws.root, ENGINE_TEMPLATE, t)
    monkeypatch.setattr(os, "fdopen", real_fdopen)
    assert tree_hash(ws.root) == before
    assert not [p for p in ws.root.rglob("*.part")]
