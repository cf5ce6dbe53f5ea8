"""What ``scalpel memory`` and ``torchscalpel.memory`` are asked: one frozen, validated object.

The window rule lives here once: by default :data:`~torchscalpel.runtime.window.MEMORY_WINDOW`'s steps, or every
step under a memory limit (growth that crosses the limit late still gets its post-mortem and fix ladder).
Torch-free: the CLI builds it before torch loads.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torchscalpel.errors import ArgumentError, literal
from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import MEMORY_WINDOW, check_window

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryOptions(StageOptions):
    """A memory run: its window, the limit that ends it, and what the report adds."""

    steps: int | Literal["default"] | None = "default"
    """Measured steps; ``"default"``: :data:`~torchscalpel.runtime.window.MEMORY_WINDOW`'s, or every step
    under ``memory_limit``; None: every step (until the script ends or crosses the limit)."""
    warmup: int = MEMORY_WINDOW.warmup
    memory_limit: int | None = None
    """Bytes of live tensors past which the run stops with a post-mortem (``--memory-limit``)."""
    until_eval: bool = False
    """After the window, keep measuring until the script's first evaluation has ended (``--until-eval``)."""
    plan: bool = True
    """Put the plan's numbers in the fix ladder (``--no-plan``: False)."""
    step_kind: str = MEMORY_WINDOW.step_kind
    step_timeout_s: float | None = MEMORY_WINDOW.step_timeout_s

    def __post_init__(self) -> None:
        if isinstance(self.steps, str) and self.steps != "default":
            raise ArgumentError(
                "{steps} must be a number, None or 'default', got " + literal(repr(self.steps))
            )
        if self.memory_limit is not None and (
            isinstance(self.memory_limit, bool)
            or not isinstance(self.memory_limit, int)
            or self.memory_limit < 1
        ):
            raise ArgumentError(
                "{memory_limit} must be a size of at least 1 byte, got " + literal(repr(self.memory_limit))
            )
        check_window(
            warmup=self.warmup,
            steps=self.steps if isinstance(self.steps, int) else None,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
        )

    @property
    def window_steps(self) -> int | None:
        """The measured steps the window asks for (None: every step). The one place the default is decided."""
        if self.steps == "default":
            return None if self.memory_limit is not None else MEMORY_WINDOW.steps
        return self.steps

    @property
    def until_eval_steps(self) -> int | None:
        """With ``until_eval``: the steps to run at least before the first evaluation may end the run."""
        return self.warmup + (self.window_steps or 0) if self.until_eval else None

    def runtime(self, *, out_dir: Path | None, name: str) -> RuntimeOptions:
        """The runtime's options for this window: the observer, not a step count, ends an ``until_eval`` run."""
        from torchscalpel.runtime.session import RuntimeOptions

        return RuntimeOptions(
            warmup=self.warmup,
            steps=None if self.until_eval else self.window_steps,
            out_dir=out_dir,
            profile_steps=0,
            name=name,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
            step_scalars=False,  # memory never exports a learning-rate curve
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> MemoryOptions:
        """The options ``scalpel memory``'s parsed flags ask for. ``args.steps``: None when ``--steps`` was not
        given (the default window), else the parsed ``--steps`` (a number, ``all``, or ``auto``: every step
        here); ``args.memory_limit`` the size text, parsed by the shared size rule."""
        from torchscalpel.runtime.window import parse_steps
        from torchscalpel.units import parse_size

        limit = parse_size(args.memory_limit, flag="--memory-limit") if args.memory_limit else None
        steps: int | Literal["default"] | None = "default"
        if args.steps is not None:
            parsed = parse_steps(args.steps)
            steps = None if parsed in ("all", "auto") else int(parsed)
        return cls(
            steps=steps,
            warmup=args.warmup,
            memory_limit=limit,
            until_eval=args.until_eval,
            plan=not args.no_plan,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            **fields,
        )
