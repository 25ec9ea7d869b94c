"""Benchmarks run as their own processes (python -m seis.benchmarks.NAME)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def engine_failures_shown() -> Iterator[None]:
    """An engine's failure ends the benchmark with its message made printable (seis.tables.printable): the message
    quotes the engine, its error and its stderr's tail, and an engine tree (--engine, --snapshot) may be an agent's,
    whose escape sequences would otherwise reach the operator's terminal in the traceback."""
    from ..engine_host import EngineError
    from ..tables import printable

    try:
        yield
    except EngineError as e:
        raise SystemExit(f"an engine failed: {printable(str(e))}") from None


def token_outputs(engine, reply: object, max_new_tokens: int) -> list[list[int]]:
    """The token ids of each output of a SEIS engine's generate reply, each a list of at most max_new_tokens ints,
    or the engine's error (EngineError): a benchmark counts them as tokens, so a string of the right length, an id
    past the limit (the engine client keeps one) or anything else an engine tree may reply never counts."""
    from ..engine_host import EngineError

    outs = [o.get("token_ids") if isinstance(o, dict) else None for o in reply] if isinstance(reply, list) \
        else [reply]
    for o in outs:
        if not isinstance(o, list) or len(o) > max_new_tokens or not all(type(t) is int for t in o):
            raise EngineError(f"{engine.engine_dir}: a generate reply whose outputs are not lists of at most "
                              f"{max_new_tokens} token ids: {str(o)[:100]}")
    return outs


def json_out(path: Path | None) -> Path | None:
    """A benchmark's --json, checked before anything runs: the file is written once the run has ended, and a path
    that cannot take it (its folder missing, a directory, no write permission) would lose a run of many minutes to
    a traceback at its very end."""
    if path is None:
        return None
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise SystemExit(f"--json {path}: a directory; name a file")
    if not folder.is_dir():
        raise SystemExit(f"--json {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SystemExit(f"--json {path}: not writable")
    return path


def labelled_dirs(values: list[str]) -> dict[str, Path]:
    """label -> engine tree of each --engine LABEL=DIR. A label names one row of the table and one key of the JSON,
    so a label given twice is refused: the second tree would silently take the first one's place."""
    out: dict[str, Path] = {}
    for v in values:
        label, sep, path = v.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--engine wants LABEL=DIR, not {v!r}")
        if label in out:
            raise SystemExit(f"--engine {label}: given twice ({out[label]} and {path}); give each engine a label "
                             f"of its own")
        out[label] = Path(path)
    return out


def copied_engine(label: str, path: Path, dest: Path) -> Path:
    """A copy of --engine LABEL=DIR's tree at dest, taken before anything runs: a benchmark measures (and names by
    its hash) this copy, however the directory changes meanwhile. A link or special file in it is one error line."""
    from ..tables import printable
    from ..workspace.tree import TreeError, copy_tree
    try:
        copy_tree(path, dest)
    except (TreeError, OSError) as e:
        raise SystemExit(f"--engine {label}={path}: {printable(str(e))}") from None
    return dest
