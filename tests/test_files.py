"""write_atomic: the run directory's records are written whole or not at all."""
from pathlib import Path

import pytest

from seis.files import write_atomic


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_part(tmp_path: Path) -> None:
    """A writer killed or failing while it writes (here: text that cannot be encoded, found mid-write) left
    vanilla.json or best.json cut short; a resume then read no snapshot from it."""
    path = tmp_path / "vanilla.json"
    write_atomic(path, '{"snapshot": "abc"}\n')
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, '{"snapshot": "' + "x" * 100_000 + "\ud800" + '"}\n')
    assert path.read_text() == '{"snapshot": "abc"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vanilla.json"]


def test_a_link_at_the_path_is_replaced_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("kept\n")
    path = tmp_path / "best.json"
    path.symlink_to(elsewhere)
    write_atomic(path, "{}\n")
    assert not path.is_symlink() and path.read_text() == "{}\n" and elsewhere.read_text() == "kept\n"


def test_a_record_is_readable_as_a_new_file_would_be_unless_asked_private(tmp_path: Path) -> None:
    """mkstemp makes its file 0600: status.json, outcome.json and best.json were unreadable to every other user,
    beside a 0644 config.json and reports."""
    import os
    import stat
    old = os.umask(0o022)
    try:
        assert stat.S_IMODE(write_atomic(tmp_path / "status.json", "{}\n").stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(write_atomic(tmp_path / "best.json", "{}\n").stat().st_mode) == 0o600
        os.umask(0o022)
        assert stat.S_IMODE(write_atomic(tmp_path / "store_error.txt", "x\n", mode=0o600).stat().st_mode) == 0o600
    finally:
        os.umask(old)
