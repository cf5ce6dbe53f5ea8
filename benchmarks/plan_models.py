"""Model factories for benchmarks/plan_accuracy.py (and usable as ``--model benchmarks/plan_models.py:NAME``).

Four families a plan must get right: an MLP, a CNN with batch norm, a GPT-style transformer LM using
scaled_dot_product_attention, and a transformers LlamaForCausalLM from a tiny config with random
weights (nothing downloaded); plus two the plan was not tuned on: an LSTM LM and a transformers T5
encoder-decoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(width: int = 1024, depth: int = 4, classes: int = 10, inputs: int = 784) -> nn.Module:
    """A ReLU MLP classifier."""
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class _Res(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class CNN(nn.Module):
    """A small ResNet: stem, residual stages, pooled linear head."""

    def __init__(self, width: int = 32, blocks: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(*[_Res(width) for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def cnn(width: int = 32, blocks: int = 4, classes: int = 10) -> nn.Module:
    """The small ResNet."""
    return CNN(width, blocks, classes)


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-style decoder LM: token + position embeddings, pre-norm blocks, untied head."""

    def __init__(
        self, vocab: int = 8192, d: int = 256, layers: int = 4, heads: int = 4, ctx: int = 256
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.layers = nn.ModuleList([_Block(d, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def gpt(vocab: int = 8192, d: int = 256, layers: int = 4, heads: int = 4, ctx: int = 256) -> nn.Module:
    """The GPT-style LM."""
    return GPT(vocab, d, layers, heads, ctx)


def llama(
    vocab: int = 8192, hidden: int = 256, layers: int = 2, heads: int = 4, intermediate: int = 688
) -> nn.Module:
    """transformers' LlamaForCausalLM from a tiny config, random weights, SDPA attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    config.use_cache = False
    return LlamaForCausalLM(config)


class LSTMLM(nn.Module):
    """A 2-layer LSTM language model (oneDNN's fused RNN kernel on CPU)."""

    def __init__(self, vocab: int = 1000, d: int = 128, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(idx))[0])


def lstm(vocab: int = 1000, d: int = 128, hidden: int = 256, layers: int = 2) -> nn.Module:
    """The LSTM LM."""
    return LSTMLM(vocab, d, hidden, layers)


def t5(vocab: int = 4000, d: int = 128, layers: int = 2, heads: int = 4, d_ff: int = 512) -> nn.Module:
    """transformers' T5ForConditionalGeneration from a tiny config, random weights."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=vocab,
        d_model=d,
        num_layers=layers,
        num_heads=heads,
        d_ff=d_ff,
        d_kv=d // heads,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return T5ForConditionalGeneration(config)
