"""The one definition of a repeated block (torchscalpel.blocks), on the model shapes users write."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchscalpel.blocks import block_classes, calls_from_rows, find_blocks


class MLP(nn.Module):  # minGPT keeps the MLP in a ModuleDict inside each Block
    def __init__(self, d: int) -> None:
        super().__init__()
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(d, 4 * d), c_proj=nn.Linear(4 * d, d), act=nn.GELU()))

    def forward(self, x):
        m = self.mlp
        return m.c_proj(m.act(m.c_fc(x)))


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
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(8, d), drop=nn.Dropout(0.0),
            h=nn.ModuleList([MinBlock(d) for _ in range(n_layer)]), ln_f=nn.LayerNorm(d)))
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
        self.attn, self.mlp = nn.Linear(d, d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT, with a vocabulary large enough that the two Embeddings hold many parameters."""

    def __init__(self, n_layer: int = 2, d: int = 16, vocab: int = 500) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(vocab, d), drop=nn.Dropout(0.0),
            h=nn.ModuleList([NanoBlock(d) for _ in range(n_layer)]), ln_f=nn.LayerNorm(d)))
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
        self.downsample = (nn.Sequential(nn.Conv2d(c // stride, c, 1, stride, bias=False), nn.BatchNorm2d(c))
                           if stride != 1 else None)

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
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def names(model, calls=None):
    return [n for n, _ in find_blocks(model, calls)]


def test_mingpt_block_not_moduledict():
    model = MinGPT()
    assert block_classes(model) == [MinBlock]
    assert names(model) == [f"transformer.h.{i}" for i in range(3)]


def test_nanogpt_block_not_the_embeddings():
    model = NanoGPT()
    assert block_classes(model) == [NanoBlock]
    assert names(model) == ["transformer.h.0", "transformer.h.1"]


def test_hf_llama_decoder_layer():
    model = tiny_llama()
    assert [c.__name__ for c in block_classes(model)] == ["LlamaDecoderLayer"]
    assert names(model) == ["model.layers.0", "model.layers.1"]


def test_sequential_of_blocks_and_flat_mlp():
    seq = nn.Sequential(nn.Linear(16, 16), MinBlock(16), MinBlock(16), nn.Linear(16, 4))
    assert names(seq) == ["1", "2"]
    mlp = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    assert names(mlp) == ["0", "2", "4"]
    assert find_blocks(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))) == []
    assert find_blocks(nn.Linear(3, 3)) == []


def test_resnet_like_basic_blocks():
    model = ResNetLike()
    assert block_classes(model) == [BasicBlock]
    assert names(model) == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]


def test_modulelist_of_sequentials_is_the_stack_idiom():
    layers = nn.ModuleList([nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4)) for _ in range(3)])
    root = nn.Module()
    root.layers = layers
    assert names(root) == ["layers.0", "layers.1", "layers.2"]


def test_never_returns_a_container():
    containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList, nn.ParameterDict)
    for model in (MinGPT(), NanoGPT(), ResNetLike(), tiny_llama()):
        assert not any(type(m) in containers for _, m in find_blocks(model))


def test_encoder_decoder_two_stacks():
    class Enc(MinBlock):
        pass

    class Dec(MinBlock):
        def __init__(self, d: int) -> None:
            super().__init__(d)
            self.cross = nn.Linear(d, d)

    root = nn.Module()
    root.encoder = nn.ModuleList([Enc(16) for _ in range(2)])
    root.decoder = nn.ModuleList([Dec(16) for _ in range(2)])
    assert block_classes(root) == [Enc, Dec]
    assert names(root) == ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]


def test_call_counts_exclude_never_called_classes():
    class TwoStacks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.ModuleList([MinBlock(32) for _ in range(2)])  # built but never called
            self.used = nn.ModuleList([NanoBlock(8) for _ in range(2)])

        def forward(self, x):
            for b in self.used:
                x = b(x)
            return x

    model = TwoStacks()
    assert block_classes(model) == [MinBlock, NanoBlock]  # statically both stacks are blocks...
    rows = [{"name": "<root>", "calls": 1}, {"name": "used", "calls": 0},
            {"name": "used.0", "calls": 1}, {"name": "used.1", "calls": 1}]
    assert block_classes(model, calls_from_rows(rows)) == [NanoBlock]  # ...but only NanoBlock ran
    assert calls_from_rows([]) is None
    # blocks deeper than anything timed keep the static answer
    assert block_classes(MinGPT(), {"<root>": 1, "lm_head": 1}) == [MinBlock]
    # Bert-like depth: blocks at depth 4 under containers, timed to depth 3 (containers never run)
    bert = nn.Module()
    bert.bert = nn.Module()
    bert.bert.encoder = nn.Module()
    bert.bert.encoder.layer = nn.ModuleList([NanoBlock(8) for _ in range(2)])
    timed = {"<root>": 1, "bert": 1, "bert.encoder": 1}
    assert block_classes(bert, timed) == [NanoBlock]
    assert block_classes(bert, {"<root>": 1, "bert": 1, "bert.encoder": 0}) == []
    assert find_blocks(MinGPT(), {"<root>": 1, "transformer.h.0": 1, "lm_head": 1}) == []


def test_shared_instance_counts_once():
    shared = ResNetLike().layer1[0]
    root = nn.Module()
    root.layers = nn.ModuleList([shared, shared])
    assert find_blocks(root) == []  # one module called twice is not two blocks


def test_forward_runs_on_the_models():
    # the fixtures are real models: their forward calls the blocks the definition names
    MinGPT()(torch.zeros(1, 4, dtype=torch.long))
    NanoGPT()(torch.zeros(1, 4, dtype=torch.long))
    ResNetLike()(torch.randn(1, 3, 8, 8))
