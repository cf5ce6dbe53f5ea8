"""channels_last knob: NHWC memory format for conv nets (the model and its 4-D inputs).

Numerics class "close", not "exact": oneDNN picks other convolution kernels for NHWC, whose float32
sums run in another order. Seen on digits_cnn: a 1.6e-4 relative loss deviation over 10 steps,
which the exact class's 1e-4 rejected although nothing but the summation order had changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import CLOSE, ApplyLog, Knob, RootHooks, SetupHook, Undo

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts
    from torchscalpel.tune.settings import TuneSettings


class ChannelsLastKnob(Knob):
    """Convert conv models and their image inputs to ``torch.channels_last``."""

    name = "channels_last"
    numerics = CLOSE
    description = "channels_last memory format for conv nets"

    def is_set(self, settings: TuneSettings) -> bool:
        return bool(settings.channels_last)

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        from torchscalpel.tune.settings import TuneSettings

        if not facts.has_conv:
            return [], "the model has no Conv2d layers"
        return [TuneSettings(channels_last=True)], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if not settings.channels_last:
            return None
        return lambda: install_channels_last(log)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if not settings.channels_last:
            return []
        return [
            "model = model.to(memory_format=torch.channels_last)",
            "images = images.to(memory_format=torch.channels_last)  # each 4-D input batch",
        ]


def install_channels_last(log: ApplyLog) -> Undo:
    """Convert each conv model once (first call) and every 4-D tensor input on every call."""
    converted: set[int] = set()

    def pre(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if id(module) not in converted:
            converted.add(id(module))
            if not any(isinstance(m, torch.nn.Conv2d) for m in module.modules()):
                log.skip("channels_last", f"{type(module).__name__} has no Conv2d layers")
                return None
            module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented; not in torch's overloads
            log.did("channels_last", f"{type(module).__name__} -> channels_last")
        return tuple(
            a.contiguous(memory_format=torch.channels_last)
            if isinstance(a, torch.Tensor) and a.dim() == 4
            else a
            for a in args
        )

    return RootHooks(on_pre=pre).install()
