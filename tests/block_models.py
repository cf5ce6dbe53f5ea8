"""Models shaped the way users write them, for the block definition's tests (tests/unit/test_blocks.py,
tests/unit/test_block_units.py): minGPT, nanoGPT, a ResNet without torchvision, a tiny HF Llama."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class MinBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Linear(d, d)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(d, 4 * d), c_proj=nn.Linear(4 * d, d), act=nn.GELU()))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))


class MinGPT(nn.Module):
    """minGPT: ModuleDict -> ModuleList -> Block, and ModuleDicts inside every Block."""

    def __init__(self, n_layer: int = 3, d: int = 16, vocab: int = 50) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, d),
                wpe=nn.Embedding(8, d),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([MinBlock(d) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(d),
            )
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


class NanoBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.mlp = (
            nn.Linear(d, d),
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT, with a vocabulary large enough that the two Embeddings hold many parameters."""

    def __init__(self, n_layer: int = 2, d: int = 16, vocab: int = 500) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, d),
                wpe=nn.Embedding(vocab, d),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([NanoBlock(d) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(d),
            )
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT does

    def forward(self, idx):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


class BasicBlock(nn.Module):
    def __init__(self, c: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c // stride, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = (
            nn.Sequential(nn.Conv2d(c // stride, c, 1, stride, bias=False), nn.BatchNorm2d(c))
            if stride != 1
            else None
        )

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + idt)


class ResNetLike(nn.Module):
    """torchvision's ResNet layout without torchvision: stem, Sequential stages of BasicBlocks, head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.layer2 = nn.Sequential(BasicBlock(16, 2), BasicBlock(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(torch.relu(self.bn1(self.conv1(x)))))
        return self.fc(x.mean((2, 3)))


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config)
