"""Bad user input: every output path is checked before the work starts, every float option refuses NaN and ±inf,
and each mistake ends in one line on stderr and exit status 2 with nothing half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from stability import atomic
from stability.errors import OutputError


def _can_create_in(d: Path) -> bool:
    try:
        fd, tmp = tempfile.mkstemp(dir=d)
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory nobody here may create files in: a read-only folder, or (as root, who ignores permission bits)
    the kernel's /sys, where no process can create a file."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for d in (ro, Path("/sys"), Path("/proc")):
            if d.is_dir() and not _can_create_in(d):
                yield d
                return
        pytest.fail("found no unwritable directory to test with")
    finally:
        ro.chmod(0o755)


def test_check_writable_accepts_a_creatable_file_and_directory_and_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "out.json"
    assert atomic.check_writable(target) == target
    assert atomic.check_writable(tmp_path / "new-dir", kind="dir") == tmp_path / "new-dir"
    assert sorted(os.listdir(tmp_path)) == []  # no folder made, no probe file left


def test_check_writable_refuses_a_directory_where_a_file_is_expected(tmp_path):
    with pytest.raises(OutputError, match="is a directory; expected a file name"):
        atomic.check_writable(tmp_path, what="--out")


def test_check_writable_refuses_a_file_where_a_directory_is_expected(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputError, match="is a file, expected a directory"):
        atomic.check_writable(f, kind="dir")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        atomic.check_writable(f / "sub" / "out.json")


def test_check_writable_refuses_an_unwritable_location(unwritable_dir):
    with pytest.raises(OutputError, match="cannot write in") as info:
        atomic.check_writable(unwritable_dir / "x" / "out.json", what="--json")
    assert "\n" not in str(info.value) and str(info.value).startswith("--json ")
    with pytest.raises(OutputError, match="cannot write in"):
        atomic.check_writable(unwritable_dir, kind="dir")


def test_failed_write_is_one_error_and_removes_the_folders_it_made(tmp_path):
    target = tmp_path / "new" / "deeper" / "out.txt"

    def fail(tmp):
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"cannot write .*out.txt: No space left on device"):
        with atomic.atomic_path(target) as tmp:
            fail(tmp)
    assert os.listdir(tmp_path) == []


def test_failed_write_into_unwritable_location_is_an_output_error(unwritable_dir):
    with pytest.raises(OutputError, match="cannot write"):
        atomic.write_text(unwritable_dir / "out.txt", "x")
