"""`scalpel profile` then `scalpel fix --verify` on attention written by hand in the styles people write
(nanoGPT with flash=False and its tril buffer, minGPT, a timm-style ViT block without a mask, a BERT-style
block with a key padding mask), each in its own git tree: the unfused-attention finding's fix and the
patch follow the mask the code applies (never is_causal=True for the bidirectional ones), the patch
replaces the statements from the scores to the weighted sum in the user's own attention, and --verify
finds the patched function's outputs equal to the original's in train and eval mode."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_cli

pytest.importorskip("libcst")

FIXTURES = REPO / "tests" / "fixtures" / "op_patterns"
CASES = {
    "nanogpt-flash-false": ("gpt_manual_attention.py", "q @ k.transpose", "y = att @ v"),
    "mingpt": ("mingpt_attention.py", "q @ k.transpose", "y = att @ v"),
    "vit-no-mask": ("vit_attention.py", "q @ k.transpose", "x = (attn @ v)"),
    "bert-padding-mask": ("bert_padding_attention.py", "torch.matmul(query_layer", "context = torch.matmul"),
}
CAUSAL = {"nanogpt-flash-false", "mingpt"}


def _tree(tmp_path: Path, source: Path) -> Path:
    """``source`` as ``train/NAME`` in a fresh git repository with one commit; the script's path."""
    root = tmp_path / "project"
    (root / "train").mkdir(parents=True)
    script = root / "train" / source.name
    script.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "."], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "init"], check=True)
    return script


def _line(text: str, needle: str) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_profile_then_fix_writes_the_fused_call_the_code_computes(tmp_path: Path, case: str) -> None:
    name, score, weighted = CASES[case]
    source = (FIXTURES / name).read_text(encoding="utf-8")
    script = _tree(tmp_path, FIXTURES / name)
    root = script.parents[1]
    run = tmp_path / "profile-run"
    done = run_cli("profile", "--no-report", "--steps", "8", "--out", str(run), "--", str(script), cwd=root)
    assert done.returncode == 0, done.stderr
    (finding,) = [
        f for f in json.loads((run / "run.json").read_text())["findings"] if f["rule"] == "unfused-attention"
    ]
    assert finding["location"]["line"] == _line(source, score)
    assert "scaled_dot_product_attention" in finding["fix"]
    assert ("is_causal=True" in finding["fix"]) == (case in CAUSAL), finding["fix"]

    patch = tmp_path / "fix.patch"
    fixed = run_cli("fix", str(run), "--verify", "--patch", str(patch), cwd=root)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    text = patch.read_text(encoding="utf-8")
    assert "scaled_dot_product_attention(" in text
    if case in CAUSAL:
        assert "is_causal=True" in text and "attn_mask" not in text
    else:
        assert "is_causal" not in text  # bidirectional: no causal mask anywhere in the patch
    if case == "bert-padding-mask":
        assert "attn_mask=padding_mask[:, None, None, :] != 0" in text  # True = take part
    # the statements from the scores to the weighted sum are gone from the user's attention
    removed = [
        line[1:].strip() for line in text.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    assert any(score in line for line in removed) and any(weighted in line for line in removed)
    verdict = re.search(
        r"verify: attention: (\S+) gives the original's outputs \(max abs diff (\S+),", fixed.stderr
    )
    assert verdict is not None, fixed.stderr
    assert float(verdict.group(2)) <= 1e-5
    assert "train and eval mode, dropout off" in fixed.stderr
    assert fixed.stderr.rstrip().split("\npage (the diff")[0].endswith("verify: verified"), fixed.stderr

    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
    again = run_cli("fix", str(run), cwd=root)  # idempotent: the patched file gives no diff
    assert again.returncode == 0 and "---" not in again.stdout, again.stdout + again.stderr
    assert "already done: unfused-attention" in again.stdout + again.stderr
