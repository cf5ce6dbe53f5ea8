"""Per-submodule forward time (opt-in): which region of the model is hottest.

Tune reads this to compile the hottest submodules first. Submodules are named by their path
under the root module (``blocks.0.mlp``, what ``get_submodule`` takes: tune compiles by it) and, for
people, by that path without wrapper segments (``shown``: Fabric's ``_forward_module``, DDP's
``module``, compile's ``_orig_mod``; :func:`runtime.module_names.user_path`), down to :data:`MAX_DEPTH`
levels of the shown path; deeper calls are inside their parent's time. Only measured (non-warm-up)
steps count.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.runtime.module_names import user_path
from torchscalpel.runtime.observer import Observer

if TYPE_CHECKING:
    from torchscalpel.record import StepRecord
    from torchscalpel.runtime.clock import Clock
    from torchscalpel.runtime.session import Session

MAX_DEPTH = 3


class ModuleTimes(Observer):
    """Times every named submodule's forward with the session clock."""

    name = "module-times"

    def __init__(self) -> None:
        self.session: Session | None = None
        self._names: dict[int, tuple[str, str, int]] = {}
        self._shown: dict[str, str] = {}
        # Each mark is kept with the clock that made it: the session switches clocks when the
        # model reaches a GPU, and marks of two clocks cannot be subtracted.
        self._stack: list[tuple[int, Clock, Any]] = []
        self._pending: list[tuple[int, Clock, Any, Any]] = []
        self._ms: dict[str, float] = defaultdict(float)
        self._calls: dict[str, int] = defaultdict(int)
        self._meta: dict[str, tuple[str, int]] = {}

    def on_start(self, session: Session) -> None:
        self.session = session

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root and id(module) not in self._names:
            for qual, sub in module.named_modules():
                shown = user_path(module, qual)
                depth = shown.count(".") + 1 if shown else 0  # wrappers do not use up the depth
                if depth <= MAX_DEPTH and id(sub) not in self._names:
                    params = sum(p.numel() for p in sub.parameters(recurse=True))
                    self._names[id(sub)] = (qual or "<root>", type(sub).__name__, params)
                    self._shown[qual or "<root>"] = shown or "<root>"
        if id(module) in self._names and self.session is not None:
            clock = self.session.timeline.clock
            self._stack.append((id(module), clock, clock.mark()))

    def on_forward_post(
        self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any, root: bool
    ) -> None:
        if self._stack and self._stack[-1][0] == id(module) and self.session is not None:
            mid, clock, start = self._stack.pop()
            if clock is self.session.timeline.clock:
                self._pending.append((mid, clock, start, clock.mark()))

    def on_step_end(self, step: StepRecord) -> None:
        pending, self._pending = self._pending, []
        if step.warmup or self.session is None:
            return
        for mid, clock, a, b in pending:
            qual, kind, params = self._names[mid]
            self._ms[qual] += clock.elapsed_ms(a, b)
            self._calls[qual] += 1
            self._meta[qual] = (kind, params)

    def table(self) -> list[dict[str, Any]]:
        """Rows sorted by total forward time, hottest first."""
        rows = [
            {
                "name": qual,
                "shown": self._shown.get(qual, qual),
                "type": self._meta[qual][0],
                "params": self._meta[qual][1],
                "calls": self._calls[qual],
                "forward_ms": round(ms, 4),
            }
            for qual, ms in self._ms.items()
        ]
        return sorted(rows, key=lambda r: r["forward_ms"], reverse=True)
