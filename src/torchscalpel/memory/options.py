"""What ``scalpel memory`` and ``torchscalpel.memory`` are asked: one frozen, validated object.

The window rule lives here once: by default :data:`~torchscalpel.runtime.window.MEMORY_WINDOW`'s steps, or every
step under a memory limit (growth that crosses the limit late still gets its post-mortem and fix ladder).
Torch-free: the CLI builds it before torch loads.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torchscalpel.errors import ArgumentError, UsageError, literal
from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import MEMORY_WINDOW, check_window

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions
    from torchscalpel.runtime.target import Target


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
    target: Target | None = field(default=None, compare=False)
    """The script or module to run (:func:`torchscalpel.stages.memory.run`)."""
    snapshot: Path | None = None
    """A ``torch.cuda.memory._dump_snapshot`` file to explain instead of running a script."""
    out_dir: Path | None = None
    """The run folder (default ``scalpel-runs/<time>-memory-<name>/``)."""
    report: bool = True
    """Write report.html beside run.json."""
    json_path: Path | None = None
    """Also write the memory section (a snapshot's explanation) as JSON here."""
    html_path: Path | None = None
    """With a snapshot: also write an HTML page of it here."""
    patch: bool = False
    """Also write fix.patch in the run folder: the ladder's first fitting rung (a script run)."""
    config: Path | None = None
    """Apply the ``[tune]`` settings of this scalpel.toml while measuring."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the record keeps."""

    def __post_init__(self) -> None:
        if self.snapshot is not None and not self.snapshot.is_file():
            raise UsageError(
                f"{self.snapshot} does not exist; give the path of a torch.cuda.memory._dump_snapshot file."
            )
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
        """The options ``scalpel memory``'s parsed flags ask for, every flag checked here in the CLI's words:
        the size first (a snapshot's run included), then a SNAPSHOT.pickle or the script. ``args.steps``: None
        when ``--steps`` was not given (the default window), else the parsed ``--steps`` (a number, ``all``, or
        ``auto``: every step here); ``args.memory_limit`` the size text, parsed by the shared size rule."""
        from torchscalpel.runtime.target import target_from_args
        from torchscalpel.runtime.window import parse_steps
        from torchscalpel.units import parse_size

        limit = parse_size(args.memory_limit, flag="--memory-limit") if args.memory_limit else None
        outputs: dict[str, Any] = {
            "report": not args.no_report,
            "json_path": args.json_path,
            "patch": args.patch,
            "command": ("scalpel", *sys.argv[1:]),
        }
        words = list(args.target or [])
        if words and words[0] == "--":
            words = words[1:]
        if not args.module and len(words) == 1 and looks_like_snapshot(Path(words[0])):
            if args.patch:
                raise UsageError("--patch goes with a script run, not with a SNAPSHOT.pickle.")
            return cls(
                memory_limit=limit, snapshot=Path(words[0]), html_path=args.html_path, **outputs, **fields
            )
        if args.html_path is not None:
            raise UsageError(
                "--html FILE is for a SNAPSHOT.pickle; a script run writes report.html in its run folder (--out)."
            )
        if not args.module and not words:
            raise UsageError(
                "Name the script after --, e.g. 'scalpel memory -- train.py', or give a SNAPSHOT.pickle."
            )
        steps: int | Literal["default"] | None = "default"
        if args.steps is not None:
            parsed = parse_steps(args.steps)
            steps = None if parsed in ("all", "auto") else int(parsed)
        options = cls(
            steps=steps,
            warmup=args.warmup,
            memory_limit=limit,
            until_eval=args.until_eval,
            plan=not args.no_plan,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            config=args.config,
            **outputs,
            **fields,
        )
        target = target_from_args(args)
        return options.replace(target=target, out_dir=args.out, out_root=getattr(args, "out_root", None))


def looks_like_snapshot(path: Path) -> bool:
    """A ``.pickle`` / ``.pkl`` name, or a file (not ``.py``) that starts as a pickle does."""
    return path.suffix.lower() in (".pickle", ".pkl") or (
        path.is_file() and path.suffix.lower() != ".py" and _starts_like_pickle(path)
    )


def _starts_like_pickle(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False
