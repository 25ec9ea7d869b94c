"""Content-addressed snapshots of retained engines.

    <root>/<id>/        the engine tree, byte for byte (id = the first `id_len` hex digits of its tree hash)
    <root>/<id>.json    manifest: full tree hash, files (path, sha256, size, mode), meta, whether DVC tracks it
    <root>/<id>.dvc     when <root> lies in a DVC repository: `dvc add` of <id>/ (contents in the DVC cache)

Identical trees get the same id and are stored once. The manifest is written last, so its presence means the
snapshot is complete; a put that fails leaves no part of the snapshot behind (no directory, .dvc file or
.gitignore entry). Without a DVC repository (or with use_dvc=False) the store is a plain directory store.

A tree holding DVC or git control files (seis.workspace.tree.CONTROL_NAMES, *.dvc) is refused: stored inside the
DVC repository they would steer DVC and git there (a `.dvcignore` of `*` makes `dvc add` track an empty directory; a `dvc.yaml`
defines pipeline stages; a `.gitignore` can un-ignore the snapshot for git). A snapshot ref from another store
or a worker is data, checked like a tree, and so is a manifest on disk (a clone's git pull brings them): its id is
its tree hash's prefix, its paths stay inside the snapshot, its modes are restored through safe_mode, and its .dvc
file names the snapshot's directory as its only output (`manifest_problem`, `dvc_file_problem`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..files import write_atomic
from ..sandbox.walk import Entry, walk
from ..workspace.tree import (
    IGNORED_DIRS,
    TreeError,
    copy_tree,
    file_sha256,
    is_control_file,
    remove_tree,
    safe_mode,
    tree_hash,
)
from .dvc import DvcError, DvcRepo, open_repo
from .lock import FileLock, LockTimeout

class StoreError(RuntimeError):
    pass


class TreeRefused(StoreError):
    """The tree itself cannot be stored: its author's doing, not the store's. `detail` says why in the tree's own
    terms (paths inside it only), the part a session's report may quote to the agent that wrote the tree; the
    message names the host directory too, for the operator."""

    def __init__(self, engine_dir: Path, detail: str):
        super().__init__(f"{engine_dir}: {detail}")
        self.detail = detail


class UnknownSnapshotError(LookupError):
    pass


def control_files(root: str | Path) -> list[str]:
    """Relative paths of the DVC or git control files or directories (`is_control_file`) anywhere under root,
    links included (not followed). A control directory is named, not searched; ignored ones (.git, caches) are
    never copied into the store, so they do not count. Past MAX_DEPTH nothing is looked at: tree_hash refuses
    such a tree anyway."""
    root = Path(root)

    def ignored_dir(entry: os.DirEntry) -> bool:
        return entry.name in IGNORED_DIRS and entry.is_dir(follow_symlinks=False)

    found = [item.path.relative_to(root).as_posix()
             for item in walk(root, enter=lambda e: not is_control_file(e.name) and not ignored_dir(e))
             if isinstance(item, Entry) and is_control_file(item.path.name) and not ignored_dir(item.dir_entry)]
    return sorted(found)


_TREE_HASH = re.compile(r"^[0-9a-f]{64}$")


def manifest_problem(manifest: object, sid: str) -> str | None:
    """Why a manifest (one another store or a worker sent, or one on disk, which a clone's git pull or anyone with
    the store's folder may have changed) cannot be trusted to restore snapshot `sid` from, or None. Its id must be
    sid and its tree hash must begin with it: the id is the tree's address, so a manifest rewritten to fit other
    files, or to name another directory, is refused. Its paths are read and written relative to the snapshot and
    the destination: each must stay inside them and name no control file; its modes are octal numbers (restored
    through safe_mode), its sizes counts."""
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    tree = manifest.get("tree_hash")
    if manifest.get("id") != sid or not isinstance(tree, str) or not _TREE_HASH.match(tree) or \
            not tree.startswith(sid):
        return f"its id must be {sid} and its tree hash must begin with it"
    if not isinstance(manifest.get("created"), str) or not isinstance(manifest.get("dvc"), bool) or \
            not isinstance(manifest.get("meta", {}), dict):
        return "its created, dvc or meta field is missing or not of its type"
    files = manifest.get("files")
    if not isinstance(files, list):
        return "it has no list of files"
    for f in files:
        path = f.get("path") if isinstance(f, dict) else None
        if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
            return f"a file entry without a relative path ({path!r})"
        parts = path.split("/")
        if any(part in ("", ".", "..") or is_control_file(part) or part in IGNORED_DIRS for part in parts):
            return f"the file path {path!r} leaves the tree or names a control file"
        try:
            int(str(f.get("mode")), 8)
        except ValueError:
            return f"the file {path!r} has no octal mode"
        if type(f.get("size")) is not int or f["size"] < 0:
            return f"the file {path!r} has no size"
    return None


def dvc_file_problem(text: str, sid: str) -> str | None:
    """Why a snapshot's .dvc file (from another store) cannot be written into this store's DVC repository, or None:
    it may name one output only, the snapshot's own directory, and nothing else for DVC to act on."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return f"its .dvc file is not YAML ({e})"
    outs = data.get("outs") if isinstance(data, dict) else None
    if not isinstance(outs, list) or set(data) != {"outs"}:
        return "its .dvc file must hold `outs` alone"
    if [o.get("path") if isinstance(o, dict) else None for o in outs] != [sid]:
        return f"its .dvc file must name the directory {sid} as its only output"
    return None


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    tree_hash: str
    path: Path              # the stored tree (read it, never write it)
    files: int
    bytes: int
    created: str
    dvc: bool
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotRef:
    """What another store needs to restore a snapshot from the shared DVC remote: its manifest and its .dvc file
    (small metadata that travels as data; the engine's bytes travel only through the remote)."""
    id: str
    manifest: dict
    dvc_file: str | None = None

    def to_dict(self) -> dict:
        return {"id": self.id, "manifest": self.manifest, "dvc_file": self.dvc_file}

    @classmethod
    def from_dict(cls, d: dict) -> "SnapshotRef":
        return cls(d["id"], d["manifest"], d.get("dvc_file"))


class SnapshotStore:
    def __init__(self, root: str | Path, use_dvc: bool | None = None, id_len: int = 16,
                 lock_timeout_s: float = 600.0):
        """use_dvc: None = track with DVC when root lies in a DVC repository; True = require it; False = never."""
        if not 8 <= id_len <= 64:
            raise ValueError("id_len must be between 8 and 64")
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._refuse_links()
        ignore = self.root / ".gitignore"  # the store's own scratch files (DVC appends its entries here too)
        if not ignore.exists():
            ignore.write_text("/.lock\n/.tmp-*\n/.*.part\n", encoding="utf-8")
        self.id_len, self.lock_timeout_s = id_len, lock_timeout_s
        self._id = re.compile(rf"^[0-9a-f]{{{id_len}}}$")
        self.dvc: DvcRepo | None = open_repo(self.root, lock_timeout_s) if use_dvc is not False else None
        if use_dvc is True and self.dvc is None:
            raise StoreError(f"use_dvc=True but {self.root} is not inside a DVC repository (run `dvc init`) "
                             f"or DVC is not installed")

    # ---- paths -----------------------------------------------------------------------------------------------
    def _manifest(self, sid: str) -> Path:
        return self.root / f"{sid}.json"

    def _check_id(self, sid: str) -> str:
        if not isinstance(sid, str) or not self._id.match(sid) or not self._manifest(sid).is_file():
            known = len(list(self.root.glob("*.json")))
            raise UnknownSnapshotError(f"no snapshot {sid!r} in {self.root} ({known} stored; see `list()`)")
        return sid

    def _refuse_links(self) -> None:
        """The store writes, truncates (its lock) and removes its own files by name, so a link among them (a clone's
        commit can hold one: `.lock`, `.gitignore`, `<id>.json`, `<id>.dvc`) would carry those writes to a host
        file; DVC appends to `.gitignore` by name too. A store holding one is refused until it is removed."""
        with os.scandir(self.root) as entries:
            links = sorted(e.name for e in entries if e.is_symlink())
        if links:
            shown = ", ".join(repr(n) for n in links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else "")
            raise StoreError(f"the store {self.root} holds symbolic links where it keeps its own files ({shown}); "
                             f"a store holds none: remove them")

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """The store's lock; held past lock_timeout_s by another process (stuck in a push, stopped), it is a
        StoreError as every other refusal of the store, which callers catch, not the lock's own TimeoutError."""
        self._refuse_links()
        lock = FileLock(self.root / ".lock", self.lock_timeout_s)
        try:
            lock.__enter__()
        except LockTimeout:
            raise StoreError(f"the store {self.root} is locked by another process (storing or restoring a "
                             f"snapshot) for more than {self.lock_timeout_s:g} s") from None
        try:
            yield
        finally:
            lock.__exit__(None, None, None)

    # ---- API -------------------------------------------------------------------------------------------------
    def put(self, engine_dir: str | Path, meta: dict | None = None) -> str:
        """Store the engine tree of engine_dir (idempotent); returns its snapshot id. StoreError when it cannot be
        stored (control files in it, not an engine tree, DVC failing); nothing of it is then left in the store."""
        engine_dir = Path(engine_dir)
        control = control_files(engine_dir)
        if control:
            more = f" and {len(control) - 5} more" if len(control) > 5 else ""
            raise TreeRefused(engine_dir, f"the tree holds DVC or git control files, which no snapshot may hold: "
                                          f"{', '.join(control[:5])}{more}")
        try:
            full = tree_hash(engine_dir)
        except TreeError as e:
            raise TreeRefused(engine_dir, f"the tree cannot be stored as an engine tree: {e}") from None
        sid = full[: self.id_len]
        with self._lock():
            if self._manifest(sid).is_file():
                info = self._load(sid)
                if info.tree_hash != full:
                    raise StoreError(f"id collision: {sid} already names tree {info.tree_hash}; raise id_len")
                self._ensure_present(info)
                return sid
            target = self.root / sid
            self._discard(sid)  # what an interrupted put left (no manifest): start over
            tmp = self.root / f".tmp-{sid}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                files = copy_tree(engine_dir, tmp)
                changed = tree_hash(tmp) != full
            except (TreeError, OSError) as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise StoreError(f"{engine_dir} could not be copied into the store: {e}") from None
            if changed:
                shutil.rmtree(tmp)
                raise TreeRefused(engine_dir, "the tree changed while it was being stored; store it again")
            os.rename(tmp, target)
            try:
                entries = [{"path": rel, "sha256": file_sha256(target / rel), "size": (target / rel).stat().st_size,
                            "mode": oct((target / rel).stat().st_mode & 0o777)} for rel in files]
                tracked = self._track(sid)
                manifest = {
                    "id": sid, "tree_hash": full, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "dvc": tracked, "dvc_file": f"{sid}.dvc" if tracked else None,
                    "source": str(engine_dir.resolve()), "files": entries, "meta": meta or {},
                }
                write_atomic(self._manifest(sid), json.dumps(manifest, indent=1) + "\n")
            except BaseException:
                self._discard(sid)  # a snapshot is whole or absent: nothing half-stored stays to mislead a later put
                raise
        return sid

    def get(self, snapshot_id: str, dest: str | Path) -> Path:
        """Restore the snapshot's files into dest (new or empty), byte-identical; returns dest."""
        info = self.info(snapshot_id)
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise StoreError(f"{dest} already exists and is not empty")
        with self._lock():  # another process's restore of it may be under way: never copy half of it
            self._ensure_present(info)
        manifest = self._read_manifest(info.id)
        made = not dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        try:
            try:
                self._copy_checked(info, manifest, dest)
            except StoreError:
                if not (info.dvc and self.dvc is not None):
                    raise
                # The store's copy went bad (a checkout killed midway, an edit) while DVC keeps the retained
                # tree: restore it from there once, else no later get could ever succeed.
                for p in list(dest.iterdir()):
                    remove_tree(p)
                with self._lock():
                    remove_tree(info.path)
                    self._ensure_present(info)
                self._copy_checked(info, manifest, dest)
        except BaseException:  # no half-restored or altered tree left where a caller could still run it
            for p in [dest] if made else list(dest.iterdir()):
                remove_tree(p)
            raise
        return dest

    def _copy_checked(self, info: SnapshotInfo, manifest: dict, dest: Path) -> None:
        try:  # as every copy of a tree: through descriptors, a link, FIFO or device refused, never followed
            copied = copy_tree(info.path, dest)
        except TreeError as e:
            raise StoreError(f"snapshot {info.id} cannot be restored from {info.path}: {e}") from None
        if sorted(copied) != sorted(f["path"] for f in manifest["files"]) or tree_hash(dest) != info.tree_hash:
            raise StoreError(f"restored snapshot {info.id} in {dest} does not match its manifest (store "
                             f"corrupted?)")
        for f in manifest["files"]:  # DVC keeps no mode: the manifest's, made safe
            os.chmod(dest / f["path"], safe_mode(int(str(f["mode"]), 8), is_dir=False))

    def export_ref(self, snapshot_id: str) -> SnapshotRef:
        """The snapshot's metadata for another store (its files must be in the DVC remote for that store to
        restore them: `put` pushes them there)."""
        info = self.info(snapshot_id)
        manifest = self._read_manifest(info.id)
        dvc_file = self.root / f"{info.id}.dvc"
        return SnapshotRef(info.id, manifest, dvc_file.read_text(encoding="utf-8") if info.dvc else None)

    def import_ref(self, ref: SnapshotRef) -> bool:
        """Record a snapshot made by another store (its files come from the DVC remote on `get`/`fetch`); returns
        whether it was new here. A ref that contradicts what is stored, or whose id is not its tree hash, is
        refused."""
        manifest = ref.manifest
        if not self._id.match(ref.id) or not isinstance(manifest, dict) or manifest.get("id") != ref.id or \
                not str(manifest.get("tree_hash", "")).startswith(ref.id):
            raise StoreError(f"snapshot ref {ref.id!r} is inconsistent (its id must be its tree hash's prefix)")
        if why := manifest_problem(manifest, ref.id) or \
                (ref.dvc_file is not None and dvc_file_problem(ref.dvc_file, ref.id)):
            raise StoreError(f"snapshot ref {ref.id!r} is refused: {why}")
        with self._lock():
            if self._manifest(ref.id).is_file():
                if self._load(ref.id).tree_hash != manifest["tree_hash"]:
                    raise StoreError(f"snapshot ref {ref.id} names another tree than the one stored here")
                return False
            if manifest.get("dvc"):
                if self.dvc is None or not ref.dvc_file:
                    raise StoreError(f"snapshot {ref.id} lives in a DVC remote but {self.root} is not in a DVC "
                                     f"repository with that remote")
                write_atomic(self.root / f"{ref.id}.dvc", ref.dvc_file)
            write_atomic(self._manifest(ref.id), json.dumps(manifest, indent=1) + "\n")
        return True

    def fetch(self, snapshot_id: str) -> str:
        """Make the snapshot's files present here; returns where they came from: "present", "cache" (this
        machine's DVC cache) or "remote" (pulled from the DVC remote). What DVC restores is hash-checked."""
        info = self.info(snapshot_id)
        with self._lock():
            return self._ensure_present(info)

    def info(self, snapshot_id: str) -> SnapshotInfo:
        return self._load(self._check_id(snapshot_id))

    def list(self) -> list[SnapshotInfo]:
        ids = [p.stem for p in self.root.glob("*.json") if self._id.match(p.stem)]
        return sorted((self._load(i) for i in ids), key=lambda s: (s.created, s.id))

    def __contains__(self, snapshot_id: object) -> bool:
        return isinstance(snapshot_id, str) and bool(self._id.match(snapshot_id)) and \
            self._manifest(snapshot_id).is_file()

    def status(self, snapshot_id: str) -> str:
        """DVC's status of the snapshot's .dvc file ('' when DVC does not track it)."""
        info = self.info(snapshot_id)
        if not info.dvc or self.dvc is None:
            return ""
        return self.dvc.status(self.root / f"{info.id}.dvc")

    # ---- internals -------------------------------------------------------------------------------------------
    def _remote(self) -> str | None:
        if not hasattr(self, "_remote_name"):
            self._remote_name = self.dvc.default_remote() if self.dvc is not None else None
        return self._remote_name

    def _track(self, sid: str) -> bool:
        """`dvc add` the snapshot's directory and push it to the default remote, if any; False without DVC."""
        if self.dvc is None:
            return False
        target, pushing = self.root / sid, False
        try:
            dvc_file = self.dvc.add(target)
            if self._remote():  # versions outlive this machine's cache: push to the default remote
                pushing = True
                self.dvc.push(dvc_file)
        except (DvcError, LockTimeout) as e:  # DVC failing, or another process holding DVC's lock too long
            # A snapshot missing from the remote would fail every host that restores it from there, so a failed
            # push is a failed put too (the caller undoes the add; the cache may keep the objects: harmless).
            hint = "" if "git-ignored" not in str(e) else (
                " (a DVC repository on git cannot track files under a git-ignored directory: put the store "
                "somewhere git does not ignore, or pass use_dvc=False)")
            what = "pushed to the DVC remote" if pushing else "tracked with DVC"
            raise StoreError(f"snapshot {sid} could not be {what}{hint}: {e}") from None
        return True

    def _discard(self, sid: str) -> None:
        """Remove every trace of an unfinished snapshot (no manifest): its directory, its .dvc file and the
        .gitignore entry `dvc add` writes for it, so that DVC and git see nothing of it."""
        shutil.rmtree(self.root / sid, ignore_errors=True)
        (self.root / f"{sid}.dvc").unlink(missing_ok=True)
        for part in self.root.glob(f".{sid}.*.part"):  # write_atomic's, of a writer killed midway
            part.unlink(missing_ok=True)
        ignore = self.root / ".gitignore"
        if ignore.is_file():
            lines = ignore.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if line.strip() != f"/{sid}"]
            if kept != lines:
                ignore.write_text("".join(kept), encoding="utf-8")

    def _read_manifest(self, sid: str) -> dict:
        """The snapshot's manifest, checked (manifest_problem) before anything is read or restored by it."""
        try:
            m = json.loads(self._manifest(sid).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise StoreError(f"snapshot {sid}'s manifest cannot be read: {e}") from None
        if why := manifest_problem(m, sid):
            raise StoreError(f"snapshot {sid}'s manifest is refused: {why}")
        return m

    def _load(self, sid: str) -> SnapshotInfo:
        m = self._read_manifest(sid)
        return SnapshotInfo(sid, m["tree_hash"], self.root / sid, len(m["files"]),
                            sum(f["size"] for f in m["files"]), m["created"], m["dvc"], m.get("meta", {}))

    def _ensure_present(self, info: SnapshotInfo) -> str:
        """A tracked snapshot whose directory was removed (e.g. a fresh clone) comes back from the DVC cache, or
        from the remote when another machine made it, once its .dvc file names nothing but the snapshot's
        directory; what DVC wrote must then be the manifest's tree. Returns "present", "cache" or "remote".
        Call it under the store's lock."""
        if info.path.is_dir():
            return "present"
        if info.dvc and self.dvc is not None:
            dvc_file = self.root / f"{info.id}.dvc"
            try:  # data, as a ref's .dvc file is: DVC writes whatever outputs it names
                why = dvc_file_problem(dvc_file.read_text(encoding="utf-8"), info.id)
            except (OSError, UnicodeDecodeError) as e:
                why = f"it cannot be read ({e})"
            if why:
                raise StoreError(f"snapshot {info.id}'s .dvc file is refused: {why}")
            source = "cache"
            try:
                try:
                    self.dvc.checkout(dvc_file)
                except DvcError:
                    if not self._remote():
                        raise
                    source = "remote"
                    self.dvc.pull(dvc_file)  # not in the local cache (another machine made it): fetch it
            except (DvcError, LockTimeout) as e:  # a store's refusal, as every other: callers catch StoreError
                remove_tree(info.path)  # what a failed restore wrote must not look present later
                lines = [line for line in str(e).splitlines() if line.strip()]
                more = f" (and {len(lines) - 1} more lines)" if len(lines) > 1 else ""
                raise StoreError(f"snapshot {info.id}'s files could not be restored from the DVC {source}: "
                                 f"{lines[0] if lines else 'DVC failed'}{more}") from None
            if info.path.is_dir():
                self._check_restored(info, source)
                return source
        raise StoreError(f"snapshot {info.id}'s files are missing from {info.path}"
                         + (" and DVC could not restore them" if info.dvc else ""))

    def _check_restored(self, info: SnapshotInfo, source: str) -> None:
        """What DVC just wrote into the snapshot's directory is its manifest's tree, or it is removed again: a .dvc
        file naming other contents (a clone's git pull) or a damaged remote object would otherwise stay there,
        looking present to every later fetch, get or put, and no later restore would replace it."""
        try:
            why = None if tree_hash(info.path) == info.tree_hash else "does not match its manifest"
        except TreeError as e:
            why = f"is no engine tree ({e})"
        if why:
            remove_tree(info.path)
            raise StoreError(f"snapshot {info.id} restored from the DVC {source} {why}; removed again")
