"""Three small models on synthetic, learnable data, shared by the plain-loop and the Lightning
versions of each corpus script (same model, same data, same seed): the LR finder comparison."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 0
BATCH = 32


class MLP(nn.Module):
    """A 20-feature, 4-class classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two conv blocks on 1x16x16 images, 4 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyLM(nn.Module):
    """A 2-layer causal transformer over a 32-token vocabulary."""

    VOCAB, SEQ, DIM = 32, 32, 32

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.DIM)
        self.pos = nn.Parameter(torch.randn(self.SEQ, self.DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(self.DIM, 4, 64, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(self.DIM, self.VOCAB)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(self.SEQ), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.blocks(h, mask=self.mask, is_causal=True))


def make_data(kind: str, batches: int) -> TensorDataset:
    """``batches`` * BATCH samples, from a generator seeded apart from the model's initialisation."""
    return make_split(kind, batches, 0)[0]


def make_split(kind: str, batches: int, held_out: int) -> tuple[TensorDataset, TensorDataset]:
    """The training set of :func:`make_data` and ``held_out`` more samples of the same task (the same
    weights, templates or chain), drawn after it from the same generator: the training set is the same
    whatever ``held_out`` is."""
    g = torch.Generator().manual_seed(1234)
    n = batches * BATCH
    if kind == "mlp":
        x = torch.randn(n, 20, generator=g)
        w = torch.randn(20, 4, generator=g)
        xh = torch.randn(held_out, 20, generator=g)
        return TensorDataset(x, (x @ w).argmax(1)), TensorDataset(xh, (xh @ w).argmax(1))
    if kind == "cnn":
        x = torch.randn(n, 1, 16, 16, generator=g)
        templates = torch.randn(4, 1, 16, 16, generator=g)
        xh = torch.randn(held_out, 1, 16, 16, generator=g)

        def label(v: torch.Tensor) -> torch.Tensor:
            return torch.einsum("nchw,kchw->nk", v, templates).argmax(1)

        return TensorDataset(x, label(x)), TensorDataset(xh, label(xh))
    if kind == "lm":
        # random tokens from a fixed random bigram chain: each token has a few likely successors
        logits = torch.randn(TinyLM.VOCAB, TinyLM.VOCAB, generator=g) * 3
        probs = logits.softmax(1)

        def chain(m: int) -> TensorDataset:
            seq = torch.empty(m, TinyLM.SEQ + 1, dtype=torch.long)
            seq[:, 0] = torch.randint(0, TinyLM.VOCAB, (m,), generator=g)
            for t in range(TinyLM.SEQ):
                seq[:, t + 1] = torch.multinomial(probs[seq[:, t]], 1, generator=g).squeeze(1)
            return TensorDataset(seq[:, :-1], seq[:, 1:])

        train = chain(n)
        return train, chain(held_out)
    raise ValueError(f"unknown corpus model {kind!r}")


def build(kind: str) -> nn.Module:
    """The model, initialised from SEED (call right after seeding, in both versions)."""
    torch.manual_seed(SEED)
    return {"mlp": MLP, "cnn": SmallCNN, "lm": TinyLM}[kind]()


def make_optimizer(kind: str, params, lr: float = 1e-3) -> torch.optim.Optimizer:
    """SGD with momentum for the MLP, Adam for the CNN and the LM."""
    if kind == "mlp":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)


def loss_of(kind: str, model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    out = model(x)
    if kind == "lm":
        return nn.functional.cross_entropy(out.reshape(-1, TinyLM.VOCAB), y.reshape(-1))
    return nn.functional.cross_entropy(out, y)


def loader(kind: str, batches: int) -> DataLoader:
    """In order (no shuffle): both versions see the same batches in the same order."""
    return DataLoader(make_data(kind, batches), batch_size=BATCH, shuffle=False)
