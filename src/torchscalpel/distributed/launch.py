"""``scalpel launch``: torchrun, in process, with safer defaults and one clear failure report.

The options are torchrun's own (``torch.distributed.run.get_args_parser()``), plus ``--nproc``
(alias of ``--nproc-per-node``) and torchscalpel's ``--out``. Differences from plain torchrun:

- one node without ``--rdzv-endpoint``: c10d rendezvous on ``127.0.0.1`` and a free port, and
  ``GLOO_SOCKET_IFNAME=lo`` so gloo never listens on an outside interface;
- every rank's output is shown prefixed ``[rank R]`` and also kept in ``OUT/logs``;
- when a rank fails: which rank, its exit code (or signal), the restarts used, and the last
  lines of its stderr, instead of torchrun's error-file banner.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.distributed.hangdiag import first_mismatch
from torchscalpel.distributed.hangwatch import FLOOR_S, MULTIPLE, HangWatch, WatchOptions
from torchscalpel.distributed.options import MAX_NPROC, LaunchOptions
from torchscalpel.distributed.rank_entry import MODULE as RANK_ENTRY
from torchscalpel.runtime.collectives import ENV_DIR as COLLECTIVE_ENV
from torchscalpel.units import int_type

TAIL_LINES = 12
# Filters apply per logger, not to children: name every torchrun logger whose lines we trim.
AGENT_LOGGERS = (
    "torch.distributed",
    "torch.distributed.run",
    "torch.distributed.launcher.api",
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.agent.server.api",
)


class _OneLineParser(argparse.ArgumentParser):
    """A bad torchrun flag ends in one line on stderr, exit 2, like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} -h').\n")


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser plus ``--nproc`` and ``--out`` (``scalpel launch -h`` prints it)."""
    from torch.distributed.run import get_args_parser

    parser = _OneLineParser(
        prog="scalpel launch",
        parents=[get_args_parser()],
        add_help=False,
        description="Run SCRIPT on N processes per node with torchrun (its options below), rank-prefixed logs, "
        "loopback rendezvous on one node, and a one-paragraph report when a rank fails.",
    )
    for action in parser._actions:
        if action.dest == "training_script":
            action.nargs = "?"  # a missing script gets prepare()'s sentence, not argparse's
    parser.add_argument(
        "--nproc",
        type=int_type("--nproc", minimum=1, maximum=MAX_NPROC),
        help="processes on this node (same as --nproc-per-node)",
    )
    parser.add_argument(
        "--out", type=Path, help="folder for per-rank logs (default scalpel-runs/<time>-launch-<name>/)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--profile",
        action="store_true",
        help="run every rank under 'scalpel profile' and report per-rank step time, collective wait, stragglers",
    )
    mode.add_argument(
        "--doctor", action="store_true", help="run every rank under 'scalpel doctor' and merge the findings"
    )
    parser.add_argument(
        "--steps",
        default="20",
        help="with --profile/--doctor: measured steps per rank, or 'all' (default 20)",
    )
    parser.add_argument(
        "--tensorboard", metavar="DIR", help="with --profile/--doctor: every rank's scalars and trace here"
    )
    parser.add_argument(
        "--mlflow", metavar="URI", help="with --profile/--doctor: one MLflow run per rank in this store"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="before starting the ranks, plan the script's per-rank memory for this world size and warn "
        "if no strategy fits (runs the script to its first optimizer step once, on one rank)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        metavar="SECONDS",
        help="declare a hang when no rank made progress (a step or a finished collective) for this long, "
        f"name the rank that diverged and stop the job (default: {MULTIPLE:g}x the step time, at least "
        f"{FLOOR_S:g} s; 0 turns the watch off)",
    )
    parser.add_argument(
        "--check-collectives",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare every rank's collectives (op, shapes, dtypes, order) while the job runs and report "
        "the first mismatch with both call sites (default: on with --doctor)",
    )
    parser.add_argument(
        "--plan-strict",
        action="store_true",
        help="with --plan: do not launch when the plan says no strategy fits (exit 1)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over: move an existing checkpoint folder (in the current folder or named in the "
        "script's arguments) aside instead of resuming from it",
    )
    parser.add_argument(
        "--plan-device-memory",
        metavar="SIZE",
        help="with --plan: the per-rank device memory to plan against (default: this machine's GPU 0)",
    )
    return parser


HANG_EXIT = 124
"""Exit status after a diagnosed hang (what ``timeout`` returns)."""


def watch_options(options: LaunchOptions, out_dir: Path) -> WatchOptions | None:
    """The hang watch for this launch; None when it is off (``--hang-timeout 0`` without a check, ``--no-python``)."""
    if options.no_python or (options.hang_timeout == 0 and not options.check_collectives):
        return None
    timeout = None if options.hang_timeout is None else float(options.hang_timeout) or float("inf")
    return WatchOptions(
        folder=out_dir / "watch",
        report_dir=out_dir,
        local_ranks=options.local_ranks,
        hang_timeout=timeout,
        check=options.check_collectives,
        nccl_trace=_cuda(),
    )


def _cuda() -> bool:
    """Whether the ranks will see a GPU (the NCCL flight recorder only exists there)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch is reported by the ranks, not here
        return False


@dataclass(frozen=True, slots=True)
class RankCommand:
    """What torchrun runs on every rank: ``python [-m] SCRIPT ARGS`` (``module``: ``-m``)."""

    module: bool
    script: str
    args: tuple[str, ...]


def rank_command(options: LaunchOptions, out_dir: Path) -> RankCommand:
    """The rank entry point for ``options``: ``rank_entry COMMAND OUT --steps N ... -- SCRIPT ARGS`` under
    --profile/--doctor (each rank writes ``OUT/rank-R``), ``rank_entry exec`` otherwise (each rank logs its
    collectives for the hang watch), the program itself with ``--no-python``."""
    if options.stage is not None:
        tracking = [
            a
            for flag, value in (("tensorboard", options.tensorboard), ("mlflow", options.mlflow))
            if value
            for a in (f"--{flag}", value)
        ]
        return RankCommand(
            True,
            RANK_ENTRY,
            (
                options.stage,
                str(out_dir),
                "--steps",
                options.steps,
                *tracking,
                "--",
                options.training_script,
                *options.training_script_args,
            ),
        )
    if options.no_python:
        return RankCommand(False, options.training_script, options.training_script_args)
    head = ("-m", options.training_script) if options.module else ("--", options.training_script)
    return RankCommand(True, RANK_ENTRY, ("exec", *head, *options.training_script_args))


@dataclass(slots=True)
class RankFailure:
    """One failed rank, as reported to the user."""

    rank: int
    local_rank: int
    exit_code: int
    tail: list[str]

    def describe(self) -> str:
        """``exit code 1`` or ``killed by SIGKILL``."""
        if self.exit_code < 0:
            try:
                return f"killed by {signal.Signals(-self.exit_code).name}"
            except ValueError:
                return f"killed by signal {-self.exit_code}"
        return f"exit code {self.exit_code}"

    def shell_code(self) -> int:
        """The exit code a shell would show (128 + signal for a signal)."""
        return 128 - self.exit_code if self.exit_code < 0 else (self.exit_code or 1)


def stderr_tail(log_dir: Path, local_rank: int, n: int = TAIL_LINES) -> list[str]:
    """Last ``n`` non-empty lines of ``local_rank``'s stderr in the newest attempt under ``log_dir``."""
    candidates = sorted(
        log_dir.glob(f"**/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime
    )
    if not candidates:
        return []
    lines = [ln.rstrip() for ln in candidates[-1].read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-n:]


def failure_report(failure: RankFailure, *, restarts: int, nnodes: str) -> str:
    """The paragraph printed when a rank fails."""
    where = f"rank {failure.rank}" + (
        f" (local rank {failure.local_rank} on this node)" if nnodes not in ("1", "1:1") else ""
    )
    head = f"scalpel launch: {where} failed: {failure.describe()}"
    if restarts:
        head += (
            f", after {restarts} restart{'s' if restarts != 1 else ''} (--max-restarts {restarts} used up)"
        )
    body = [head + "."]
    if failure.tail:
        body.append(f"last lines of rank {failure.rank}'s stderr:")
        body.extend(f"    {line}" for line in failure.tail)
    return "\n".join(body)


class _QuietAgent(logging.Filter):
    """Drop torchrun's banner lines a user cannot act on; keep its warnings and errors."""

    NOISE = ("OMP_NUM_THREADS", "Rendezvous info", "**************", "closing signal", "failed (exitcode")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in self.NOISE)


def launch(options: LaunchOptions, *, out_dir: Path, watch: WatchOptions | None = None) -> int:
    """Run torchrun as ``options`` ask (:meth:`LaunchOptions.from_args`), every rank through
    :func:`rank_command`; return the exit code for the shell.

    With ``watch``, a :class:`HangWatch` runs beside torchrun: a diagnosed hang ends the launch
    with :data:`HANG_EXIT` and its report; a failed rank's report names the first collective
    mismatch when the ranks' logs show one."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run as torchrun

    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    entry = rank_command(options, out_dir)
    tee = dict(options.torchrun).get("tee")
    args = options.torchrun_namespace(
        module=entry.module,
        training_script=entry.script,
        training_script_args=list(entry.args),
        log_dir=str(log_dir),
        tee="3" if not tee or tee == "0" else tee,  # console and files: the report reads the files
    )
    os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank ${rank}] ")
    os.environ["TORCHSCALPEL_LAUNCH"] = "1"  # setup() then leaves the rank prefix to us
    if options.single_node and Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if options.local_ranks > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, minus its warning
    quiet = _QuietAgent()
    handlers = logging.getLogger().handlers
    for h in handlers:
        h.addFilter(quiet)
    for name in AGENT_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    watcher = None
    if watch is not None:
        os.environ[COLLECTIVE_ENV] = str(watch.folder)
        from torchscalpel.distributed.flightrec import trace_env

        os.environ.update(trace_env(os.environ, watch.folder, watch.nccl_trace))
        watcher = HangWatch(watch)
        watcher.start()
    try:
        torchrun(args)
    except ChildFailedError as exc:
        if watcher is not None:
            watcher.stop()
            if watcher.hangs:
                watcher.fill_exit_codes({r: f.exitcode for r, f in exc.failures.items()})
                hang = watcher.hangs[-1]
                print(
                    f"scalpel launch: the job hung and was stopped: {hang['summary']}. "
                    f"Stacks and last collectives: {out_dir / 'hang.txt'}",
                    file=sys.stderr,
                )
                return HANG_EXIT
        rank, first = exc.get_first_failure()
        failure = RankFailure(
            rank=rank,
            local_rank=first.local_rank,
            exit_code=first.exitcode,
            tail=stderr_tail(log_dir, first.local_rank),
        )
        print(failure_report(failure, restarts=options.max_restarts, nnodes=options.nnodes), file=sys.stderr)
        mismatch = (watcher.mismatch or first_mismatch(watcher.logs())) if watcher is not None else None
        if mismatch is not None:
            print(f"scalpel launch: before it failed, {mismatch['message']}.", file=sys.stderr)
        print(f"scalpel launch: every rank's output is in {log_dir}", file=sys.stderr)
        return failure.shell_code()
    except SignalException as exc:
        # torchrun already forwarded the signal to every rank and waited for them to exit.
        name = signal.Signals(exc.sigval).name
        print(
            f"scalpel launch: stopped by {name}; every rank received it (a Checkpointer saves on SIGTERM). "
            f"Output is in {log_dir}",
            file=sys.stderr,
        )
        return 128 + int(exc.sigval)
    finally:
        if watcher is not None:
            watcher.stop()
            os.environ.pop(COLLECTIVE_ENV, None)
        for name in AGENT_LOGGERS:
            logging.getLogger(name).removeFilter(quiet)
        for h in handlers:
            with contextlib.suppress(ValueError):
                h.removeFilter(quiet)
    return 0
