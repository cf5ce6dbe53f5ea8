"""`scalpel doctor --patch` and `scalpel tune --patch`: the stage's own run, then the diff `scalpel fix
RUN_DIR` would print, written as fix.patch in the stage's run folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_cli

pytest.importorskip("libcst")

FIXTURES = REPO / "tests" / "fixtures"


def _repo(tmp_path: Path, script: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(script, root / script.name)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(root)]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    return root


def _applies(root: Path, patch: Path) -> None:
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_doctor_patch_writes_the_fix_diff_in_its_run_folder(tmp_path: Path) -> None:
    root = _repo(tmp_path, FIXTURES / "doctor" / "grad_not_zeroed.py")
    run = tmp_path / "doctor-run"
    done = run_cli("doctor", "--patch", "--out", str(run), "--", str(root / "grad_not_zeroed.py"), cwd=root)
    patch = run / "fix.patch"
    assert (run / "run.json").is_file() and patch.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    assert f"fix: {patch} (1 file(s); apply with git apply)" in done.stdout.replace("\n", "")
    text = patch.read_text(encoding="utf-8")
    assert (
        "# findings fixed: grad-not-zeroed" in text and "+        opt.zero_grad(set_to_none=True)\n" in text
    )
    assert text == run_cli("fix", str(run), cwd=root).stdout  # the same diff scalpel fix RUN_DIR prints
    _applies(root, patch)


@pytest.mark.slow
def test_tune_patch_writes_the_kept_optimizer_setting_as_fix_patch(tmp_path: Path) -> None:
    root = _repo(tmp_path, FIXTURES / "tune" / "tiny_train.py")
    run = tmp_path / "tune-run"
    done = run_cli(
        "tune",
        "--patch",
        "--knobs",
        "optimizer",
        "--budget",
        "3m",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--confirm",
        "1",
        "--config",
        str(tmp_path / "scalpel.toml"),
        "--out",
        str(run),
        "--",
        str(root / "tiny_train.py"),
        "--steps",
        "30",
        "--slow-unfused",
        "30",
        cwd=root,
        timeout=400,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    patch = run / "fix.patch"
    assert f"fix: {patch} (1 file(s); apply with git apply" in done.stdout
    text = patch.read_text(encoding="utf-8")
    assert "# measured: " in text
    assert "+    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n" in text
    _applies(root, patch)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("doctor", "--patch", "--static", "."), "--patch goes with a script run of one process"),
        (("tune", "--patch", "--fit", "1GiB", "--", "train.py"), "--patch goes with the search, not --fit"),
        (("memory", "--patch", "snap.pickle"), "--patch goes with a script run, not with a SNAPSHOT.pickle"),
    ],
)
def test_patch_where_no_run_folder_is_patched_is_a_usage_error(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
