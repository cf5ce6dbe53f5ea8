"""The ``sdpa`` edit (fix/editors/attention.py) on attention in the styles people write, and the check
``--verify`` runs on it (fix/attention_check.py, here in-process): the patched class computes what the
original did, in train and eval mode with dropout off, and a patch that masks what the code did not
(is_causal=True pasted into a bidirectional block) is caught."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from torchscalpel.fix.attention_check import compare
from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit
from torchscalpel.fix.profile_plan import attention_plan
from torchscalpel.fix.verify_attention import rewritten
from torchscalpel.record import RunRecord

pytest.importorskip("libcst")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "op_patterns"
# fixture, the line of the scores, the attention class, its constructor's keywords, its inputs
STYLES = {
    "nanogpt": (
        "gpt_manual_attention.py",
        "q @ k.transpose",
        "CausalSelfAttention",
        (32, 4, 16),
        ((2, 16, 32),),
    ),
    "mingpt": ("mingpt_attention.py", "q @ k.transpose", "SelfAttention", (32, 4, 16), ((2, 16, 32),)),
    "vit": ("vit_attention.py", "q @ k.transpose", "Attention", (32, 4), ((2, 16, 32),)),
    "bert": (
        "bert_padding_attention.py",
        "torch.matmul(query_layer",
        "SelfAttention",
        (32, 4),
        ((2, 16, 32),),
    ),
}
BIDIRECTIONAL = {"vit", "bert"}


def _classes_only(path: Path) -> str:
    """The fixture's imports and classes, without its training loop."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tree.body = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom | ast.ClassDef)]
    return ast.unparse(tree) + "\n"


def _line(source: str, needle: str) -> int:
    return next(i for i, t in enumerate(source.splitlines(), 1) if needle in t)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _patched(tmp_path: Path, style: str) -> tuple[str, str]:
    name, needle, *_ = STYLES[style]
    source = _classes_only(FIXTURES / name)
    new, outcome = apply_edit(source, Edit(kind="sdpa", line=_line(source, needle)))
    assert outcome.status == "applied", outcome.reason
    return source, new


def _check(tmp_path: Path, style: str, source: str, patched: str) -> dict:
    _, _, cls_name, args, shapes = STYLES[style]
    original, twin = tmp_path / f"{style}_original.py", tmp_path / f"{style}_patched.py"
    original.write_text(source, encoding="utf-8")
    twin.write_text(patched, encoding="utf-8")
    (qualname, first), *_ = [r for r in rewritten(source, patched) if r[0].startswith(cls_name + ".")]
    module = _load(original, f"scalpel_test_{style}")
    torch.manual_seed(0)
    block = getattr(module, cls_name)(*args)
    inputs = tuple(torch.randn(*s) for s in shapes)
    if style == "bert":  # the key padding mask: the last 5 tokens of the second sequence are padding
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, 11:] = 0
        inputs = (*inputs, mask)
    spec = {"qualname": qualname, "patched": str(twin), "file": str(original), "first_line": first}
    return compare(spec, getattr(module, cls_name).forward, (block, *inputs), {})


@pytest.mark.parametrize("style", list(STYLES))
def test_the_patched_attention_gives_the_original_outputs(tmp_path, style):
    source, patched = _patched(tmp_path, style)
    assert "scaled_dot_product_attention(" in patched
    if style in BIDIRECTIONAL:
        assert "is_causal" not in patched
    else:
        assert "is_causal=True" in patched
    result = _check(tmp_path, style, source, patched)
    assert result["ok"], result
    assert result["max_abs_diff"] <= 1e-5 and result["modes"] == ["train", "eval"]
    assert result["sdpa_calls"] == 4  # two inputs, two modes: the patched forward went through the fused call
    again, outcome = apply_edit(patched, Edit(kind="sdpa", line=_line(source, STYLES[style][1])))
    assert outcome.status == "already" and again == patched


@pytest.mark.parametrize("style", sorted(BIDIRECTIONAL))
def test_is_causal_pasted_into_a_bidirectional_block_is_caught(tmp_path, style):
    source, patched = _patched(tmp_path, style)
    wrong = patched.replace("scale=", "is_causal=True, scale=", 1)
    wrong = wrong.replace(", attn_mask=padding_mask[:, None, None, :] != 0", "")
    result = _check(tmp_path, style, source, wrong)
    assert not result["ok"] and result["max_abs_diff"] > 1e-2
    assert "train mode" in " ".join(result["differs"]) and "eval mode" in " ".join(result["differs"])


def test_unreadable_attention_is_not_patched_and_gets_no_is_causal():
    source = _classes_only(FIXTURES / "vit_attention.py").replace(
        "attn = attn.softmax(dim=-1)", "attn = attn.softmax(dim=-1) * self.head_gate"
    )
    new, outcome = apply_edit(source, Edit(kind="sdpa", line=_line(source, "q @ k.transpose")))
    assert outcome.status == "refused" and new == source
    assert "cannot read this attention with certainty" in outcome.reason and "no is_causal" in outcome.reason


def test_library_attention_is_refused_and_the_users_is_planned():
    record = RunRecord(name="t")
    record.findings = [
        {
            "rule": "unfused-attention",
            "message": "attention computed op by op (matmul, softmax, matmul) in transformers/x.py:1-5 (library code), ...",
            "location": {"file": "/home/u/train.py", "line": 27},
            "fix": "attn_implementation='sdpa'",
        },
        {
            "rule": "unfused-attention",
            "message": "at model.py:52-56",
            "location": {"file": "/home/u/model.py", "line": 52},
        },
    ]
    record.findings.append(
        {"rule": "unfused-attention", "location": {"file": "/home/u/model.py", "line": "52; import os"}}
    )
    library, own, forged = attention_plan(record)
    assert forged.edit is None and forged.reason == "the finding names no line"  # a record is data
    assert library.edit is None and "installed package" in library.reason
    assert (
        own.edit == Edit(kind="sdpa", line=52)
        and own.file == Path("/home/u/model.py")
        and own.source == "profile"
    )


def test_the_functions_to_check_are_the_ones_the_patch_made_call_the_fused_attention():
    before = (
        "class A:\n    def forward(self, q, k, v):\n        return (q @ k.mT).softmax(-1) @ v\n\n"
        "def make():\n    def inner(q, k, v):\n        return (q @ k.mT).softmax(-1) @ v\n    return inner\n"
    )
    after = before.replace("(q @ k.mT).softmax(-1) @ v", "F.scaled_dot_product_attention(q, k, v, scale=1.0)")
    assert rewritten(before, after) == [("A.forward", 2), ("make.inner", 6)]
    assert rewritten(before, before.replace("class A:", "class A:  # a comment")) == []
