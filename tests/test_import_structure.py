"""The import structure of seis/, flows/ and tasks/: no import circles, and every import goes down the layers.

The graph is read with `ast` (nothing is imported): an edge for every `import` / `from ... import` anywhere in a
file (at module level, in a function, under TYPE_CHECKING alike), `from pkg import name` going to the submodule
`pkg.name` where there is one, else to `pkg`. A package's `__init__` is the module `pkg`."""
from __future__ import annotations

import ast
from collections import deque
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seis", "flows", "tasks")

# Top to bottom: a module may import modules of its own layer or of a layer below it, never one above.
# Each entry is a package (with everything in it) or a module; a module's layer is that of its longest entry.
# A new module directly under seis/ has none until it is placed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("seis.cli", "seis.__main__")),
    ("benchmarks", ("seis.benchmarks",)),   # standalone timing tools: they build engines with the offline agent's
                                            # library and score accuracy with postval's; nothing imports them
    ("flows", ("flows",)),
    ("tasks", ("tasks",)),
    ("session", ("seis.session",)),
    ("run_config", ("seis.run_config",)),   # RunConfig.preflight checks the agent, model and engine it names
    ("postval", ("seis.postval",)),
    ("agents", ("seis.agents",)),
    ("evaluator", ("seis.evaluator",)),
    ("engine_host", ("seis.engine_host",)),
    ("store", ("seis.store",)),
    ("workspace", ("seis.workspace",)),
    ("sandbox", ("seis.sandbox",)),
    ("models", ("seis.models", "seis.provenance")),   # provenance names a model's weights
    ("workloads", ("seis.workloads",)),
    ("leaves", ("seis", "seis.host", "seis.tables", "seis.prompts", "seis.engine_import", "seis.stats",
                "seis.writable", "seis.validation", "seis.files")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO_ROOT / pkg).rglob("*.py"))}


def _known(name: str, modules) -> str | None:
    """The innermost of our modules that `name` is or lies in (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, is_package: bool, node: ast.stmt, modules) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for a in node.names if (t := _known(a.name, modules))]
    if node.level:  # relative: from the module's package, one level up per further dot
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module
    out = []
    for a in node.names:
        target = f"{source}.{a.name}" if f"{source}.{a.name}" in modules else _known(source, modules)
        if target:
            out.append(target)
    return out


def _statements(body):
    """Every statement, nested ones too (an import is always a statement: no need to walk expressions)."""
    for stmt in body:
        yield stmt
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(stmt, field, None) or ())


@lru_cache(maxsize=1)
def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for node in _statements(ast.parse(path.read_text(), filename=str(path)).body):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, path.name == "__init__.py", node, modules):
                    if target != module:
                        edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def _reachable(graph, start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _cycle_through(graph, start: str, within: set[str]) -> list[str]:
    """A shortest import circle from `start` back to it, inside `within`."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt not in within:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return [start]


def _covers(entry: str, module: str) -> bool:
    """An entry covers a package with everything in it, or a module; the root `seis` is its __init__ alone."""
    return module == entry or (entry != "seis" and module.startswith(entry + "."))


def _layer_of(module: str) -> int | None:
    """The rank in LAYERS (0: top) of the layer whose longest entry covers the module; None: in no layer."""
    matches = [(len(entry), rank) for rank, (_, entries) in enumerate(LAYERS) for entry in entries
               if _covers(entry, module)]
    return max(matches)[1] if matches else None


def test_the_graph_is_read():
    graph = _graph()
    assert {"seis.cli", "flows.seis_flow", "tasks.gpu", "seis.session.steps"} <= set(graph)
    assert "seis.run_config" in graph["seis.session.steps"]      # from ..run_config import ...
    assert "seis.session.display" in graph["tasks.artifacts"]    # from seis.session.display import ...
    assert "tasks.slot_wait" in graph["tasks.gpu"]               # lazy, inside a function


def test_no_import_circles():
    graph = _graph()
    reach = {m: _reachable(graph, m) for m in graph}
    circles, done = [], set()
    for module in sorted(graph):
        if module in done:
            continue
        component = {other for other in reach[module] if module in reach[other]}
        done |= component
        if len(component) > 1:
            circle = " -> ".join(_cycle_through(graph, module, component))
            circles.append(f"{len(component)} modules import each other: {', '.join(sorted(component))}; "
                           f"e.g. {circle}")
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _graph() if _layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS (place them): {', '.join(unplaced)}"


def test_imports_go_down_the_layers():
    graph, modules = _graph(), _modules()
    upward = []
    for module, edges in sorted(graph.items()):
        mine = _layer_of(module)
        for target, line in sorted(edges.items()):
            theirs = _layer_of(target)
            if mine is not None and theirs is not None and theirs < mine:
                where = modules[module].relative_to(REPO_ROOT)
                upward.append(f"{where}:{line}: {module} ({LAYERS[mine][0]}) imports {target} "
                              f"({LAYERS[theirs][0]}, a higher layer)")
    assert not upward, "imports up the layers (top to bottom: " + " / ".join(n for n, _ in LAYERS) + "):\n" + \
        "\n".join(upward)
