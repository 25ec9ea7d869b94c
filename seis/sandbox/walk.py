"""One way to walk, by path, a tree that a sandbox wrote: iteratively (a chain thousands of directories deep is
no RecursionError), never following or entering a link, with an optional depth cap. The host readers that only
look (the secret scan, an agent's search and list tools, the write watch) share it; the walks that change owners,
modes or copy go through descriptors instead (seis.workspace.tree, seis.agents.llm.confine, and the bind walk in
seis.sandbox.process).

Only the write watch walks while the sandbox still runs. A path walk can then be turned by a directory swapped
for a link between its listing and its entry; the watch only stats and counts, so such a turn costs at most a
bounded walk (its entry limit) and kills the sandbox that tried it. A tree changed under a walk can also hide
parts of itself from it; the watch's free-space floors (seis.sandbox.write_watch) bound what it can hide."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .policy import MAX_DEPTH


@dataclass(frozen=True)
class Entry:
    """An entry of the tree: `depth` 1 for the root's children. A directory comes before what it holds."""
    dir_entry: os.DirEntry
    depth: int

    @property
    def path(self) -> Path:
        return Path(self.dir_entry.path)


@dataclass(frozen=True)
class TooDeep:
    """A directory at the depth cap: listed, not entered."""
    path: Path


@dataclass(frozen=True)
class Unreadable:
    """A directory that could not be listed (gone, no permission, a name too long to open)."""
    path: Path
    error: OSError


def walk(root: str | os.PathLike, *, max_depth: int | None = MAX_DEPTH, ordered: bool = True,
         enter: Callable[[os.DirEntry], bool] | None = None) -> Iterator[Entry | TooDeep | Unreadable]:
    """Every entry under `root`, directory by directory. `ordered`: each directory's entries by name, and
    directories depth first in that order (deterministic output); otherwise as listed, which is cheaper.
    A directory at depth `max_depth` (None: no cap) is yielded as TooDeep and not entered; `enter` may keep
    others out (caches). The caller may stop at any point, for instance after a number of entries."""
    stack: list[tuple[str, int]] = [(os.fspath(root), 0)]
    while stack:
        directory, depth = stack.pop()
        subdirs = []
        try:
            with os.scandir(directory) as it:
                # Sorting holds one directory's listing; unordered walks stream it (a watch meets huge ones).
                for entry in sorted(it, key=lambda e: e.name) if ordered else it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir and max_depth is not None and depth + 1 >= max_depth:
                        yield TooDeep(Path(entry.path))
                        continue
                    yield Entry(entry, depth + 1)
                    if is_dir and (enter is None or enter(entry)):
                        subdirs.append(entry.path)
        except OSError as e:
            yield Unreadable(Path(directory), e)
        stack.extend((d, depth + 1) for d in reversed(subdirs))  # popped in listing order
