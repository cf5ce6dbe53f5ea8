"""Per-rank entry point of ``scalpel launch`` (and of ``scalpel doctor --nproc``, which launches).

torchrun runs ``python -m torchscalpel.distributed.rank_entry COMMAND BASE [OPTIONS] -- SCRIPT ARGS``
(the module string is :data:`MODULE`) on every rank. First the rank's collectives, steps and a stack
dump on a signal are set up for the launcher's hang watch (:mod:`torchscalpel.runtime.collectives`,
when the launcher asked for it). Then:

- ``exec``: the script (or ``-m MODULE``) runs as ``__main__``, as ``python SCRIPT`` would run it;
- ``profile`` / ``doctor``: the ``scalpel`` program itself runs, in this process, as
  ``scalpel COMMAND --out BASE/rank-R [OPTIONS] -- SCRIPT ARGS`` with R the global rank (torchrun
  can only substitute the *local* rank into arguments, which repeats across nodes).

Why this lives below ``cli/``: the launcher that starts the ranks is library code
(:mod:`torchscalpel.distributed.launch`), and nothing below the CLI names it. For ``profile`` /
``doctor`` it runs the package's public entry point (``python -m torchscalpel``, the same program as
the ``scalpel`` command), as a shell would, rather than importing the CLI's modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from torchscalpel.errors import UsageError
from torchscalpel.runtime.script import ExecOptions, run_script
from torchscalpel.runtime.target import Target

MODULE = "torchscalpel.distributed.rank_entry"
"""What torchrun runs with ``-m`` on every rank."""
PROGRAM = "torchscalpel"
"""The package whose ``__main__`` is the ``scalpel`` command (run for ``profile`` / ``doctor``)."""


def rank_argv(argv: list[str], rank: int) -> list[str]:
    """The ``scalpel`` argv for this rank (pure, for tests)."""
    if len(argv) < 2:
        raise UsageError("rank_entry needs COMMAND BASE_OUT [OPTIONS] -- SCRIPT [ARGS].")
    command, base, rest = argv[0], argv[1], argv[2:]
    extra = ["--no-report"] if command == "profile" and rank != 0 else []  # one HTML report is enough
    return [command, "--out", os.path.join(base, f"rank-{rank}"), *extra, *rest]


_AS_A_RANK = ExecOptions(interrupt="raise", restore_sys=False)
"""A rank's process is the script's: Ctrl-C kills it by SIGINT (what torchrun expects of a worker),
and ``sys.argv`` / ``sys.path`` stay the script's until the process exits."""


def exec_target(argv: list[str]) -> int:
    """Run ``[-m MODULE | SCRIPT] ARGS`` as ``__main__``; the exit status ``python`` would give."""
    from torchscalpel.runtime.collectives import mark_finished

    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("rank_entry exec needs SCRIPT [ARGS] or -m MODULE [ARGS].")
    target = (
        Target(module=argv[1], args=argv[2:])
        if argv[0] == "-m"
        else Target(script=Path(argv[0]), args=argv[1:])
    )
    try:
        return run_script(target, _AS_A_RANK).exit_code
    finally:
        mark_finished()  # exiting may take a while (gloo teardown): that silence is not a hang


def run_program(argv: list[str]) -> int:
    """``scalpel ARGV`` in this process (``python -m torchscalpel``, the ``scalpel`` program); its exit status."""
    return run_script(Target(module=PROGRAM, args=argv), _AS_A_RANK).exit_code


def main() -> int:
    """Set up the hang watch's side, then run the script or the scalpel command for this rank."""
    from torchscalpel.runtime.collectives import install_from_env

    install_from_env()
    args = sys.argv[1:]
    if args and args[0] == "exec":
        return exec_target(args[1:])
    return run_program(rank_argv(args, int(os.environ.get("RANK", "0"))))


if __name__ == "__main__":
    sys.stdout.flush()
    raise SystemExit(main())
