"""Directory chains deeper than Python's recursion limit, as a hostile agent or engine can leave them; the cleanup
the tests that make them need (pytest's own removal of old temporary directories recurses, so none may be left
behind); and the host file such trees aim at."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from seis.workspace.tree import remove_tree

DEEP = 1500  # past the interpreter's recursion limit (1000)


def chain(root: Path, depth: int, name: str = "d") -> Path:
    """root/d/d/.../d/f, `depth` directories deep, made relative to each level (a path that long has no name);
    root is made if missing. Returns root."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
        f.write("bottom")
    os.close(fd)
    return root


@pytest.fixture(autouse=True)
def no_deep_leftovers(tmp_path: Path):
    """Autouse in every module that imports it: the test's tmp_path is removed with remove_tree after it."""
    yield
    remove_tree(tmp_path)


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """A host secret (0600 in a 0700 directory) that links in a hostile tree point at: it must stay as it is."""
    target = tmp_path / "host" / "keys.env"
    target.parent.mkdir()
    target.write_text("KEY=host-secret")
    target.chmod(0o600)
    target.parent.chmod(0o700)
    return target
