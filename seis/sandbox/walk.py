"""One way to walk a tree that a sandbox wrote: iteratively (a chain thousands of directories deep is no
RecursionError), never following or entering a link, with an optional depth cap. The host readers that only look
(the secret scan, an agent's search and list tools, the write watch) share it; the walks that change owners, modes
or copy go through descriptors all the way down instead (seis.workspace.tree, seis.agents.llm.confine, and the bind
walk in seis.sandbox.process).

The write watch walks while the sandbox still runs, so a directory can be swapped for a link, or an ancestor for a
link to a host directory holding the same names, between its listing and its entry. Each directory is therefore
opened without following a link and entered only if the descriptor is the directory its parent listed (same device
and inode); one that changed is reported Unreadable (ENOTDIR: a link now; ESTALE: another directory) and never
listed. Entries are listed and stat'ed through that descriptor. A tree changed under a walk can still hide parts
of itself from it; the watch's free-space floors (seis.sandbox.write_watch) bound what it can hide."""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .policy import MAX_DEPTH


@dataclass(frozen=True)
class Entry:
    """An entry of the tree: `depth` 1 for the root's children. A directory comes before what it holds.
    `dir_entry` was listed through its directory's descriptor, which stays open only until the walk moves on:
    call its methods (is_dir, stat, ...) before the next entry, and use `path`, never dir_entry.path (a bare name)."""
    dir_entry: os.DirEntry
    depth: int
    path: Path


@dataclass(frozen=True)
class TooDeep:
    """A directory at the depth cap: listed, not entered."""
    path: Path


@dataclass(frozen=True)
class Unreadable:
    """A directory that could not be listed (gone, no permission, a name too long to open), or that was no longer
    the directory its parent listed when the walk came to enter it (ENOTDIR: a link now; ESTALE: another directory)."""
    path: Path
    error: OSError


def walk(root: str | os.PathLike, *, max_depth: int | None = MAX_DEPTH, ordered: bool = True,
         enter: Callable[[os.DirEntry], bool] | None = None) -> Iterator[Entry | TooDeep | Unreadable]:
    """Every entry under `root`, directory by directory. `ordered`: each directory's entries by name, and
    directories depth first in that order (deterministic output); otherwise as listed, which is cheaper.
    A directory at depth `max_depth` (None: no cap) is yielded as TooDeep and not entered; `enter` may keep
    others out (caches). The caller may stop at any point, for instance after a number of entries."""
    root = os.fspath(root)
    try:
        st = os.stat(root, follow_symlinks=False)
    except OSError as e:
        yield Unreadable(Path(root), e)
        return
    stack: list[tuple[str, int, tuple[int, int]]] = [(root, 0, (st.st_dev, st.st_ino))]
    while stack:
        directory, depth, identity = stack.pop()
        try:
            fd = _open_listed_dir(directory, identity)
        except OSError as e:
            yield Unreadable(Path(directory), e)
            continue
        subdirs = []
        try:
            with os.scandir(fd) as it:
                # Sorting holds one directory's listing; unordered walks stream it (a watch meets huge ones).
                for entry in sorted(it, key=lambda e: e.name) if ordered else it:
                    path = os.path.join(directory, entry.name)
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir and max_depth is not None and depth + 1 >= max_depth:
                        yield TooDeep(Path(path))
                        continue
                    yield Entry(entry, depth + 1, Path(path))
                    if is_dir and (enter is None or enter(entry)):
                        try:  # through the listing's descriptor: the identity the child must still have
                            child = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue  # gone already
                        subdirs.append((path, depth + 1, (child.st_dev, child.st_ino)))
        except OSError as e:
            yield Unreadable(Path(directory), e)
        finally:
            os.close(fd)
        stack.extend(reversed(subdirs))  # popped in listing order


def dir_ids(dirs: Iterable[str | os.PathLike]) -> set[tuple[int, int]]:
    """(device, inode) of each of these that is a directory now (not a link to one): how a walk knows them again
    wherever it meets them, whatever the names around them."""
    ids = set()
    for d in dirs:
        try:
            st = os.stat(d, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            ids.add((st.st_dev, st.st_ino))
    return ids


def skipping(dirs: Iterable[str | os.PathLike]) -> Callable[[os.DirEntry], bool] | None:
    """A walk's `enter` that keeps out of these directories (as they are now: dir_ids), or None (none of them
    is one). What the harness laid out in a workspace and its agent cannot write is left out so."""
    ids = dir_ids(dirs)

    def enter(entry: os.DirEntry) -> bool:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) not in ids
    return enter if ids else None


def _open_listed_dir(path: str, identity: tuple[int, int]) -> int:
    """A descriptor of the directory at path, if it is still the one listed as (device, inode): its last
    component is never followed (ENOTDIR), and one reached through an ancestor swapped since is another inode."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != identity:
        os.close(fd)
        raise OSError(errno.ESTALE, "no longer the directory that was listed", path)
    return fd
