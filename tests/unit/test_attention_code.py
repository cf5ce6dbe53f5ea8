"""Reading hand-written attention from its code (trace/attention_code.py): the fused call that computes the
same follows the mask the code applies, is_causal=True only for a mask that is causal with certainty, and
code that cannot be read is refused with its line, never guessed causal."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from torchscalpel.trace.attention_code import Unread, read_attention
from torchscalpel.trace.op_events import OpEvent, PassFacts
from torchscalpel.trace.patterns import find_patterns

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "op_patterns"


def _read(source: str, needle: str = "q @ k.transpose"):
    source = textwrap.dedent(source)
    line = next(i for i, t in enumerate(source.splitlines(), 1) if needle in t)
    return read_attention(source, line)


def _call(source: str, needle: str = "q @ k.transpose") -> str:
    return _read(source, needle).statement_text()


HEAD = """\
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


"""


def test_nanogpt_tril_buffer_is_causal_with_its_dropout_and_default_scale():
    code = _read((FIXTURES / "gpt_manual_attention.py").read_text())
    assert code.mask is not None and code.mask.kind == "causal"
    assert code.function == "CausalSelfAttention.forward"
    assert code.statement_text() == (
        "y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, "
        "is_causal=True)"
    )
    assert "torch.tril" in code.mask_text() and "is_causal=True" in code.mask_text()


def test_mingpt_mask_buffer_is_causal():
    assert _call((FIXTURES / "mingpt_attention.py").read_text()) == (
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"
    )


def test_vit_block_without_a_mask_is_bidirectional_with_its_own_scale():
    code = _read((FIXTURES / "vit_attention.py").read_text())
    assert code.mask is None and "bidirectional" in code.mask_text()
    text = code.statement_text()
    assert "is_causal" not in text and "attn_mask" not in text
    assert text == (
        "x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0, "
        "scale=self.scale).transpose(1, 2).reshape(B, N, C)"
    )


def test_key_padding_mask_is_passed_negated_as_a_boolean_attn_mask():
    code = _read((FIXTURES / "bert_padding_attention.py").read_text(), "torch.matmul(query_layer")
    assert code.mask is not None and code.mask.kind == "boolean"
    text = code.statement_text()
    assert "is_causal" not in text
    assert "attn_mask=padding_mask[:, None, None, :] != 0" in text  # True = take part
    assert "scale=1.0 / math.sqrt(self.head_size)" in text


BERT_ADDITIVE = (
    HEAD
    + """\
class BertSelfAttention(nn.Module):
    def forward(self, query_layer, key_layer, value_layer, attention_mask=None):
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(query_layer.size(-1))
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = F.dropout(attention_probs, p=0.1, training=self.training)
        return torch.matmul(attention_probs, value_layer)
"""
)


def test_an_additive_mask_under_its_none_test_is_attn_mask_as_is():
    code = _read(BERT_ADDITIVE, "torch.matmul(query_layer")
    assert code.mask is not None and code.mask.kind == "additive"
    assert code.statement_text() == (
        "return nn.functional.scaled_dot_product_attention(query_layer, key_layer, value_layer, "
        "attn_mask=attention_mask, dropout_p=0.1 if self.training else 0.0)"
    )


@pytest.mark.parametrize(
    ("mask_lines", "causal"),
    [
        # a local tril, negated
        (
            [
                "mask = torch.tril(torch.ones(T, T, dtype=torch.bool))",
                "att = att.masked_fill(~mask, float('-inf'))",
            ],
            True,
        ),
        # the upper triangle above the diagonal, taken as is, in place
        (["mask = torch.triu(torch.ones(T, T), diagonal=1).bool()", "att.masked_fill_(mask, -1e9)"], True),
        # built in place, as a method
        (["mask = None", "att = att.masked_fill(torch.ones(T, T).tril() == 0, float('-inf'))"], True),
        # an additive -inf triangle
        (["mask = torch.triu(torch.full((T, T), float('-inf')), diagonal=1)", "att = att + mask"], True),
        (["mask = nn.Transformer.generate_square_subsequent_mask(T)", "att = att + mask"], True),
        # a tril kept where it is 1: the past is masked, not the future
        (["mask = torch.tril(torch.ones(T, T)).bool()", "att = att.masked_fill(mask, float('-inf'))"], False),
        # the diagonal of triu kept: not SDPA's causal mask
        (["mask = torch.triu(torch.ones(T, T)).bool()", "att = att.masked_fill(mask, float('-inf'))"], False),
        # a window of rows, not the top-left corner
        (
            [
                "mask = torch.tril(torch.ones(T, T))",
                "att = att.masked_fill(mask[T - 4:, :] == 0, float('-inf'))",
            ],
            False,
        ),
        # a tril changed in place after it is built
        (
            [
                "mask = torch.tril(torch.ones(T, T)); mask[0, 1] = 1.0",
                "att = att.masked_fill(mask == 0, -1e9)",
            ],
            False,
        ),
        # not square
        (
            ["mask = torch.tril(torch.ones(T, 2 * T))", "att = att.masked_fill(mask == 0, float('-inf'))"],
            False,
        ),
    ],
)
def test_causal_only_with_certainty(mask_lines, causal):
    body = "\n".join(f"        {line}" for line in mask_lines)
    source = HEAD + (
        f"class A(nn.Module):\n    def forward(self, q, k, v):\n        T = q.size(-2)\n{body}\n"
    )
    # the mask is built before the scores; the scores statement goes between the two mask lines
    lines = source.splitlines()
    build = next(i for i, t in enumerate(lines) if "mask = " in t)
    lines[build + 1 : build + 1] = ["        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))"]
    lines += ["        att = F.softmax(att, dim=-1)", "        return att @ v"]
    code = _read("\n".join(lines) + "\n")
    assert code.mask is not None
    text = code.statement_text()
    assert ("is_causal=True" in text) is causal, text
    assert ("attn_mask" in text) is not causal, text
    assert "scale=" not in text  # 1/sqrt(k.size(-1)) is SDPA's default


BUFFER = (
    HEAD
    + """\
class A(nn.Module):
    def __init__(self, n, causal=True):
        super().__init__()
        self.causal = causal
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = q @ k.transpose(-2, -1)
        {line}
        att = att.softmax(-1)
        return att @ v
"""
)


def test_a_causal_mask_under_an_if_is_a_conditional_attn_mask_not_is_causal():
    source = BUFFER.replace(
        "{line}",
        "if self.causal:\n            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))",
    )
    text = _call(source)
    assert "is_causal" not in text
    assert "attn_mask=self.bias[:, :, :T, :T] != 0 if self.causal else None" in text
    assert "scale=1.0" in text  # the code does not scale: SDPA's default would


def test_a_buffer_set_twice_is_not_read_as_causal():
    source = BUFFER.replace(
        "{line}", "att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))"
    ).replace("        self.causal = causal\n", "        self.causal = causal\n        self.bias = None\n")
    text = _call(source)
    assert "is_causal" not in text and "attn_mask=self.bias[:, :, :T, :T] != 0" in text


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("att = att.masked_fill(self.bias[:, :, :T, :T] == 0, 0.0)", "not -inf"),
        ("att = alibi(att)", "fix cannot read what"),
        ("att = att - 1", "fix cannot read what"),
        (
            "att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))\n"
            "        att = att.masked_fill(q.sum(-1, keepdim=True) == 0, float('-inf'))",
            "masked twice",
        ),
        ("T = T + 1", "does not use 'att'"),
    ],
)
def test_what_cannot_be_read_is_refused_with_its_line(line, reason):
    with pytest.raises(Unread, match=reason):
        _read(BUFFER.replace("{line}", line))


def test_weights_read_after_the_weighted_sum_or_changed_after_the_softmax_are_refused():
    annotated = HEAD + textwrap.dedent(
        """\
        def attention(query, key, value, mask=None):
            d_k = query.size(-1)
            scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            p_attn = scores.softmax(dim=-1)
            return torch.matmul(p_attn, value), p_attn
        """
    )
    with pytest.raises(Unread, match="besides the weighted sum"):
        _read(annotated, "torch.matmul(query, key")
    head_mask = BERT_ADDITIVE.replace(
        "        return torch.matmul",
        "        attention_probs = attention_probs * self.head_mask\n        return torch.matmul",
    )
    with pytest.raises(Unread, match="after the softmax"):
        _read(head_mask, "torch.matmul(query_layer")


def _attention_events(file: str, first: int, last: int) -> list[OpEvent]:
    def ev(name: str, line: int, start: float, shapes=()) -> OpEvent:
        return OpEvent(
            name=name, site=f"{file}:{line}", start_us=start, self_us=100.0, total_us=100.0, shapes=shapes
        )

    return [
        ev("aten::matmul", first, 0, ((8, 4, 16, 16), (8, 4, 16, 16))),
        ev("aten::softmax", first + 1, 10, ((8, 4, 16, 16),)),
        ev("aten::matmul", last, 20, ((8, 4, 16, 16), (8, 4, 16, 16))),
    ]


def test_the_profile_finding_gives_the_call_the_code_computes(tmp_path):
    vit = tmp_path / "vit.py"
    vit.write_text((FIXTURES / "vit_attention.py").read_text())
    source = vit.read_text()
    first = next(i for i, t in enumerate(source.splitlines(), 1) if "q @ k.transpose" in t)
    last = next(i for i, t in enumerate(source.splitlines(), 1) if "(attn @ v)" in t)
    (finding,) = find_patterns(_attention_events(str(vit), first, last), PassFacts(step_us=10_000.0))
    assert finding.rule == "unfused-attention"
    assert (
        "scaled_dot_product_attention(q, k, v, dropout_p=" in finding.fix and "is_causal" not in finding.fix
    )
    assert any("no mask: the attention is bidirectional" in e for e in finding.evidence)


def test_an_unreadable_mask_gives_no_is_causal_in_the_advice(tmp_path):
    script = tmp_path / "model.py"
    source = BUFFER.replace("{line}", "att = alibi(att)")
    script.write_text(source)
    first = next(i for i, t in enumerate(source.splitlines(), 1) if "q @ k.transpose" in t)
    (finding,) = find_patterns(_attention_events(str(script), first, first + 3), PassFacts(step_us=10_000.0))
    assert "scaled_dot_product_attention" in finding.fix
    assert "is_causal=True only if" in finding.fix and "is_causal=True)" not in finding.fix
    assert any(e.startswith("mask: not read:") for e in finding.evidence)
    assert ast.parse(source)  # the source itself is fine: it is the mask that is not read
