"""What ``scalpel doctor`` is asked: one frozen, validated object shared by the CLI, the demo and the
in-process API (defaults from :mod:`torchscalpel.doctor.window`). The CLI builds it with
:meth:`DoctorOptions.from_args` (every flag checked there, none in ``cli/doctor.py``) and hands it to
:func:`torchscalpel.stages.doctor.run`."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torchscalpel.doctor.window import DOCTOR_WINDOW, TAIL_CAP_S, TIME_CAP_S
from torchscalpel.errors import ArgumentError, UsageError, literal
from torchscalpel.findings import Severity
from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import check_window

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions
    from torchscalpel.runtime.target import Target


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorOptions(StageOptions):
    """The doctor's run window and what it checks besides the runtime rules.

    Construction validates (:class:`~torchscalpel.errors.ArgumentError`, a ``ValueError`` whose sentence
    names the field; the CLI words it with the flag), so a bad value is refused before the script starts."""

    steps: int | Literal["all", "auto"] | None = "auto"
    """Measured steps; ``"auto"``: :data:`~torchscalpel.doctor.window.DEFAULT_STEPS` (30 per rank under a
    launcher); ``"all"`` or None: until the script ends (None as in ``torchscalpel.doctor(steps=None)``)."""
    warmup: int = DOCTOR_WINDOW.warmup
    sanity: bool = False
    """Also try to overfit one batch (``--sanity``)."""
    static: bool = True
    """Also run the static rules on the script and the model sources it used."""
    nan_rerun: bool = True
    """Re-run to locate the first NaN when the loss became NaN."""
    out_dir: Path | None = None
    step_kind: str = DOCTOR_WINDOW.step_kind
    step_timeout_s: float | None = DOCTOR_WINDOW.step_timeout_s
    time_cap_s: float | None = TIME_CAP_S
    """Wall-clock cap of the window (None or 0: none); when it cut the window, the record says so."""
    tail_cap_s: float | None = None
    """After a training window that ended on its step count, run on for up to this many seconds under the
    cheap checks only; 0: stop at the window's end; None: :data:`~torchscalpel.doctor.window.TAIL_CAP_S` with
    the default window (``steps="auto"``), no tail when ``steps`` is a number the caller chose."""
    step_scalars: bool = False
    """Record each step's learning rate and clipped gradient norm (for ``--tensorboard`` / ``--mlflow``)."""
    target: Target | None = field(default=None, compare=False)
    """The script or module to run (:func:`~torchscalpel.stages.doctor.run`; None: an in-process block)."""
    static_paths: tuple[Path, ...] | None = None
    """``--static``: only the static rules over these files and folders; no script runs."""
    nproc: int | None = None
    """Run the script on this many ranks through ``scalpel launch --doctor`` and merge the findings."""
    report: bool = True
    """Write report.html beside run.json."""
    patch: bool = False
    """Also write fix.patch in the run folder (a script run of one process)."""
    json_path: Path | None = None
    """Also write the findings as JSON here (``-``: standard output)."""
    sarif_path: Path | None = None
    """Also write the static findings as SARIF 2.1.0 here."""
    fail_on: Severity | None = None
    """Exit 1 when a finding reaches this severity."""
    tensorboard: Path | None = None
    """Also write the run to this TensorBoard log folder."""
    mlflow: str | None = None
    """Also log the run to this MLflow tracking URI or folder."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the record keeps."""

    def __post_init__(self) -> None:
        steps = self.steps
        if isinstance(steps, str) and steps not in ("all", "auto"):
            raise ArgumentError("{steps} must be a number, 'auto' or 'all', got " + literal(repr(steps)))
        check_window(
            warmup=self.warmup,
            steps=steps if isinstance(steps, int) else None,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
        )
        if self.time_cap_s is not None and not (math.isfinite(self.time_cap_s) and self.time_cap_s >= 0):
            raise ArgumentError(
                "{time_cap_s} must be 0 (no cap) or a number of seconds, got " + literal(self.time_cap_s)
            )
        if self.tail_cap_s is not None and not (math.isfinite(self.tail_cap_s) and self.tail_cap_s >= 0):
            raise ArgumentError(
                "{tail_cap_s} must be 0 (no tail) or a number of seconds, got " + literal(self.tail_cap_s)
            )
        if self.nproc is not None and self.nproc < 1:
            raise ArgumentError("{nproc} must be at least 1, got " + literal(self.nproc))
        if self.patch and (self.static_paths is not None or self.nproc is not None):
            raise ArgumentError("{patch} goes with a script run of one process, not with {static} or {nproc}")
        if self.static_paths is not None and self.target is not None:
            raise ArgumentError("{static} takes paths, not a script to run")

    @property
    def mode(self) -> Literal["static", "ranks", "run"]:
        """What the stage does: the static rules only, every rank under a launcher, or one script run."""
        if self.static_paths is not None:
            return "static"
        return "ranks" if self.nproc is not None else "run"

    @property
    def planned_steps(self) -> int | None:
        """The measured steps of one process's window: ``"auto"`` is
        :data:`~torchscalpel.doctor.window.DEFAULT_STEPS`, ``"all"`` and None are None (until the end). The one
        place ``auto`` becomes a number (a launcher's ranks take ``RANK_STEPS`` instead: see ``diagnose``)."""
        if self.steps == "auto":
            return DOCTOR_WINDOW.steps
        return None if self.steps in ("all", None) else int(self.steps)

    def runtime(
        self,
        *,
        steps: int | None,
        out_dir: Path | None,
        name: str,
        profile: bool = False,
        tail_s: float | None = None,
    ) -> RuntimeOptions:
        """The runtime's options for a doctor window of ``steps`` measured steps (the one place they are
        assembled): ``profile`` opens a 3-step profiler window when there is a run folder for its trace;
        ``tail_s`` lets the run go on past the window under the cheap checks (:attr:`tail_s`)."""
        from torchscalpel.runtime.session import RuntimeOptions

        return RuntimeOptions(
            warmup=self.warmup,
            steps=steps,
            out_dir=out_dir,
            profile_steps=3 if profile and out_dir is not None else 0,
            name=name,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
            step_scalars=self.step_scalars,
            tail_s=tail_s,
        )

    @property
    def tail_s(self) -> float | None:
        """The tail in force for one process (None: none): the caller's ``tail_cap_s``, else
        :data:`~torchscalpel.doctor.window.TAIL_CAP_S` with the default window; never when the run goes to
        the script's end anyway (``steps="all"``)."""
        if self.planned_steps is None:
            return None
        if self.tail_cap_s is not None:
            return self.tail_cap_s or None
        return TAIL_CAP_S if self.steps == "auto" else None

    @property
    def cap_s(self) -> float | None:
        """The time cap in force: None when there is none (``time_cap_s`` None or 0)."""
        return self.time_cap_s or None

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> DoctorOptions:
        """The options ``scalpel doctor``'s parsed flags ask for, every flag checked here in the CLI's words
        (:class:`UsageError`, or a ``ValueError`` the CLI words with its flags), in the order a user meets
        them: ``--fail-on``, the window, ``--time-cap``, ``--nproc``, ``--patch``, then the target (``fields``:
        those the command line does not hold). Without ``--out`` the stage names the run folder."""
        from torchscalpel.runtime.target import target_from_args
        from torchscalpel.runtime.window import check_warmup, parse_steps

        fail_on = Severity.parse(args.fail_on) if args.fail_on else None
        check_warmup(args.warmup)
        steps = parse_steps(args.steps)
        if not (math.isfinite(args.time_cap) and args.time_cap >= 0):  # nan and inf included
            raise UsageError("--time-cap must be 0 (no cap) or a number of seconds.")
        if args.nproc is not None and args.nproc < 1:
            raise UsageError("--nproc must be at least 1.")
        if args.patch and (args.static is not None or args.nproc is not None):
            raise UsageError("--patch goes with a script run of one process, not with --static or --nproc.")
        target: Target | None = None
        static_paths: tuple[Path, ...] | None = None
        if args.static is not None:
            if args.target or args.module:
                raise UsageError(
                    "--static takes paths, not a script to run; drop the '-- SCRIPT' part or drop --static."
                )
            static_paths = tuple(args.static)
        else:
            if not args.target and not args.module:
                raise UsageError(
                    "Name the script to check after --, e.g. 'scalpel doctor -- train.py', or pass --static PATH."
                )
            if args.nproc is not None and args.module:
                raise UsageError("--nproc runs a script file; pass the script path instead of -m.")
            target = target_from_args(args)
            if args.nproc is not None and (target.script is None or not target.script.is_file()):
                raise UsageError("--nproc needs a script file after --.")
        return cls(
            steps=steps if steps in ("all", "auto") else int(steps),
            warmup=args.warmup,
            sanity=args.sanity,
            static=not args.no_static,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            time_cap_s=args.time_cap or None,
            tail_cap_s=getattr(args, "tail_cap", None),
            # the learning-rate and gradient-norm curves are recorded only for a tracker that shows them
            step_scalars=bool(getattr(args, "tensorboard", None) or getattr(args, "mlflow", None)),
            target=target,
            static_paths=static_paths,
            nproc=args.nproc,
            out_dir=args.out,
            out_root=getattr(args, "out_root", None),
            report=not args.no_report,
            patch=args.patch,
            json_path=args.json_path,
            sarif_path=args.sarif,
            fail_on=fail_on,
            tensorboard=getattr(args, "tensorboard", None),
            mlflow=getattr(args, "mlflow", None),
            command=("scalpel", *sys.argv[1:]),
            **fields,
        )
