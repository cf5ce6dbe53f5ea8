"""What ``scalpel profile`` and ``torchscalpel.profile`` are asked: one frozen, validated object.

Its defaults are :data:`~torchscalpel.runtime.window.PROFILE_WINDOW`'s, and it turns into the runtime's
:class:`~torchscalpel.runtime.session.RuntimeOptions` in one place (:meth:`ProfileOptions.runtime`), so the CLI
and the in-process API run the same passes (the op-line pass included). Torch-free: the CLI builds it first.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import PROFILE_WINDOW, StepWindow

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions
    from torchscalpel.runtime.target import Target

DEFAULT_EXAMPLE = "char_transformer.py"
"""What ``scalpel profile`` profiles without a script (from :mod:`torchscalpel.examples`)."""
DEFAULT_EXAMPLE_ARGS = ("--steps", "60", "--log-every", "20")
"""The default example's arguments, sized so the demo is quick on a laptop CPU."""

OP_LINE_STEPS = 1
"""Steps of the op-line pass after the profiler window (``--no-op-lines``: none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileOptions(StageOptions):
    """A profile run: its window and what the profiler window records."""

    warmup: int = PROFILE_WINDOW.warmup
    steps: int | None = PROFILE_WINDOW.steps
    """Measured steps; None: until the script (or the block) ends."""
    profile_steps: int = PROFILE_WINDOW.profile_steps
    profile_event_budget: int | None = PROFILE_WINDOW.profile_event_budget
    step_kind: str = PROFILE_WINDOW.step_kind
    step_timeout_s: float | None = PROFILE_WINDOW.step_timeout_s
    module_times: bool = False
    """Also time each submodule's forward (``--module-times``)."""
    op_lines: bool = True
    """Run the op-line pass: each top op's user line and shapes, and the op-pattern findings."""
    with_stack: bool = False
    record_shapes: bool = False
    target: Target | None = field(default=None, compare=False)
    """The script or module to profile (:func:`torchscalpel.stages.profile.run`; None: an in-process block)."""
    out_dir: Path | None = None
    """The run folder (default ``scalpel-runs/<time>-<name>/``)."""
    report: bool = True
    """Write report.html beside run.json."""
    json_path: Path | None = None
    """Also write the record here (``-``: standard output)."""
    config: Path | None = None
    """Apply the ``[tune]`` settings of this scalpel.toml while profiling."""
    tensorboard: Path | None = None
    """Also write the run to this TensorBoard log folder."""
    mlflow: str | None = None
    """Also log the run to this MLflow tracking URI or folder."""
    name: str | None = None
    """The record's name (None: the target's)."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the record keeps."""

    def __post_init__(self) -> None:
        self.window  # noqa: B018 - the window's own checks, with its sentences

    @property
    def window(self) -> StepWindow:
        """The run window these options ask for (validated)."""
        return StepWindow(
            warmup=self.warmup,
            steps=self.steps,
            profile_steps=self.profile_steps,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
            profile_event_budget=self.profile_event_budget,
        )

    def runtime(self, *, out_dir: Path | None, name: str) -> RuntimeOptions:
        """The runtime's options for this profile (the one place they are assembled)."""
        from torchscalpel.runtime.session import RuntimeOptions

        return RuntimeOptions(
            warmup=self.warmup,
            steps=self.steps,
            out_dir=out_dir,
            profile_steps=self.profile_steps,
            profile_event_budget=self.profile_event_budget,
            module_times=self.module_times,
            op_line_steps=OP_LINE_STEPS if self.op_lines else 0,
            with_stack=self.with_stack,
            record_shapes=self.record_shapes,
            name=name,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> ProfileOptions:
        """The options ``scalpel profile``'s parsed flags ask for: the script first (without one, the bundled
        :data:`DEFAULT_EXAMPLE`), then ``--warmup`` and ``--steps`` (a number, ``all`` or ``auto``:
        :data:`~torchscalpel.runtime.window.PROFILE_WINDOW`'s). Without ``--out`` the stage names the run
        folder."""
        from torchscalpel.examples import example_script
        from torchscalpel.runtime.target import target_from_args
        from torchscalpel.runtime.window import check_warmup, parse_steps

        default = None if args.module or args.target else example_script(DEFAULT_EXAMPLE)
        target = target_from_args(args, default_script=default)
        if default is not None:
            target.args = list(DEFAULT_EXAMPLE_ARGS)
        check_warmup(args.warmup)
        steps = parse_steps(args.steps)
        return cls(
            warmup=args.warmup,
            steps=None if steps == "all" else PROFILE_WINDOW.steps if steps == "auto" else int(steps),
            profile_steps=args.profile_steps,
            profile_event_budget=getattr(args, "profile_budget", PROFILE_WINDOW.profile_event_budget),
            module_times=args.module_times,
            op_lines=not getattr(args, "no_op_lines", False),
            with_stack=getattr(args, "with_stack", False),
            record_shapes=getattr(args, "record_shapes", False),
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            target=target,
            out_dir=getattr(args, "out", None),
            out_root=getattr(args, "out_root", None),
            report=not getattr(args, "no_report", False),
            json_path=getattr(args, "json_path", None),
            config=getattr(args, "config", None),
            tensorboard=getattr(args, "tensorboard", None),
            mlflow=getattr(args, "mlflow", None),
            command=("scalpel", *sys.argv[1:]),
            **fields,
        )
