"""The observer interface: how stages (doctor rules, plan, tune) see what the runtime sees.

The runtime installs PyTorch's global hooks once and fans every event out to its observers, in
order. Observers must be cheap (they run inside the user's step) and must not raise; an observer
that raises is disabled and its error recorded in the Run record's notes, never the user's run.

Every method has a do-nothing default, so an observer overrides only what it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

    from torchscalpel.record import RunRecord, StepRecord
    from torchscalpel.runtime.session import Session


class Observer:
    """Base class: override the events you need. ``name`` appears in error notes."""

    name: str = "observer"

    def on_start(self, session: Session) -> None:
        """Hooks are installed; the script is about to run."""

    def on_forward_pre(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool
    ) -> None:
        """Any module's forward is about to run; ``root`` is True for the outermost call."""

    def on_forward_post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, root: bool
    ) -> None:
        """Any module's forward returned ``output``."""

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """``Tensor.backward`` / ``torch.autograd.backward`` was called on ``tensors`` (the loss)."""

    def on_backward_post(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Backward returned."""

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` is about to run."""

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` returned."""

    def on_batch(self, batch: Any, loader: Any) -> None:
        """A DataLoader iterator returned ``batch``; ``loader`` is the DataLoader when known."""

    def on_step_end(self, step: StepRecord) -> None:
        """A step was closed and its timings are final."""

    def on_script_error(self, exc: BaseException) -> None:
        """The script failed with ``exc`` (its own exception, or ``SystemExit`` with a non-zero code);
        sent once, before :meth:`on_finish`. Keep what you need from it, not ``exc`` itself: its
        traceback holds the script's frames and every tensor they refer to."""

    def on_finish(self, record: RunRecord) -> None:
        """The script ended (completed, stopped, crashed or interrupted); add to ``record`` here."""


ObserverT = TypeVar("ObserverT", bound=Observer)


def listeners_by_event(observers: Sequence[ObserverT]) -> dict[str, list[ObserverT]]:
    """Per ``on_*`` event, the observers whose class overrides it, in order.

    Dispatching only to these keeps an event nobody listens to free: the forward events fire on
    every module call.
    """
    return {
        name: [o for o in observers if getattr(type(o), name) is not getattr(Observer, name)]
        for name in dir(Observer)
        if name.startswith("on_")
    }
