"""An engine tree's files: which count, their hash, and copying them.

"The engine tree" is every regular file under a directory except caches (__pycache__, *.pyc, .git,
.pytest_cache) and, at the top level only, the session material SEIS puts beside the engine (reports/, peers/).
`tree_hash` is the one tree hash of SEIS (POSIX path, NUL, sha256 of the bytes, in sorted path order): the
workspace, the snapshot store and the evaluator (`seis.evaluator.snapshot.tree_sha256`) all call it, so a
snapshot id and the gate's hash of the same tree agree.

An engine tree may have been written by an agent, so the host reads it as hostile input: every directory and
file is opened relative to its parent's descriptor with O_NOFOLLOW, and what was opened is checked through its
descriptor (fstat), never by path. A symlink, FIFO, socket or device anywhere in the tree is an error, never
followed, and swapping a directory for a link while a walk is under way cannot lead it out of the tree.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..sandbox.policy import MAX_DEPTH, MAX_PATH_BYTES  # a deeper tree, or a longer path, is a TreeError

IGNORED_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
SESSION_DIRS = frozenset({"reports", "peers"})  # top level only: session material, not engine code
# Version-control and DVC files (and any `*.dvc`): stored inside a DVC repository they would steer DVC and git
# there, so no engine tree may hold one. (.git is never part of a tree: it is ignored, never copied or hashed.)
# Nor a repository of any kind, whose configuration names commands that its tool runs (git's core.fsmonitor,
# Mercurial's hooks) as whoever runs it there, root included: other tools' metadata directories, and HEAD,
# without which git takes no directory for a bare repository. Sapling (`sl`, Mercurial's descendant: `.sl/config`
# holds hooks as `.hg/hgrc` does) and Pijul keep theirs in `.sl` and `.pijul`.
CONTROL_NAMES = frozenset({".dvc", ".dvcignore", "dvc.yaml", "dvc.lock", ".gitignore", ".gitattributes",
                           ".gitmodules", "HEAD", ".hg", ".sl", ".pijul", ".jj", ".svn", ".bzr", "_darcs",
                           ".fslckout", "_FOSSIL_"})

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in place of a file must not block the host
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class TreeError(ValueError):
    """The directory cannot be treated as an engine tree (missing, a link, a special file, over a limit)."""


def _ignored(name: str) -> bool:
    return name in IGNORED_DIRS or name.endswith(IGNORED_SUFFIXES)


def is_control_file(name: str) -> bool:
    return name in CONTROL_NAMES or name.endswith(".dvc")


def bad_name(name: str) -> str | None:
    """Why `name` cannot be an engine-tree name, or None: one that is not UTF-8, or that holds a control or format
    character (newlines, escapes, bidi overrides, zero-width characters). The cleanup removes such names from a
    workspace, and every walk below refuses them: the tree hash is defined over UTF-8 paths (a name that is not
    UTF-8 raised UnicodeEncodeError, which no caller takes for a tree's refusal, out of the hash, the store and the
    gate), and a name holding a newline rewrites the lines of a diff or a report that quotes it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a file name that is not UTF-8"
    if not name.isprintable():  # C0/C1 controls, DEL, and the format characters: bidi overrides, zero-width ones
        return "a file name with control characters (bidi overrides and other format characters included)"
    return None


def path_too_long(rel: str) -> bool:
    """Past MAX_PATH_BYTES (as the kernel counts a path: UTF-8, undecodable bytes as they were)."""
    return len(rel.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES


def safe_mode(mode: int, is_dir: bool) -> int:
    """The only modes the host gives to what an agent wrote: 0755 for directories and executables, 0644 for the
    rest. Never setuid, setgid, sticky, or writable by others, whatever the tree asked for."""
    return 0o755 if is_dir or mode & 0o111 else 0o644


def _open_root(root: Path) -> int:
    try:
        return os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        raise TreeError(f"{root} is not a directory") from None
    except OSError as e:
        raise TreeError(f"{root} cannot be opened as a directory ({e.strerror})") from None


def _kind(dir_fd: int, name: str, rel: str) -> str:
    """"dir" or "file" for an entry seen under dir_fd; a link or special file is a TreeError."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as e:
        raise TreeError(f"{rel} cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise TreeError(f"{rel} is a symlink; an engine tree holds plain files only")
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise TreeError(f"{rel} is not a regular file (FIFO, socket or device)")


def _open_entry(dir_fd: int, name: str, rel: str, kind: str) -> tuple[int, os.stat_result]:
    """(fd, its stat) of `name` under dir_fd, which must still be of `kind`: whatever replaced it since it was
    listed (a link, a FIFO) is refused here, through the descriptor, not followed."""
    try:
        fd = os.open(name, _DIR_FLAGS if kind == "dir" else _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TreeError(f"{rel} changed into a symlink or another kind of file while it was read") from None
        raise TreeError(f"{rel} cannot be opened ({e.strerror})") from None
    st = os.fstat(fd)
    if not (stat.S_ISDIR(st.st_mode) if kind == "dir" else stat.S_ISREG(st.st_mode)):
        os.close(fd)
        raise TreeError(f"{rel} is not a regular file (FIFO, socket or device)")
    return fd, st


def _walk(dir_fd: int, prefix: str = "") -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, open fd, stat) of every engine-tree file under dir_fd, in sorted path order. Each fd is
    open until the next item; only the directories on the current path are held open."""
    if prefix.count("/") >= MAX_DEPTH:
        raise TreeError(f"{prefix.rstrip('/')} is more than {MAX_DEPTH} directories deep")
    entries = []
    for name in os.listdir(dir_fd):
        if _ignored(name) or (not prefix and name in SESSION_DIRS):
            continue
        if path_too_long(prefix + name):
            raise TreeError(f"{(prefix + name)[:80]}... is a path longer than {MAX_PATH_BYTES} bytes")
        if why := bad_name(name):
            raise TreeError(f"{ascii(prefix + name)[:200]} is {why}")
        kind = _kind(dir_fd, name, prefix + name)
        # sort key: a directory's files are "name/..." among this level's files, as in a sort of full paths
        entries.append((name + "/" if kind == "dir" else name, name, kind))
    for _, name, kind in sorted(entries):
        rel = prefix + name
        fd, st = _open_entry(dir_fd, name, rel, kind)
        try:
            if kind == "dir":
                yield from _walk(fd, rel + "/")
            else:
                yield rel, fd, st
        finally:
            os.close(fd)


@contextmanager
def _files_of(root: str | Path) -> Iterator[Iterator[tuple[str, int, os.stat_result]]]:
    root_fd = _open_root(Path(root))
    try:
        yield _walk(root_fd)
    finally:
        os.close(root_fd)


def _read_chunks(fd: int) -> Iterator[bytes]:
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, _CHUNK):
        yield chunk


def tree_files(root: str | Path) -> list[str]:
    """Relative POSIX paths of the tree's files, sorted. A symlink or special file anywhere is a TreeError."""
    with _files_of(root) as files:
        return [rel for rel, _, _ in files]


def read_tree_file(root: str | Path, rel: str) -> bytes:
    """The bytes of one engine-tree file, reached component by component without following a link."""
    parts = Path(rel).parts
    if not parts or any(p in ("", ".", "..") or bad_name(p) for p in parts) or Path(rel).is_absolute():
        raise TreeError(f"{ascii(rel)[:200]} is not a path inside the tree")
    fd = _open_root(Path(root))
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            child, _ = _open_entry(fd, part, "/".join(parts[:i + 1]), "file" if last else "dir")
            os.close(fd)
            fd = child
        return b"".join(_read_chunks(fd))
    finally:
        os.close(fd)


class NotRegularFile(OSError):
    """What open_regular found at a path is a directory, FIFO, socket or device."""

    def __init__(self, path, mode: int):
        super().__init__(errno.EINVAL, f"{os.fspath(path)} is not a regular file")
        self.mode = mode


def open_regular(path: str | Path, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of the regular file at path, for host code reading or writing what sandboxed code
    wrote: its last component is never followed if it is a link (ELOOP), a FIFO is never waited on, and what the
    descriptor turns out to be decides (NotRegularFile), not what a look at the path said before."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(path, st.st_mode)
    return fd, st


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_hash(root: str | Path) -> str:
    """sha256 over the sorted relative paths and file bytes of the engine tree (hex)."""
    h = hashlib.sha256()
    with _files_of(root) as files:
        for rel, fd, _ in files:
            fh = hashlib.sha256()
            for chunk in _read_chunks(fd):
                fh.update(chunk)
            h.update(rel.encode("utf-8") + b"\0")
            h.update(fh.digest())
    return h.hexdigest()


def copy_tree(src: str | Path, dest: str | Path, max_file_bytes: float = float("inf"),
              max_total_bytes: float = float("inf")) -> list[str]:
    """Copy the engine tree of src into dest (created; must not hold files); returns the copied paths.

    Reads only through descriptors opened without following links (see the module doc), so a tree that changes
    while it is copied can make the copy fail or differ, but never reach a file outside the tree. Modes are
    reduced to safe_mode: a copy made as root is never setuid or writable by others, its directories included
    (made at most 0755 whatever the process's umask: under umask 0 they were 0777, so any local user could
    rewrite a judged tree or a stored snapshot)."""
    src, dest = Path(src), Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise TreeError(f"{dest} already exists and is not empty")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir(mode=0o755, exist_ok=True)
    copied, total = [], 0
    with _files_of(src) as files:
        for rel, fd, st in files:
            target = dest / rel
            _make_dirs(dest, target.parent.relative_to(dest).parts)
            size = 0
            with open(target, "xb") as out:
                for chunk in _read_chunks(fd):
                    size += len(chunk)
                    total += len(chunk)
                    if size > max_file_bytes:
                        raise TreeError(f"{rel} is larger than {max_file_bytes / 2**20:.0f} MiB")
                    if total > max_total_bytes:
                        raise TreeError(f"{src} is larger than {max_total_bytes / 2**20:.0f} MiB")
                    out.write(chunk)
            os.chmod(target, safe_mode(st.st_mode, is_dir=False))
            copied.append(rel)
    return copied


def _make_dirs(dest: Path, parts: tuple[str, ...]) -> None:
    """dest/parts..., each missing directory made with mode 0755 (less under a stricter umask, never more; a
    Path.mkdir with parents=True makes the parents with the umask's mode alone)."""
    d = dest
    for part in parts:
        d = d / part
        try:
            d.mkdir(mode=0o755)
        except FileExistsError:
            pass


def remove_tree(path: str | Path) -> None:
    """Delete path and everything under it, as hostile input: without following a link, without recursion and
    with at most two descriptors open, however deep the tree. Each directory's entries are moved up into path's
    own directory before it is removed, so the tree flattens as it goes. Missing path: nothing to do.

    In a run as an ordinary user, a directory the sandbox left without its owner's permissions (0000, 0311, 0500:
    it can be neither listed nor moved to another parent) gets them back first (owner_access), never by name."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    owner_access(None, str(path))
    root = os.open(path, _DIR_FLAGS)
    moved = 0
    try:
        while names := os.listdir(root):
            for name in names:
                if not stat.S_ISDIR(os.stat(name, dir_fd=root, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=root)
                    continue
                try:
                    os.rmdir(name, dir_fd=root)
                    continue
                except OSError as e:
                    if e.errno != errno.ENOTEMPTY:
                        raise
                owner_access(root, name)
                child = os.open(name, _DIR_FLAGS, dir_fd=root)
                try:
                    for inner in os.listdir(child):
                        while True:  # a fresh name at the top; the tree may hold any name already
                            moved += 1
                            if not _exists(root, f".seis-rm-{moved}"):
                                break
                        owner_access(child, inner)  # a directory moves to another parent only if writable
                        os.rename(inner, f".seis-rm-{moved}", src_dir_fd=child, dst_dir_fd=root)
                finally:
                    os.close(child)
                os.rmdir(name, dir_fd=root)
    finally:
        os.close(root)
    os.rmdir(path)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory that sandboxed code may write into, removed with remove_tree: whatever it left there
    (links, 0500 directories, a chain thousands deep) neither stops the removal nor turns it against host files."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)


def owner_access(dir_fd: int | None, name: str) -> None:
    """In a run as an ordinary user, give the directory `name` (under dir_fd) its owner's read, write and search
    permissions back if it lacks any. Its sandboxes write as that same user, so what they leave is the host's own,
    but only through the modes they left: a directory at 0311 or 0000 cannot be listed or entered, one at 0500 not
    moved to another parent (that rewrites its '..'), and root's override of modes hid this. The change goes through
    an O_PATH descriptor of the entry itself, opened without following a link, and that descriptor's /proc link:
    never through a name a link could stand in for. Nothing for root, for a link or a file, or for a directory this
    user does not own (the chmod fails, and the caller's own step says what it could not do)."""
    if os.geteuid() == 0:
        return  # root lists, enters and moves whatever the modes say
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return  # gone, a link, or not a directory
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(f"/proc/self/fd/{fd}", mode | 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
