"""Checkpointer: a failed save raises on every rank (none waits out torch's timeout), SIGTERM handed back on close."""

from __future__ import annotations

import signal

import pytest
from torch import nn

from helpers import REPO, run_ranks
from torchscalpel import distributed as sd
from torchscalpel.distributed import manifest

pytestmark = pytest.mark.dist


def test_every_rank_raises_when_rank_0_cannot_save(tmp_path):
    script = REPO / "tests" / "distributed" / "scripts" / "ckpt_agree.py"
    expect = [tmp_path / "rank-0.txt", tmp_path / "rank-1.txt"]
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--out",
        str(tmp_path / "launch"),
        "--",
        str(script),
        str(tmp_path),
        cwd=tmp_path,
        expect=expect,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        lines = (tmp_path / f"rank-{rank}.txt").read_text().splitlines()
        assert len(lines) == 2, lines
        assert (
            lines[0].startswith("Saving failed before writing step 1 (on rank 0): ")
            and "already exists" in lines[0]
        )
        assert lines[1] == (
            f"Saving failed committing step 2 (on rank 0): No space left on device: "
            f"{tmp_path / 'ckpt' / 'step-2'}"
        )
    assert manifest.check(manifest.step_dir(tmp_path / "ckpt", 3)) is None


def test_a_refused_overwrite_on_one_rank_is_one_sentence(single_rank, tmp_path):
    ckpt = sd.Checkpointer(tmp_path, model=nn.Linear(2, 2), sigterm=False)
    ckpt.save(1)
    with pytest.raises(
        sd.CheckpointError, match=r"^Saving failed before writing step 1: .*step-0+1 already exists"
    ):
        ckpt.save(1)
    ckpt.close()


def test_sigterm_handler_is_handed_back_on_close_and_on_error(single_rank, tmp_path):
    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    with sd.Checkpointer(tmp_path / "a", model=nn.Linear(2, 2)) as ckpt:
        assert signal.getsignal(signal.SIGTERM) == ckpt._on_sigterm
    assert signal.getsignal(signal.SIGTERM) is mine
    with (
        pytest.raises(RuntimeError, match="boom"),
        sd.Checkpointer(tmp_path / "b", model=nn.Linear(2, 2)) as ckpt,
    ):
        ckpt.save(1)
        raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGTERM) is mine
    again = sd.Checkpointer(tmp_path / "b", model=nn.Linear(2, 2))  # the writer lock was released too
    again.close()
    again.close()  # twice is harmless
    assert signal.getsignal(signal.SIGTERM) is mine
