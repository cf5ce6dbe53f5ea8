"""Output paths the user names (issue 19, item 14): checked before work, written in one sentence."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.fileio import (
    atomic_write_text,
    check_output_dir,
    check_output_file,
    finite_json,
    write_output_text,
)


def test_atomic_write_into_a_pipe_keeps_the_pipe(tmp_path: Path) -> None:
    # A rename onto a device or pipe replaces the node itself: as root, --json /dev/full turned
    # /dev/full into a regular file. The write now goes into the existing node.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write_text(fifo, "x")
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert os.read(reader, 10) == b"x"
    finally:
        os.close(reader)


def test_output_checks_refuse_folders_files_and_unwritable_places(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match="existing file"):
        check_output_dir(f)
    with pytest.raises(UsageError, match=r"not writable|not a folder"):
        check_output_dir(Path("/proc/scalpel-test/x"))
    with pytest.raises(UsageError, match="is a folder"):
        check_output_file(tmp_path, "--json")
    with pytest.raises(UsageError, match="does not exist"):
        check_output_file(tmp_path / "no" / "x.json", "--json")
    check_output_dir(tmp_path / "new" / "run")  # creatable: accepted, and nothing is left behind
    assert not (tmp_path / "new").exists() and [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_write_to_a_full_device_is_one_sentence() -> None:
    with pytest.raises(UsageError, match="Could not write --json /dev/full"):
        write_output_text(Path("/dev/full"), "{}", flag="--json")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_finite_json_has_no_nan() -> None:
    import numpy as np

    assert finite_json({"a": [float("nan"), np.float32("inf"), 1.5, np.int64(3)], "b": (None, True)}) == {
        "a": [None, None, 1.5, 3],
        "b": [None, True],
    }
