"""A patch leaves the script working end to end (issue 37): `scalpel doctor` then `scalpel fix --verify`
on trainers that resume from (or reload) the checkpoint they save. whole-model-save changes the
reader with the save; --verify starts the patched script a second time in the same copy when its first
start wrote files, prints a failed start's own error, and compares the first steps' losses with the
original's through tune's numerics gate.

Each script runs in its own git tree, from its own folder (as a user runs it: the doctor run leaves its
checkpoint there, which the verification leaves out of its copies and names)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, cli_env, run_cli

pytest.importorskip("libcst")

FIXTURES = REPO / "tests" / "fixtures" / "fix"


def _tree(tmp_path: Path, *sources: Path) -> Path:
    """The sources in ``project/train/`` of a fresh git repository (the first one as ``train.py``)."""
    root = tmp_path / "project"
    (root / "train").mkdir(parents=True)
    for i, src in enumerate(sources):
        shutil.copy(src, root / "train" / ("train.py" if i == 0 else src.name))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "."], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "init"], check=True)
    return root / "train" / "train.py"


def _doctor(tmp_path: Path, script: Path) -> Path:
    run = tmp_path / "doctor-run"
    done = run_cli("doctor", "--no-report", "--out", str(run), "--", script.name, cwd=script.parent)
    assert (run / "run.json").is_file(), done.stdout + done.stderr
    return run


def _plain(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_resuming_trainer_is_patched_with_its_reader_and_runs_twice(tmp_path: Path) -> None:
    script = _tree(tmp_path, FIXTURES / "resume_regression.py")
    run = _doctor(tmp_path, script)
    patch = tmp_path / "fix.patch"
    fixed = run_cli("fix", str(run), "--verify", "--patch", str(patch), cwd=script.parent)
    err = fixed.stderr
    assert fixed.returncode == 0, fixed.stdout + err
    assert "patched: whole-model-save (train.py:31)" in err, err
    assert (
        "+    model.load_state_dict(torch.load(CKPT, weights_only=True))" in fixed.stdout
        and "+    torch.save(model.state_dict(), CKPT)" in fixed.stdout
    ), fixed.stdout
    assert "verify: left out of the copies: ckpt/last.pt: written before the patch, a pickled module" in err
    assert "verify: plain python: the patched script exited 0" in err, err
    assert (
        "verify: plain python, second start in the same copy (the first wrote ckpt/last.pt): "
        "the patched script exited 0" in err
    ), err
    assert "verify: losses: patched vs original over the first 10 steps: largest relative deviation" in err
    assert err.rstrip().split("\npage (the diff")[0].endswith("verify: verified"), err
    # Applied to the user's tree: the old pickled checkpoint removed as the note says, then two starts.
    subprocess.run(["git", "apply", str(patch)], cwd=script.parents[1], check=True)
    (script.parent / "ckpt" / "last.pt").unlink()
    first, second = _plain(script), _plain(script)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0 and "resumed from ckpt/last.pt" in second.stdout, second.stderr


def test_word_language_models_reload_at_the_end_is_rewritten_and_verified(tmp_path: Path) -> None:
    script = _tree(tmp_path, FIXTURES / "word_lm_reload.py")
    run = _doctor(tmp_path, script)
    findings = json.loads((run / "run.json").read_text(encoding="utf-8"))["findings"]
    assert {"whole-model-save", "unsafe-torch-load"} <= {f["rule"] for f in findings}
    fixed = run_cli("fix", str(run), "--verify", cwd=script.parent)
    err = fixed.stderr
    assert fixed.returncode == 0, fixed.stdout + err
    assert (
        "patched: whole-model-save (train.py:78)" in err and "patched: unsafe-torch-load (train.py:83)" in err
    )
    assert "+            torch.save(model.state_dict(), f)" in fixed.stdout, fixed.stdout
    assert "+    model.load_state_dict(torch.load(f, weights_only=True))" in fixed.stdout, fixed.stdout
    assert " model.rnn.flatten_parameters()" in fixed.stdout  # context: the call on the reloaded model stays
    assert "verify: plain python: the patched script exited 0" in err, err
    assert "verify: plain python, second start in the same copy (the first wrote model.pt)" in err, err
    assert err.rstrip().split("\npage (the diff")[0].endswith("verify: verified"), err


def test_a_reader_fix_cannot_rewrite_refuses_the_edit_naming_the_line(tmp_path: Path) -> None:
    script = _tree(tmp_path, FIXTURES / "resume_built_by_load.py")
    run = _doctor(tmp_path, script)
    fixed = run_cli("fix", str(run), "--apply", cwd=script.parent)
    assert fixed.returncode == 0, fixed.stderr
    out = fixed.stdout  # no diff: the summary is all fix prints, on stdout
    reason = (
        "train.py:15 builds model by loading it, and no model is built before that line to load the "
        "state_dict into; build the model first, then load its state_dict; by hand:"
    )
    assert f"not patched: whole-model-save: {reason}" in out, out
    assert f"not patched: unsafe-torch-load: {reason}" in out, out
    assert "no diff: what the runs asked for is not patched (the reasons above)" in out
    assert "---" not in out and "applied to" not in out
    assert script.read_text(encoding="utf-8") == (FIXTURES / "resume_built_by_load.py").read_text(
        encoding="utf-8"
    )


def test_verify_starts_twice_and_prints_the_error_of_a_reader_in_another_module(tmp_path: Path) -> None:
    folder = FIXTURES / "report_previous"
    script = _tree(tmp_path, folder / "train.py", folder / "previous.py")
    run = _doctor(tmp_path, script)
    fixed = run_cli("fix", str(run), "--verify", cwd=script.parent)
    err = fixed.stderr
    assert fixed.returncode == 1, fixed.stdout + err
    assert "verify: plain python: the patched script exited 0" in err, err
    assert (
        "verify: plain python, second start in the same copy (the first wrote last.pt): the patched script "
        "exited 1; its last lines:\n"
        'verify:     File "previous.py", line 9, in report_previous\n'
        "verify:     previous.eval()\n"
        "verify:     AttributeError: 'collections.OrderedDict' object has no attribute 'eval'\n"
    ) in err, err
    assert err.rstrip().split("\npage (the diff")[0].endswith("verify: NOT verified"), err


def test_a_load_of_the_scripts_own_pickled_objects_is_not_made_weights_only(tmp_path: Path) -> None:
    """The run saw the file hold an object of the script's own class: weights_only=True alone would make
    the patched script refuse its own file on its next start, so fix leaves that load and says why (the
    failed start's own error lines are shown by the reader-in-another-file test above)."""
    script = _tree(tmp_path, FIXTURES / "load_pickled_stats.py")
    before = script.read_text(encoding="utf-8")
    run = _doctor(tmp_path, script)
    fixed = run_cli("fix", str(run), "--verify", "--apply", cwd=script.parent)
    said = fixed.stdout + fixed.stderr
    assert fixed.returncode == 0, said
    assert "not patched: unsafe-torch-load: the file torch.load reads at line 20 held " in said, said
    assert "__main__.Stats" in said and "which weights_only=True refuses" in said, said
    assert script.read_text(encoding="utf-8") == before
    assert _plain(script).returncode == 0


def test_verify_says_not_verified_when_the_patch_changes_the_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forged edit: fix's own whole-model-save patch plus a learning rate changed in the same file.
    The doctor checks pass and the script runs twice; only the loss comparison can tell."""
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.fix.stage import plan_and_edit
    from torchscalpel.fix.verify import verify

    script = _tree(tmp_path, FIXTURES / "resume_regression.py")
    run = _doctor(tmp_path, script)
    monkeypatch.chdir(script.parent)
    options = FixOptions(run_dirs=(run,), verify=True)
    result = plan_and_edit(options)
    path, (before, after) = next(iter(result.changes.items()))
    assert "lr=0.05" in after
    result.changes[path] = (before, after.replace("lr=0.05", "lr=0.06"))
    verification = verify(result, options)
    lines = verification.lines()
    assert not verification.ok and lines[-1] == "NOT verified", lines
    assert "plain python: the patched script exited 0" in lines, lines
    assert (
        "doctor on the patched copy: gone unsafe-torch-load, whole-model-save; still there -; new -" in lines
    ), lines
    (losses,) = [line for line in lines if line.startswith("losses:")]
    assert losses.startswith("losses: patched vs original: loss deviates "), losses
    assert losses.endswith("> tolerance 1.0e-04 (exact) over the first 10 steps"), losses
