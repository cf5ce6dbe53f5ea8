"""scalpel fix on hostile run folders, end to end: a record is data, never code.

Each record is built with the record API around a real training script (as ``scalpel tune`` writes one:
the kept settings, the recorded sites, the script's hash), then forged. Code in a knob value, a path
outside the tree, a string thread count: refused in one sentence naming the field or the file, exit 2,
nothing written, nothing run (the injected code would touch a canary file). A latin-1 script is
patched, applied, verified and run in its own encoding.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import run_cli
from torchscalpel.record import new_run_record, save_record

SCRIPT = """import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
loader = torch.utils.data.DataLoader(data, batch_size=4)
for epoch in range(5):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""
LATIN1 = "# -*- coding: latin-1 -*-\n# réglages d'entraînement\n" + SCRIPT + 'print("entraîné")\n'


def _line(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(start))


def _site(script: Path, line: int, cls: str = "", **extra: Any) -> dict[str, Any]:
    return {"file": str(script), "line": line, "class": cls, "library": None, "used": True, **extra}


def _tune_run(script: Path, settings: dict[str, Any], out: Path) -> Path:
    """A tune run folder of ``script`` that kept ``settings``."""
    text = script.read_bytes().decode("latin-1")
    record = new_run_record(
        "tune", status="complete", target={"script": str(script), "args": []}, command=["scalpel", "tune"]
    )
    record.provenance = {
        "code": {"script": {"path": script.name, "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}}
    }
    record.sections["tune"] = {
        "settings": settings,
        "winner": {"verdict": "winner", "confirm_pairs": [[10.0, 9.0], [10.0, 9.5]]},
    }
    record.sections["sites"] = {
        "optimizers": [_site(script, _line(text, "opt = "), "SGD")],
        "dataloaders": [_site(script, _line(text, "loader = "), "DataLoader")],
        "model": _site(script, _line(text, "model = "), "Linear"),
        "forward": _site(
            script, _line(text, "loss = "), "Linear", device="cpu", autocast=False, input_dims=[2]
        ),
        "backward": _site(script, _line(text, "loss.backward"), ""),
        "step": _site(script, _line(text, "opt.step"), "SGD"),
    }
    out.mkdir(parents=True)
    save_record(record, out)
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(SCRIPT, encoding="utf-8")
    return root


def _assert_refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one sentence
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("field", "settings"),
    [
        ("matmul_precision", {"matmul_precision": 'high"); {CODE}; ("'}),
        ("threads", {"threads": "{CODE} or 2"}),
        ("compile.mode", {"compile": {"mode": 'default", dynamic={CODE}, fullgraph="'}}),
        ("compile.dynamic", {"compile": {"dynamic": "{CODE} or True"}}),
        ("dataloader.num_workers", {"dataloader": {"num_workers": "{CODE} or 0"}}),
    ],
)
def test_code_in_a_knob_value_is_refused_and_nothing_runs(
    tree: Path, tmp_path: Path, field: str, settings: dict[str, Any]
) -> None:
    canary = tmp_path / "PWNED"
    injected = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    forged = {
        k: (
            {kk: vv.replace("{CODE}", injected) for kk, vv in v.items()}
            if isinstance(v, dict)
            else v.replace("{CODE}", injected)
        )
        for k, v in settings.items()
    }
    run = _tune_run(tree / "train.py", forged, tmp_path / "run")
    done = run_cli(
        "fix", str(run), "--apply", "--force", "--verify", "--pairs", "1", "--steps", "3", cwd=tree
    )
    _assert_refused(done, f"sections.tune.settings.{field} must be", "(nothing was run or written)")
    assert not canary.exists()
    assert (tree / "train.py").read_text(encoding="utf-8") == SCRIPT
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # no fix.json either


def test_a_string_thread_count_is_refused_in_one_sentence(tree: Path, tmp_path: Path) -> None:
    run = _tune_run(tree / "train.py", {"threads": "four"}, tmp_path / "run")
    done = run_cli("fix", str(run), cwd=tree)
    _assert_refused(done, "sections.tune.settings.threads must be an integer >= 1")


def test_a_file_outside_the_tree_is_never_edited(tree: Path, tmp_path: Path) -> None:
    """The record names, with its right hash, a file outside the folder fix runs from."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "train.py"
    victim.write_text(SCRIPT, encoding="utf-8")
    run = _tune_run(victim, {"threads": 2}, tmp_path / "run")
    done = run_cli("fix", str(run), "--apply", "--force", cwd=tree)
    _assert_refused(done, f"{victim} is outside your tree ({tree.resolve()})")
    assert victim.read_text(encoding="utf-8") == SCRIPT
    # From the folder that holds it, the same record patches it: the tree is where fix runs.
    assert run_cli("fix", str(run), "--apply", "--force", cwd=elsewhere).returncode == 0
    assert "torch.set_num_threads(2)" in victim.read_text(encoding="utf-8")


def test_fix_run_from_the_file_system_root_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    run = _tune_run(script, {"threads": 2}, tmp_path / "run")
    done = run_cli("fix", str(run), "--apply", "--force", cwd=Path("/"))
    _assert_refused(done, "and that is /, the file system's root; run it from your project's folder.")
    assert script.read_text(encoding="utf-8") == SCRIPT


def test_a_latin1_script_is_patched_verified_and_run_in_latin1(tmp_path: Path) -> None:
    tree = tmp_path / "project"
    tree.mkdir()
    script = tree / "train.py"
    script.write_bytes(LATIN1.encode("latin-1"))
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "add", "train.py"], cwd=tree, check=True)
    git_id = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", *git_id, "commit", "-qm", "x"], cwd=tree, check=True)
    run = _tune_run(script, {"threads": 1, "optimizer": "foreach"}, tmp_path / "run")

    patch = tmp_path / "fix.patch"
    shown = run_cli(
        "fix",
        str(run),
        "--patch",
        str(patch),
        "--verify",
        "--pairs",
        "1",
        "--steps",
        "3",
        cwd=tree,
        errors="surrogateescape",
    )
    assert shown.returncode in (0, 1), shown.stderr  # 1: the timing did not verify; the run itself did
    assert "Traceback" not in shown.stderr
    assert "verify: plain python: the patched script exited 0" in shown.stderr
    assert "+torch.set_num_threads(1)" in shown.stdout
    assert shown.stdout.encode("utf-8", "surrogateescape") == patch.read_bytes()  # as git diff prints
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the hunks carry the file's own latin-1 bytes

    applied = run_cli("fix", str(run), "--apply", cwd=tree, errors="surrogateescape")
    assert applied.returncode == 0 and "Traceback" not in applied.stderr, applied.stderr
    text = script.read_bytes().decode("latin-1")
    assert "torch.set_num_threads(1)\n" in text and "foreach=True" in text
    assert "# réglages d'entraînement\n" in text and 'print("entraîné")' in text
    ran = subprocess.run(
        [sys.executable, "train.py"], cwd=tree, capture_output=True, text=True, encoding="utf-8"
    )
    assert ran.returncode == 0 and ran.stdout == "entraîné\n", ran.stderr
    again = run_cli(
        "fix", str(run), cwd=tree, errors="surrogateescape"
    )  # the applied patch is known as this fix's result
    assert again.returncode == 0 and "already done: threads 1" in again.stdout, again.stdout + again.stderr
