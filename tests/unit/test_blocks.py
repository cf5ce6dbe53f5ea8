"""The one definition of a repeated block (torchscalpel.blocks), on the model shapes users write."""

from __future__ import annotations

import torch
from torch import nn

from block_models import BasicBlock, MinBlock, MinGPT, NanoBlock, NanoGPT, ResNetLike, tiny_llama
from torchscalpel.blocks import block_classes, calls_from_rows, find_blocks


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
    rows = [
        {"name": "<root>", "calls": 1},
        {"name": "used", "calls": 0},
        {"name": "used.0", "calls": 1},
        {"name": "used.1", "calls": 1},
    ]
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
