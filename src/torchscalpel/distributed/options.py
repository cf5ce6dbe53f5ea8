"""What ``scalpel launch`` (and ``scalpel doctor --nproc``) asks for, read once from torchrun's parsed flags.

:class:`LaunchOptions` is built by :meth:`LaunchOptions.from_args` from the namespace of
:func:`torchscalpel.distributed.launch.build_parser` (torchrun's own parser plus scalpel's flags): it checks the
flags, picks the loopback rendezvous of a one-node launch, and is never changed after. What the launcher reads is a
typed field; torchrun's other options travel untouched in :attr:`LaunchOptions.torchrun` and become torchrun's own
namespace only when torchrun is called (:meth:`LaunchOptions.torchrun_namespace`). Torch-free.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.fileio import default_run_dir
from torchscalpel.netutil import free_port
from torchscalpel.options import StageOptions, usage_error
from torchscalpel.runtime.target import Target
from torchscalpel.runtime.window import parse_steps
from torchscalpel.units import fmt_bytes, parse_size

MAX_NPROC = 1024
"""Processes on one node: beyond any machine's devices or cores, and never a fork bomb."""
MIN_DEVICE_MEMORY = 256 << 20
"""The least --plan-device-memory taken for a device: no accelerator a training run targets has less."""

OWN_DESTS = (
    "nproc",
    "out",
    "profile",
    "doctor",
    "steps",
    "tensorboard",
    "mlflow",
    "plan",
    "plan_strict",
    "plan_device_memory",
    "hang_timeout",
    "check_collectives",
    "fresh",
)
"""scalpel's own launch flags (never passed to torchrun)."""
TYPED_TORCHRUN = (
    "training_script",
    "training_script_args",
    "module",
    "no_python",
    "nproc_per_node",
    "nnodes",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "standalone",
    "max_restarts",
)
"""torchrun's flags the launcher itself reads: typed fields of :class:`LaunchOptions`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchOptions(StageOptions):
    """One launch: the script, the ranks, the rendezvous, and what scalpel does around torchrun."""

    training_script: str
    """The user's script (or module, with ``module``) as given after ``--``."""
    training_script_args: tuple[str, ...] = ()
    module: bool = False
    """``-m``: ``training_script`` is a module."""
    no_python: bool = False
    """``--no-python``: ``training_script`` is a program, not Python (no hang watch, no stage)."""
    nproc_per_node: str = "1"
    """torchrun's ``--nproc-per-node`` (``--nproc N`` sets it): a count, or gpu / cpu / auto."""
    nnodes: str = "1"
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    standalone: bool = False
    max_restarts: int = 0
    out: Path | None = None
    """``--out``: the launch folder (per-rank logs and records)."""
    stage: str | None = None
    """``profile`` or ``doctor`` (``--profile`` / ``--doctor``): every rank runs under that stage."""
    steps: str = "20"
    """``--steps`` with a stage: measured steps per rank, or ``all``."""
    tensorboard: str | None = None
    mlflow: str | None = None
    plan: bool = False
    """``--plan``: plan the script's per-rank memory before the ranks start."""
    plan_strict: bool = False
    plan_device_memory: str | None = None
    hang_timeout: float | None = None
    """``--hang-timeout`` seconds (0: off; None: the watch's own multiple of the step time)."""
    check_collectives: bool = False
    """Compare every rank's collectives while the job runs (on by default with ``--doctor``)."""
    fresh: bool = False
    """``--fresh``: move an existing checkpoint folder aside instead of resuming from it."""
    torchrun: tuple[tuple[str, Any], ...] = ()
    """torchrun's other options as parsed (``--max-restarts`` aside), passed to it unchanged."""

    def __post_init__(self) -> None:
        if self.stage not in (None, "profile", "doctor"):
            raise UsageError(f"launch stage {self.stage!r} is not profile or doctor.")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts} must be 0 or more.")
        if self.hang_timeout is not None and not (self.hang_timeout == 0 or 1 <= self.hang_timeout <= 86400):
            raise UsageError(f"--hang-timeout {self.hang_timeout:g} must be 0 (off) or 1-86400 seconds.")
        if self.no_python and (self.check_collectives or self.hang_timeout):
            raise UsageError("--hang-timeout/--check-collectives watch a Python script; drop --no-python.")
        tracking = self.tensorboard or self.mlflow
        if tracking and self.stage is None:
            raise UsageError(
                "--tensorboard and --mlflow on launch need --profile or --doctor (the per-rank records)."
            )
        if self.stage is not None and (self.module or self.no_python):
            raise UsageError(
                f"--{self.stage} runs a script file; drop -m/--no-python and pass the script path."
            )

    @property
    def single_node(self) -> bool:
        """One node (``--nnodes 1`` or ``1:1``)."""
        return str(self.nnodes) in ("1", "1:1")

    @property
    def local_ranks(self) -> int:
        """Ranks on this node when ``--nproc-per-node`` is a count, else 1 (gpu / cpu / auto are torchrun's to count)."""
        return int(self.nproc_per_node) if str(self.nproc_per_node).isdigit() else 1

    @property
    def name(self) -> str:
        """The launch's name (its run folder's): the script's stem."""
        return _run_name(self.training_script, module=self.module)

    def torchrun_namespace(self, **changes: Any) -> argparse.Namespace:
        """A new namespace for ``torch.distributed.run.run`` (torchrun's API takes one): its options as parsed,
        the launcher's typed ones, and ``changes`` (the rank entry point, the log folder). Built fresh each call."""
        values = dict(self.torchrun)
        values.update({name: getattr(self, name) for name in TYPED_TORCHRUN})
        values["training_script_args"] = list(self.training_script_args)
        values.update(changes)
        return argparse.Namespace(**values)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] | None = None, *, out_root: Path | None = None
    ) -> LaunchOptions:
        """Check torchrun's and scalpel's parsed flags and fill in what a one-node launch leaves open (loopback
        rendezvous on a free port). ``env``: the environment read for ``MASTER_ADDR`` (default ``os.environ``);
        ``out_root``: where the launch folder goes without ``--out`` (the config file's ``out_root``)."""
        env = os.environ if env is None else env
        if not args.training_script:
            raise UsageError(
                "Name the script after --, e.g. 'scalpel launch --nproc 2 -- train.py --lr 3e-4'."
            )
        nproc_per_node = str(args.nproc_per_node)
        if args.nproc is not None:
            if not 1 <= args.nproc <= MAX_NPROC:
                raise UsageError(f"--nproc {args.nproc} must be at least 1 and at most {MAX_NPROC}.")
            nproc_per_node = str(args.nproc)
        script = Path(args.training_script)
        if not args.module and not args.no_python and not script.is_file():
            raise UsageError(
                f"Script {script} does not exist; check the path (it is read relative to {Path.cwd()})."
            )
        nnodes = str(args.nnodes)
        single_node = nnodes in ("1", "1:1")
        backend, endpoint, rdzv_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
        if not single_node and not endpoint and backend != "static":
            raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node).")
        if not single_node and backend == "static" and not endpoint and "MASTER_ADDR" not in env:
            raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node).")
        if single_node and not endpoint and not args.standalone and backend == "static":
            # Why not torchrun's own default ("localhost:0"): localhost may resolve to a public
            # interface in some containers; 127.0.0.1 never leaves the machine.
            backend, endpoint, rdzv_id = "c10d", f"127.0.0.1:{free_port()}", uuid.uuid4().hex
        if args.max_restarts < 0:
            raise UsageError(f"--max-restarts {args.max_restarts} must be 0 or more.")
        if endpoint:
            check_endpoint(endpoint)
        _check_plan_flags(args)
        try:  # --steps in the shared grammar, before a rank starts
            parse_steps(str(args.steps))
        except ValueError as exc:
            raise usage_error(exc) from None
        stage = "profile" if args.profile else "doctor" if args.doctor else None
        check = bool(args.doctor) if args.check_collectives is None else bool(args.check_collectives)
        passed = {k: v for k, v in vars(args).items() if k not in OWN_DESTS and k not in TYPED_TORCHRUN}
        return cls(
            training_script=args.training_script,
            training_script_args=tuple(args.training_script_args),
            module=bool(args.module),
            no_python=bool(args.no_python),
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            rdzv_backend=backend,
            rdzv_endpoint=endpoint,
            rdzv_id=rdzv_id,
            standalone=bool(args.standalone),
            max_restarts=args.max_restarts,
            out=args.out
            or default_run_dir(
                "launch-" + _run_name(args.training_script, module=bool(args.module)), out_root
            ),
            stage=stage,
            steps=str(args.steps),
            tensorboard=args.tensorboard,
            mlflow=args.mlflow,
            plan=bool(args.plan),
            plan_strict=bool(args.plan_strict),
            plan_device_memory=args.plan_device_memory,
            hang_timeout=args.hang_timeout,
            check_collectives=check,
            fresh=bool(args.fresh),
            torchrun=tuple(sorted(passed.items())),
        )


def _run_name(script: str, *, module: bool) -> str:
    """The run folder's name every stage gives this target (:attr:`Target.name`): a script's stem, a module's
    last part."""
    return (Target(module=script) if module else Target(script=Path(script))).name


def _check_plan_flags(args: argparse.Namespace) -> None:
    """``--plan-device-memory`` / ``--plan-strict`` only with ``--plan``, a device-sized memory, a script file."""
    if args.plan_device_memory and not args.plan:
        raise UsageError("--plan-device-memory only applies with --plan.")
    if args.plan_strict and not args.plan:
        raise UsageError("--plan-strict only applies with --plan.")
    if args.plan_device_memory:
        size = parse_size(args.plan_device_memory, flag="--plan-device-memory")
        if size < MIN_DEVICE_MEMORY:
            raise UsageError(
                f"--plan-device-memory {args.plan_device_memory} is {fmt_bytes(size)}, too small to be "
                f"a device; give its memory, e.g. 80GiB (at least {fmt_bytes(MIN_DEVICE_MEMORY)})."
            )
    if args.plan and (args.module or args.no_python):
        raise UsageError("--plan runs a script file; drop -m/--no-python and pass the script path.")


def check_endpoint(endpoint: str) -> None:
    """``HOST[:PORT]`` with a port of 0-65535 (torchrun's own rule), as one sentence instead of its traceback."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep:
        host, port = endpoint.strip(), ""
    if host.startswith("[") and host.endswith("]"):  # [::1]:29500
        host = host[1:-1]
    bad_port = bool(sep) and not (port.isdigit() and int(port) <= 65535)
    if not host or bad_port or (":" in host and not sep) or (":" in host and "[" not in endpoint):
        raise UsageError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT; write e.g. 10.0.0.1:29500 (port 0-65535)."
        )
