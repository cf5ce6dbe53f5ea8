"""`scalpel memory --patch` and `scalpel fix --verify` on a nanoGPT-style script that runs out of a memory
limit on CPU: the patch is the ladder's first fitting rung (checkpointing of the recorded block call),
applies with `git apply --check`, sits at the line the fixture calls its block, and the patched copy runs
under the same limit without crossing it; once applied, fix gives no diff."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_cli

pytest.importorskip("libcst")

SCRIPT = REPO / "tests" / "fixtures" / "memory" / "char_transformer.py"
LIMIT = "24MiB"
"""The fixture's peak is 46.8 MiB (41.9 MiB of activations); with its 4 blocks checkpointed it measured 17.5 MiB."""


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(SCRIPT, root / SCRIPT.name)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(root)]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    return root


def test_memory_patch_checkpoints_the_recorded_block_call_and_fits_under_the_limit(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    script = root / SCRIPT.name
    block_line = SCRIPT.read_text(encoding="utf-8").splitlines().index("            x = block(x)") + 1
    run = tmp_path / "memory-run"
    done = run_cli(
        "memory",
        "--memory-limit",
        LIMIT,
        "--no-report",
        "--patch",
        "--out",
        str(run),
        "--",
        str(script),
        cwd=root,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 1 and "OUT OF MEMORY" in done.stdout, done.stderr[-2000:]
    assert (run / "run.json").is_file()  # the stage's own record, written before the patch
    patch = run / "fix.patch"
    assert f"fix: {patch} (1 file(s); apply with git apply)" in done.stdout
    text = patch.read_text(encoding="utf-8")
    assert "# measured: the run crossed the limit of 24.0 MiB" in text
    assert "# the ladder's rung: activation checkpointing of the 4 repeated blocks: plan peak" in text
    # the one changed line is the fixture's block call, recorded by the run (not found by name)
    assert f"@@ -{block_line - 3},7 +{block_line - 3},7 @@" in text
    assert (
        "-            x = block(x)\n+            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
        in text
    )
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

    verified = run_cli("fix", str(run), "--verify", cwd=root, timeout=400, OMP_NUM_THREADS="1")
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert (
        "verify: memory: peak " in verified.stderr
        and "under the limit of 24.0 MiB for the whole run" in verified.stderr
    )
    assert (
        "verify: plain python: the patched script exited 0" in verified.stderr
        and "verify: verified" in verified.stderr
    )
    assert "x = block(x)" in script.read_text(encoding="utf-8")  # the user's file untouched

    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
    again = run_cli("fix", str(run), cwd=root)  # the patched script: no diff, the rung already done
    assert again.returncode == 0, again.stderr
    assert (
        "---" not in again.stdout
        and "already done: activation checkpointing of the Block blocks" in again.stdout
    )


def test_memory_patch_frees_the_last_steps_gradients_right_after_the_recorded_step(tmp_path: Path) -> None:
    fixture = SCRIPT.parent / "stale_grads.py"
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(fixture, root / fixture.name)
    step_line = fixture.read_text(encoding="utf-8").splitlines().index("    opt.step()") + 1
    run = tmp_path / "memory-run"
    done = run_cli(
        "memory",
        "--memory-limit",
        "19MiB",
        "--no-report",
        "--patch",
        "--out",
        str(run),
        "--",
        str(root / fixture.name),
        cwd=root,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 1 and "zero_grad(set_to_none=True) before the forward" in done.stdout, (
        done.stderr
    )
    text = (run / "fix.patch").read_text(encoding="utf-8")
    assert "frees 8.0 MiB of what was live at the crossing" in text
    assert f"@@ -{step_line - 2},4 +{step_line - 2},5 @@" in text
    assert "     opt.step()\n+    opt.zero_grad(set_to_none=True)\n     print(step, loss.item())\n" in text
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    check = subprocess.run(
        ["git", "apply", "--check", str(run / "fix.patch")], cwd=root, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
