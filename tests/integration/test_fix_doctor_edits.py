"""`scalpel doctor` then `scalpel fix --verify` on scripts in real users' styles, each in its own git
tree: the diff applies with `git apply --check`, each edit lands on the line the finding's fix belongs
on (read from the fixture, never counted by hand), the patched script runs under plain python and the
doctor re-run on it no longer reports the finding (and reports nothing new).

Kept cheap: the scripts run a few steps; each case is one doctor run and one verification."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from torchscalpel.netutil import free_port

pytest.importorskip("libcst")

FIXTURES = REPO / "tests" / "fixtures"


def _tree(tmp_path: Path, name: str, text: str) -> Path:
    """``text`` as ``train/NAME`` in a fresh git repository with one commit; the script's path."""
    root = tmp_path / "project"
    (root / "train").mkdir(parents=True)
    script = root / "train" / name
    script.write_text(text, encoding="utf-8")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "."], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "init"], check=True)
    return script


def _doctor_then_fix(
    tmp_path: Path, script: Path, args: tuple[str, ...] = (), **env: str
) -> tuple[dict[str, int], str, str]:
    """Doctor the script, then fix --verify its run. The line of each finding, the patch, fix's stderr."""
    root = script.parents[1]
    run = tmp_path / "doctor-run"
    done = run_cli("doctor", "--no-report", "--out", str(run), "--", str(script), *args, cwd=root, **env)
    assert (run / "run.json").is_file(), done.stderr
    findings = json.loads((run / "run.json").read_text(encoding="utf-8"))["findings"]
    lines = {f["rule"]: int(f["location"]["line"]) for f in findings if f.get("location")}
    patch = tmp_path / "fix.patch"
    fixed = run_cli("fix", str(run), "--verify", "--patch", str(patch), cwd=root, **env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "verify: plain python: the patched script exited 0" in fixed.stderr, fixed.stderr
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
    again = run_cli("fix", str(run), cwd=root, **env)  # idempotent: the patched file gives no diff
    assert again.returncode == 0 and "---" not in again.stdout, again.stdout + again.stderr
    return lines, patch.read_text(encoding="utf-8"), fixed.stderr


def _line(text: str, needle: str) -> int:
    """The 1-based number of the one line of ``text`` holding ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def test_ddp_loop_gets_set_epoch_in_its_epoch_loop(tmp_path: Path) -> None:
    """The doctor fixture: a single-process gloo group, as a 1-rank launcher starts it."""
    source = (FIXTURES / "doctor" / "sampler_set_epoch_missing.py").read_text(encoding="utf-8")
    script = _tree(tmp_path, "train_ddp.py", source)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    lines, patch, err = _doctor_then_fix(tmp_path, script, **env)
    loop = _line(source, "for xb, yb in loader:")
    assert lines["sampler-set-epoch-missing"] == loop  # the runtime rule: the loop that iterated it
    assert "gone sampler-set-epoch-missing; still there -; new -" in err, err
    after = script.read_text(encoding="utf-8").splitlines()
    epoch_loop = _line(source, "for _epoch in range(")
    assert after[epoch_loop] == "    sampler.set_epoch(_epoch)"  # first statement of the epoch loop
    assert after[epoch_loop + 1] == source.splitlines()[loop - 1]
    assert "# findings fixed: sampler-set-epoch-missing" in patch


def test_nanogpt_eval_clip_and_seed(tmp_path: Path) -> None:
    """The corpus's nanoGPT-style script with three bugs planted: estimate_loss without its
    ``@torch.no_grad()``, clipping without ``scaler.unscale_``, no seed. The fix must put the first two
    back where nanoGPT has them and seed after the imports."""
    corpus = (FIXTURES / "corpus" / "nanogpt_style.py").read_text(encoding="utf-8")
    seed = "torch.manual_seed(seed + seed_offset)\n"
    planted = (
        corpus.replace("@torch.no_grad()\ndef estimate_loss", "def estimate_loss")
        .replace("        scaler.unscale_(optimizer)\n", "")
        .replace(seed, "")
    )
    assert planted.count("\n") == corpus.count("\n") - 3
    script = _tree(tmp_path, "train_gpt.py", planted)
    lines, patch, err = _doctor_then_fix(tmp_path, script, ("--max_iters=8", "--eval_interval=4"))
    assert lines["eval-without-no-grad"] == _line(planted, "_, loss = model(X, Y)")
    assert lines["clip-before-unscale"] == _line(planted, "clip_grad_norm_(")
    assert "unseeded-run" in lines
    assert "gone clip-before-unscale, eval-without-no-grad, unseeded-run; still there -; new -" in err, err
    # The decorator and unscale_ come back on the corpus's own lines; the seed after the imports.
    imports_end = "import torch.nn.functional as F\n"
    expected = corpus.replace(seed, "").replace(imports_end, imports_end + "torch.manual_seed(0)\n")
    assert script.read_text(encoding="utf-8") == expected
    assert "@@" in patch and "+@torch.no_grad()" in patch and "+        scaler.unscale_(optimizer)" in patch


def test_a_summed_loss_tensor_becomes_a_float(tmp_path: Path) -> None:
    source = (FIXTURES / "doctor" / "loss_graph_retained.py").read_text(encoding="utf-8")
    script = _tree(tmp_path, "train_sum.py", source)
    lines, _, err = _doctor_then_fix(tmp_path, script)
    assert lines["loss-graph-retained"] == _line(source, "loss.backward()")  # the rule points at the backward
    assert "gone loss-graph-retained; still there -; new -" in err, err
    kept = _line(source, "total_loss += loss")
    after = script.read_text(encoding="utf-8").splitlines()
    assert after[kept - 1] == "    total_loss += loss.item()"
    assert after[: kept - 1] + after[kept:] == [s for i, s in enumerate(source.splitlines(), 1) if i != kept]


def test_eval_under_no_grad_gets_eval_and_train_around_it(tmp_path: Path) -> None:
    source = (FIXTURES / "doctor" / "eval_in_train_mode.py").read_text(encoding="utf-8")
    script = _tree(tmp_path, "train_eval.py", source)
    lines, _, err = _doctor_then_fix(tmp_path, script)
    assert lines["eval-in-train-mode"] == _line(source, "acc = sum(")
    assert "gone eval-in-train-mode; still there -; new -" in err, err
    block = _line(source, "with torch.no_grad():")
    after = script.read_text(encoding="utf-8").splitlines()
    assert after[block - 1 : block + 2] == [
        "    model.eval()",
        "    with torch.no_grad():",
        source.splitlines()[block],
    ]
    assert after[block + 2] == "    model.train()"


TUTORIAL = '''"""A tutorial-style regression script: a model class with a feature scale and a stack of hidden
layers, a DataLoader over data sorted by target, a couple of epochs."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self, d_in, d_hidden, n_hidden):
        super().__init__()
        self.scale = torch.ones(d_in)  # feature scaling
        self.hidden = [nn.Linear(d_in if i == 0 else d_hidden, d_hidden) for i in range(n_hidden)]
        self.out = nn.Linear(d_hidden, 1)

    def forward(self, x):
        x = x * self.scale
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)


torch.manual_seed(0)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
order = y[:, 0].argsort()
train_loader = DataLoader(TensorDataset(x[order], y[order]), batch_size=32)
model = Regressor(8, 16, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
'''


def test_model_class_and_loader_fixes_in_a_tutorial_script(tmp_path: Path) -> None:
    script = _tree(tmp_path, "regress.py", TUTORIAL)
    lines, _, err = _doctor_then_fix(tmp_path, script)
    rules = ["module-in-plain-container", "tensor-attribute-not-registered", "train-loader-not-shuffled"]
    assert f"gone {', '.join(rules)}; still there -; new -" in err, err
    after = script.read_text(encoding="utf-8").splitlines()
    hidden, scale = _line(TUTORIAL, "self.hidden = ["), _line(TUTORIAL, "self.scale = ")
    loop, loader = (
        _line(TUTORIAL, "for xb, yb in train_loader:"),
        _line(TUTORIAL, "train_loader = DataLoader("),
    )
    assert (lines[rules[0]], lines[rules[1]], lines[rules[2]]) == (hidden, scale, loop)
    assert after[hidden - 1] == (
        "        self.hidden = nn.ModuleList([nn.Linear(d_in if i == 0 else d_hidden, d_hidden) for i in range(n_hidden)])"
    )
    assert after[scale - 1] == '        self.register_buffer("scale", torch.ones(d_in))  # feature scaling'
    assert after[loader - 1].endswith("batch_size=32, shuffle=True)")
    assert len(after) == len(TUTORIAL.splitlines())  # each edit in place, no line added or lost
