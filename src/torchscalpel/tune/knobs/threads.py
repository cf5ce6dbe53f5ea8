"""CPU thread knob: ``torch.set_num_threads`` (intra-op parallelism)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchscalpel.tune.knobs.base import EXACT, ApplyLog, Knob, SetupHook, Undo
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


class ThreadsKnob(Knob):
    """Use every CPU this process may run on for intra-op parallelism (or fewer, when that is faster)."""

    name = "threads"
    numerics = EXACT
    description = "torch.set_num_threads"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.threads is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if facts.device != "cpu":
            return [], "the model runs on a GPU; CPU threads hardly matter"
        if facts.cpu_count <= 1:
            return [], "only one CPU is available"
        if facts.torch_threads >= facts.cpu_count:
            return [], f"torch already uses all {facts.cpu_count} CPUs"
        return [TuneSettings(threads=facts.cpu_count)], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        value = settings.threads
        if value is None:
            return None

        def hook() -> Undo:
            before = torch.get_num_threads()
            torch.set_num_threads(value)
            log.did(self.name, f"torch threads {before} -> {value}")
            return lambda: torch.set_num_threads(before)

        return hook

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.threads is None:
            return []
        return [f"torch.set_num_threads({settings.threads})"]
