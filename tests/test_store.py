"""Snapshot store: content-addressed put/get, plain and DVC-tracked."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest
from deep_trees import chain, no_deep_leftovers  # noqa: F401 (autouse: a deep chain is removed after its test)

from seis.engine_import import ENGINE_TEMPLATE
from seis.store import FileLock, LockTimeout, SnapshotStore, StoreError, UnknownSnapshotError, dvc_command
from seis.workspace import copy_tree, tree_hash


@pytest.fixture
def engine(tmp_path):
    d = tmp_path / "engine_tree"
    copy_tree(ENGINE_TEMPLATE, d)
    (d / "NOTES.md").write_text("n\n")
    os.chmod(d / "NOTES.md", 0o755)
    (d / "engine" / "__pycache__").mkdir(exist_ok=True)
    (d / "engine" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return d


def _files(root):
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_put_get_restores_byte_identical_files(engine, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    assert store.dvc is None  # tmp_path lies in no DVC repository
    sid = store.put(engine, meta={"chain": "c0", "session": 1})
    assert len(sid) == 16 and tree_hash(engine).startswith(sid)
    out = store.get(sid, tmp_path / "restored")
    assert _files(out) == _files(engine)
    info = store.info(sid)
    assert info.dvc is False and info.meta == {"chain": "c0", "session": 1} and info.files == len(_files(engine))
    assert [s.id for s in store.list()] == [sid]
    with pytest.raises(StoreError, match="not empty"):
        store.get(sid, out)


@pytest.mark.parametrize("dest_exists", [False, True])
def test_a_snapshot_whose_files_changed_in_the_store_is_refused_and_leaves_nothing_restored(engine, tmp_path,
                                                                                          dest_exists):
    """A stored file altered after put (a damaged disk, someone's edit): get refuses the snapshot, and no
    half-restored or altered tree is left where the caller asked for it, which a caller catching the error
    could still build and run."""
    store = SnapshotStore(tmp_path / "store")
    sid = store.put(engine)
    (store.root / sid / "engine" / "model.py").write_text("raise SystemExit('not the gated code')\n")
    dest = tmp_path / "restored"
    if dest_exists:
        dest.mkdir()
    with pytest.raises(StoreError, match="does not match its manifest"):
        store.get(sid, dest)
    assert (dest.is_dir() and not any(dest.iterdir())) if dest_exists else not dest.exists()


def test_a_manifest_rewritten_on_disk_restores_nothing_and_reads_nothing_outside_the_store(engine, tmp_path):
    """A manifest is data (a clone's git pull or anyone with the store's folder may change it), checked as a ref's
    is: rewritten to fit altered files, it named a tree that was never judged, and `get` restored it under the old
    id; an `id` of "../x" made `get` read another directory; a malformed one ended in a KeyError or TypeError."""
    import json

    from seis.workspace.tree import file_sha256
    store = SnapshotStore(tmp_path / "store")
    sid = store.put(engine)
    manifest_path = store.root / f"{sid}.json"
    original = json.loads(manifest_path.read_text())
    (store.root / sid / "engine" / "model.py").write_text("raise SystemExit('not the gated code')\n")
    refit = {**original, "tree_hash": tree_hash(store.root / sid),
             "files": [{**f, "sha256": file_sha256(store.root / sid / f["path"])} for f in original["files"]]}
    outside = tmp_path / "outside"
    copy_tree(engine, outside)
    elsewhere = {**original, "id": "../outside"}
    for forged in (refit, elsewhere, {**original, "files": 5}, {**original, "files": [{"path": "a", "mode": "644"}]},
                   [1, 2], "{not json"):
        manifest_path.write_text(forged if isinstance(forged, str) else json.dumps(forged))
        for call in (lambda: store.get(sid, tmp_path / "restored"), lambda: store.info(sid), store.list):
            with pytest.raises(StoreError, match=f"snapshot {sid}'s manifest"):
                call()
        assert not (tmp_path / "restored").exists()


@pytest.mark.parametrize("planted", ["link to a FIFO", "link to a file", "FIFO"])
def test_a_link_or_special_file_in_a_stored_tree_is_refused_never_read(engine, tmp_path, planted):
    """What lies in a store's folder (copied from another clone, shared between hosts) is read as a tree is:
    through descriptors, never following a link. `get` copied each file by its path, following links, so a stored
    file swapped for a link to a device (/dev/zero: the destination's disk filled) or to a host file was read,
    and a link to a FIFO ended in shutil's SpecialFileError instead of a StoreError."""
    store = SnapshotStore(tmp_path / "store")
    sid = store.put(engine)
    stored = store.root / sid / "engine" / "model.py"
    target = tmp_path / "outside.py"
    if planted == "link to a file":
        target.write_bytes(stored.read_bytes())    # the very bytes: the hash check alone would pass it
    stored.unlink()
    if planted == "FIFO":
        os.mkfifo(stored)
    else:
        if planted == "link to a FIFO":
            os.mkfifo(target)
        os.symlink(target, stored)
    with pytest.raises(StoreError, match=f"snapshot {sid}.*cannot be restored"):
        store.get(sid, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_same_tree_same_id_and_one_copy(engine, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    sid = store.put(engine)
    twin = tmp_path / "twin"
    copy_tree(engine, twin)
    assert store.put(twin) == sid and len(store.list()) == 1
    (twin / "engine" / "model.py").write_text("# changed\n")
    other = store.put(twin)
    assert other != sid and {s.id for s in store.list()} == {sid, other} and sid in store


def test_unknown_id_is_a_clear_error(engine, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    store.put(engine)
    for bad in ("0123456789abcdef", "../../etc", "short"):
        with pytest.raises(UnknownSnapshotError, match="no snapshot"):
            store.get(bad, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_interrupted_put_is_redone_and_missing_files_are_reported(engine, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    sid = tree_hash(engine)[:16]
    (store.root / sid).mkdir()  # a directory without a manifest: an interrupted put
    (store.root / sid / "junk").write_text("j")
    assert store.put(engine) == sid
    assert not (store.root / sid / "junk").exists()
    shutil.rmtree(store.root / sid)
    with pytest.raises(StoreError, match="missing"):
        store.get(sid, tmp_path / "x")


def test_file_lock_excludes_a_second_holder(tmp_path):
    with FileLock(tmp_path / "l"):
        with pytest.raises(LockTimeout):
            with FileLock(tmp_path / "l", timeout_s=0.2):
                pass
    with FileLock(tmp_path / "l", timeout_s=0.2):
        pass


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_dvc_tracks_snapshots(engine, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([*dvc_command(), "init", "--no-scm", "-q"], cwd=repo, check=True)
    store = SnapshotStore(repo / "snapshots")
    assert store.dvc is not None and store.dvc.root == repo
    # Two puts at once: the DVC calls are serialized by the lock (DVC fails if two run in one repo).
    second = tmp_path / "second"
    copy_tree(engine, second)
    (second / "NOTES.md").write_text("other\n")
    ids: list[str] = []
    threads = [threading.Thread(target=lambda d=d: ids.append(store.put(d))) for d in (engine, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 2
    for sid in ids:
        assert (repo / "snapshots" / f"{sid}.dvc").is_file() and store.info(sid).dvc
    assert "up to date" in store.status(ids[0])
    done = subprocess.run([*dvc_command(), "status"], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0 and "up to date" in done.stdout
    # The files come back from the DVC cache when the snapshot directory is gone.
    shutil.rmtree(repo / "snapshots" / ids[0])
    out = store.get(ids[0], tmp_path / "restored")
    assert tree_hash(out) == store.info(ids[0]).tree_hash


def test_snapshots_go_to_the_default_remote_and_come_back_on_another_machine(engine, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    dvc = dvc_command()
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=repo, check=True)
    subprocess.run([*dvc, "remote", "add", "-d", "local", str(tmp_path / "remote")], cwd=repo, check=True)
    sid = SnapshotStore(repo / "snapshots").put(engine)
    assert any((tmp_path / "remote").rglob("*"))           # pushed
    # "another machine": the cache and the snapshot directory are gone, only git-tracked files remain
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "snapshots" / sid)
    out = SnapshotStore(repo / "snapshots").get(sid, tmp_path / "restored")
    assert _files(out) == _files(engine)


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_a_dvc_file_rewritten_on_disk_makes_dvc_write_nothing_outside_the_snapshot(engine, tmp_path):
    """A snapshot's .dvc file on disk is data (a clone's git pull brings it), checked as a ref's is before DVC acts
    on it: one whose output was rewritten to `../newdir` made the `dvc checkout` of a missing snapshot write the
    stored tree there, anywhere in the repository (a new package, a conftest.py under tests/), and leave it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([*dvc_command(), "init", "--no-scm", "-q"], cwd=repo, check=True)
    store = SnapshotStore(repo / "snapshots")
    sid = store.put(engine)
    dvc_file = repo / "snapshots" / f"{sid}.dvc"
    shutil.rmtree(repo / "snapshots" / sid)          # a fresh clone: restored from the DVC cache on demand
    original = dvc_file.read_text()
    for forged in (original.replace(f"path: {sid}", "path: ../newdir"), original + "cmd: touch x\n"):
        dvc_file.write_text(forged)
        with pytest.raises(StoreError, match=f"snapshot {sid}'s .dvc file is refused"):
            store.get(sid, tmp_path / "restored")
        assert not (repo / "newdir").exists() and not (tmp_path / "restored").exists()
    dvc_file.write_text(original)
    assert tree_hash(store.get(sid, tmp_path / "restored")) == tree_hash(engine)


def test_use_dvc_true_needs_a_repository(tmp_path):
    with pytest.raises(StoreError, match="dvc init"):
        SnapshotStore(tmp_path / "store", use_dvc=True)


def test_a_tree_nested_past_the_recursion_limit_is_refused_not_a_crash(engine, tmp_path):
    """An agent can leave a chain of directories deeper than Python's recursion limit in its engine; storing it
    is a StoreError like any tree that cannot be stored, never a RecursionError out of the host."""
    chain(engine / "deep", 1500)
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(StoreError, match="cannot be stored"):
        store.put(engine)
    assert store.list() == []


def _dvc_store(tmp_path, remote: bool = False) -> SnapshotStore:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([*dvc_command(), "init", "--no-scm", "-q"], cwd=repo, check=True)
    if remote:
        subprocess.run([*dvc_command(), "remote", "add", "-d", "local", str(tmp_path / "remote")], cwd=repo,
                       check=True, capture_output=True)
    return SnapshotStore(repo / "snapshots")


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_a_dvc_file_naming_another_tree_restores_nothing_and_leaves_nothing_that_looks_present(engine, tmp_path):
    """A .dvc file whose output keeps the snapshot's path but whose md5 names another tree's contents (a clone's git
    pull): DVC wrote that tree into the snapshot's directory; `get` refused it, but the directory stayed, so `fetch`
    said the snapshot was present, and once the .dvc file was right again no restore ever came back from DVC."""
    store = _dvc_store(tmp_path)
    other = tmp_path / "other"
    copy_tree(engine, other)
    (other / "engine" / "model.py").write_text("raise SystemExit('not the gated code')\n")
    sid, oid = store.put(engine), store.put(other)
    dvc_file = store.root / f"{sid}.dvc"
    original = dvc_file.read_text()
    dvc_file.write_text((store.root / f"{oid}.dvc").read_text().replace(oid, sid))
    shutil.rmtree(store.root / sid)  # a fresh clone: restored from DVC on demand
    for call in (lambda: store.get(sid, tmp_path / "restored"), lambda: store.fetch(sid), lambda: store.fetch(sid)):
        with pytest.raises(StoreError, match=f"snapshot {sid} restored from the DVC cache does not match"):
            call()
        assert not (store.root / sid).exists() and not (tmp_path / "restored").exists()
    dvc_file.write_text(original)
    assert store.fetch(sid) == "cache"
    assert _files(store.get(sid, tmp_path / "restored")) == _files(engine)


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_a_remote_missing_objects_is_a_store_error_naming_the_snapshot(engine, tmp_path):
    """A remote that lacks some of a snapshot's objects (a push that never finished, a pruned remote): DVC's own
    error (DvcError, one line per object) came out of `get` and `fetch`, which the gate and the benchmarks do not
    catch as a store's refusal: a traceback instead of the gate's bad-input verdict or the benchmark's one line."""
    store = _dvc_store(tmp_path, remote=True)
    sid = store.put(engine)
    shutil.rmtree(store.dvc.root / ".dvc" / "cache")  # another machine: only the remote holds the files
    shutil.rmtree(store.root / sid)
    objects = sorted(p for p in (tmp_path / "remote").rglob("*") if p.is_file() and not p.name.endswith(".dir"))
    for p in objects[::2]:
        p.unlink()
    for call in (lambda: store.get(sid, tmp_path / "restored"), lambda: store.fetch(sid)):
        with pytest.raises(StoreError, match=f"snapshot {sid}'s files could not be restored from the DVC remote") \
                as caught:
            call()
        assert len(str(caught.value).splitlines()) == 1
        assert not (store.root / sid).exists() and not (tmp_path / "restored").exists()


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_a_get_waits_for_a_restore_in_flight_instead_of_copying_half_of_it(engine, tmp_path, monkeypatch):
    """Two processes restoring one snapshot that DVC must bring back (workers sharing a store, two post-validations):
    `get` restored without the store's lock, so the second one copied the directory the first one's checkout was
    still writing and failed the hash check ("store corrupted?")."""
    from seis.store import DvcRepo
    store = _dvc_store(tmp_path)
    sid = store.put(engine)
    shutil.rmtree(store.root / sid)
    writing, finish = threading.Event(), threading.Event()
    checkout = DvcRepo.checkout

    def slow_checkout(self, dvc_file):  # DVC writes a directory's files one by one
        (store.root / sid).mkdir()
        (store.root / sid / "NOTES.md").write_text("n\n")
        writing.set()
        finish.wait(10)
        shutil.rmtree(store.root / sid)
        checkout(self, dvc_file)

    monkeypatch.setattr(DvcRepo, "checkout", slow_checkout)
    first = threading.Thread(target=lambda: store.get(sid, tmp_path / "first"))
    first.start()
    assert writing.wait(10)
    threading.Timer(0.5, finish.set).start()
    try:
        second = store.get(sid, tmp_path / "second")
    finally:
        finish.set()
        first.join()
    assert _files(second) == _files(tmp_path / "first") == _files(engine)


def test_a_store_held_by_another_process_is_a_store_error_after_the_timeout(engine, tmp_path):
    """A process that holds the store's lock past the timeout (one stuck in a push, a stopped one): LockTimeout
    came out of put, get and fetch, which the gate and the benchmarks do not catch as the store's refusal."""
    store = SnapshotStore(tmp_path / "store", lock_timeout_s=0.2)
    sid = store.put(engine)
    with FileLock(store.root / ".lock"):
        for call in (lambda: store.put(engine), lambda: store.get(sid, tmp_path / "restored"),
                     lambda: store.fetch(sid)):
            with pytest.raises(StoreError, match="is locked by another process"):
                call()
    assert not (tmp_path / "restored").exists()
    assert store.fetch(sid) == "present"


@pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")
def test_dvc_held_by_another_process_is_a_store_error_that_leaves_nothing_behind(engine, tmp_path):
    """The same for the repository's DVC lock (DVC itself must not run twice at once in one repository)."""
    from seis.store.dvc import LOCK_NAME
    store = _dvc_store(tmp_path)
    sid = store.put(engine)
    shutil.rmtree(store.root / sid)
    other = tmp_path / "other"
    copy_tree(engine, other)
    (other / "NOTES.md").write_text("other\n")
    store = SnapshotStore(store.root, lock_timeout_s=0.2)
    with FileLock(store.dvc.root / ".dvc" / "tmp" / LOCK_NAME):
        with pytest.raises(StoreError, match=f"snapshot {sid}'s files could not be restored from the DVC cache"):
            store.get(sid, tmp_path / "restored")
        with pytest.raises(StoreError, match="could not be tracked with DVC"):
            store.put(other)
    assert not (store.root / sid).exists() and not (tmp_path / "restored").exists() and len(store.list()) == 1
    assert _files(store.get(sid, tmp_path / "restored")) == _files(engine)


def test_a_stored_copy_gone_bad_is_restored_from_dvc_once_and_get_succeeds(engine, tmp_path):
    """A `dvc checkout` killed midway, or an edit, left the store's directory of a DVC-tracked snapshot different
    from its manifest: every later get refused it ("store corrupted?") and fetch called it present. DVC still
    holds the retained tree, so get restores the store's copy from it and hands out the right tree."""
    store = _dvc_store(tmp_path)
    sid = store.put(engine)
    (store.root / sid / "engine" / "model.py").write_text("half written\n")
    (store.root / sid / "NOTES.md").unlink()
    out = store.get(sid, tmp_path / "out")
    assert tree_hash(out) == tree_hash(engine) and tree_hash(store.root / sid) == tree_hash(engine)
