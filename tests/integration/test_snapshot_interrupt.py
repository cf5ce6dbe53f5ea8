"""Ctrl-C during ``scalpel memory SNAPSHOT`` ends the read: exit 130 and one line, with either reader (issue 41).

The pure-Python reader lost it 5 times in 5: the C unpickler looks at no signal while it runs, and the file
was read through a ``BufferedReader`` wrapped round the file's own, which dropped the interrupt; the read
completed, the summary printed, exit 0. Each test starts the CLI on a generated snapshot that takes seconds
to read, waits until the process has the file open, sends SIGINT and judges the exit code and the output.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchscalpel.memory import snapshot_native as native

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def big_snapshot(path: Path, n_segments: int) -> None:
    """A snapshot of ``n_segments`` segments of 4 blocks, each frame with a file name of its own (the native
    reader asks Python about each new one), written from one pickled segment's bytes in well under a second."""
    frames = [
        {"filename": f"/home/u/m_{'X' * 8}_{k}.py", "name": "forward", "line": 10 + k} for k in range(2)
    ]
    blocks = [
        {
            "address": 0,
            "size": 4096,
            "requested_size": 4000,
            "state": "active_allocated",
            "frames": [dict(f) for f in frames],
        }
        for _ in range(4)
    ]
    seg = {"device": 0, "address": 0, "total_size": 1 << 20, "segment_pool_id": (0, 0), "blocks": blocks}
    body = pickletools.optimize(pickle.dumps(seg, protocol=2))  # no memo: each copy builds objects of its own
    assert body[:2] == b"\x80\x02" and body[-1:] == b"."
    parts = body[2:-1].split(b"X" * 8)  # the same length for every number: the string lengths stay valid
    with path.open("wb") as fh:
        fh.write(b"\x80\x02}(X\x08\x00\x00\x00segments](")
        for start in range(0, n_segments, 1000):
            fh.write(b"".join((b"%08d" % i).join(parts) for i in range(start, min(start + 1000, n_segments))))
        fh.write(b"eX\x0d\x00\x00\x00device_traces]u.")


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to the default, so Python installs its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _reading(pid: int, path: Path) -> bool:
    """The process has the file open (the Python reader) or mapped (the native one)."""
    try:
        if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd")):
            return True
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("interrupt") / "big.pickle"
    big_snapshot(path, 50_000)  # 24 MB: seconds for either reader on these machines
    with path.open("rb") as fh:  # the generated file is a snapshot (its last segment included)
        assert (
            pickle.load(fh)["segments"][-1]["blocks"][3]["frames"][1]["filename"] == "/home/u/m_00049999_1.py"
        )
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the file open")
@pytest.mark.parametrize("use_native", [True, False], ids=["native", "python"])
def test_ctrl_c_during_the_read_exits_130_in_one_line(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_native: bool
) -> None:
    if use_native and not HAS_CC:
        pytest.skip("no C compiler on this machine: the native reader cannot be built (CI installs gcc)")
    env = {
        **os.environ,
        "TORCHSCALPEL_CACHE_DIR": str(tmp_path / "cache"),
        "TORCHSCALPEL_NATIVE": str(int(use_native)),
    }
    if use_native:  # compiled here first: the child's read starts at once
        monkeypatch.setenv("TORCHSCALPEL_CACHE_DIR", env["TORCHSCALPEL_CACHE_DIR"])
        monkeypatch.setattr(native, "_loaded", None)
        assert native.load_library()[0] is not None
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchscalpel", "memory", str(snapshot)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        # Ctrl-C as a terminal delivers it: a suite started in the background (`make test &`, a CI runner)
        # inherits SIGINT ignored, which Python keeps ignored in the child, so nothing would interrupt it.
        preexec_fn=_sigint_default,
    )
    try:
        deadline = time.monotonic() + 60
        while not _reading(proc.pid, snapshot) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)  # well inside the read, which takes seconds
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(
            timeout=30
        )  # generous: "within a second" is the goal, not a timed assertion
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, out[-500:], err[-500:])
    assert out == ""  # no summary
    assert err.strip().splitlines() == ["scalpel: interrupted"], err
