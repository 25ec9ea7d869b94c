"""Every Triton kernel of E0 and of each offline-library entry reads only globals that the GPU compiler accepts.

The CPU tests run kernels under Triton's interpreter, which executes a @triton.jit function as Python: a kernel
that reads a module-level integer works there, and the compiler refuses it on the GPU (only tl.constexpr globals,
modules, jit functions, dtypes and triton.language objects), so such an entry passes every CPU test and fails to
build on the GPU (persistent-decode-layers, 9a3dbfe). This applies the compiler's rule to the source, on the CPU.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from seis.agents.offline.library import load_library
from seis.agents.offline.merge import with_prerequisites
from seis.agents.offline.verify import build_candidate
from seis.engine_import import ENGINE_TEMPLATE

LIBRARY = {t.name: t for t in load_library()}


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Attribute) and target.attr == "jit") or (
                isinstance(target, ast.Name) and target.id == "jit"):
            return True
    return False


def _is_constexpr(value: ast.AST) -> bool:
    """tl.constexpr(...) itself, or a tuple / generator of them (NAME_A, NAME_B = (tl.constexpr(i) for ...))."""
    if isinstance(value, (ast.Tuple, ast.List)):
        return all(_is_constexpr(v) for v in value.elts)
    if isinstance(value, (ast.GeneratorExp, ast.ListComp)):
        return _is_constexpr(value.elt)
    return isinstance(value, ast.Call) and (
        (isinstance(value.func, ast.Attribute) and value.func.attr == "constexpr")
        or (isinstance(value.func, ast.Name) and value.func.id == "constexpr"))


def _plain_globals(module: ast.Module) -> set[str]:
    """Module-level names bound by an assignment to something other than a constexpr (imports, functions and
    classes are allowed, as the compiler allows modules, jit functions and triton.language objects)."""
    plain = set()
    for node in module.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not _is_constexpr(node.value):
                plain |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return plain


def refused_globals(source: str) -> list[str]:
    """`function: name` for every plain module-level global a @triton.jit function reads."""
    module = ast.parse(source)
    plain = _plain_globals(module)
    refused = []
    for fn in (n for n in module.body if isinstance(n, ast.FunctionDef) and _is_jit(n)):
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        defaults = {id(n) for d in fn.args.defaults for n in ast.walk(d)}  # the compiler allows globals there
        refused += sorted({f"{fn.name}: {n.id}" for n in ast.walk(fn) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Load) and n.id in plain and n.id not in local
                           and id(n) not in defaults})
    return refused


def test_the_rule_refuses_a_plain_integer_and_accepts_a_constexpr():
    source = '''
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait
BLOCK = 16
ROWS = tl.constexpr(16)
A, B = (tl.constexpr(i) for i in range(2))
SCALE: tl.constexpr = 2.0

@triton.jit
def _helper(x):
    return x

@triton.jit
def kernel(X, N, W: tl.constexpr = BLOCK):
    gdc_wait()
    offs = tl.arange(0, ROWS) + A + B
    n = N
    tl.store(X + offs, _helper(offs) * BLOCK * SCALE, mask=offs < n)

def host(x):
    return BLOCK * x
'''
    assert refused_globals(source) == ["kernel: BLOCK", "kernel: SCALE"]


def _kernel_files(tree: Path) -> list[Path]:
    return sorted(p for p in (tree / "engine").rglob("*.py") if "triton" in p.read_text(encoding="utf-8"))


def test_e0s_kernels_read_only_globals_the_compiler_accepts():
    files = _kernel_files(ENGINE_TEMPLATE)
    assert any(p.name == "triton_attention.py" for p in files)
    assert {str(p): refused_globals(p.read_text(encoding="utf-8")) for p in files} == {str(p): [] for p in files}


@pytest.mark.parametrize("entry", sorted(LIBRARY))
def test_each_entrys_kernels_read_only_globals_the_compiler_accepts(entry, tmp_path):
    t = LIBRARY[entry]
    tree = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    files = [tree / rel for rel in t.target_files if rel.endswith(".py") and (tree / rel).is_file()]
    assert {rel.name: refused_globals(rel.read_text(encoding="utf-8")) for rel in files} == {
        rel.name: [] for rel in files}
