"""rankfacts' per-step random-stream digest: a DataLoader's per-epoch seed draw is not a draw of the step."""

from __future__ import annotations

from pathlib import Path

import torch

from torchscalpel.runtime.rankfacts import RankFacts


def test_a_loaders_epoch_seed_draw_between_steps_is_left_out(tmp_path: Path) -> None:
    facts = RankFacts(tmp_path, 0, 1, 0)
    facts.on_step()
    torch.rand(1)  # what DataLoader.__iter__ draws for its workers' base seed
    facts.on_loader_iter()
    facts.on_step()
    assert facts.data["rng"] is not None and "torch" not in facts.data["rng"]


def test_a_draw_inside_the_step_still_counts(tmp_path: Path) -> None:
    facts = RankFacts(tmp_path, 0, 1, 0)
    facts.on_step()
    facts.on_loader_iter()
    torch.nn.functional.dropout(torch.ones(8), 0.5)  # the step's own randomness, after the batch came
    facts.on_step()
    assert "torch" in facts.data["rng"]
