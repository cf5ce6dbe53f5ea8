"""Running a script or module as ``__main__`` in this process, as ``python SCRIPT`` would.

:func:`run_script` is the one way torchscalpel runs a target: under the hooks (the session,
:mod:`torchscalpel.runtime.session`), plainly (``scalpel run``), and on each rank of a launch
(:mod:`torchscalpel.distributed.rank_entry`). It runs the code, turns ``sys.exit`` / an exception /
Ctrl-C into an exit status as ``python`` would, prints the script's own traceback, and keeps a
finished distributed script's objects alive as the script's own process would. What differs between
those callers is an explicit :class:`ExecOptions` field.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torchscalpel.runtime.target import Target
from torchscalpel.runtime.userframes import Kind, file_kind, is_runner_file

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours torch or a script put into an error message)."""
    return _ANSI.sub("", text)


def one_line_error(exc: BaseException) -> str:
    """``Type: message``, first line only, at most 500 characters, without terminal colours (the
    record and every later reader get plain text)."""
    return strip_ansi(f"{type(exc).__name__}: {exc}").splitlines()[0][:500]


def run_as_main(target: Target) -> dict[str, Any]:
    """Execute the script or module as ``__main__`` with ``sys.path[0]`` set as Python would.

    Returns the script's globals (runpy's copy). The caller sets ``sys.argv`` and restores
    ``sys.argv`` / ``sys.path`` afterwards.
    """
    if target.module:
        sys.path.insert(0, os.getcwd())
        return runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    assert target.script is not None
    script = target.script.resolve()
    sys.path.insert(0, str(script if script.is_dir() else script.parent))
    return runpy.run_path(str(script), run_name="__main__")


_PARKED_GLOBALS: list[dict[str, Any]] = []
"""Globals of finished scripts that held a DDP model, kept until the process exits."""


def park_if_distributed(script_globals: dict[str, Any]) -> None:
    """Keep a finished script's DDP model alive instead of freeing it here.

    Why: a DDP model's Reducer owns the gloo process group; freeing it joins gloo's worker
    threads while this thread holds the GIL, and a worker still releasing a finished collective
    needs the GIL: a deadlock, seen on 2-rank CPU runs (py-spy: ``~Reducer`` -> ``~ProcessGroupGloo``
    -> ``thread::join`` against ``AsyncWork::~AsyncWork`` -> ``gil_scoped_acquire``). Under plain
    ``python SCRIPT`` these objects live until interpreter exit, so parking them keeps the script's
    own lifetime; the process then ends as the script's would.
    """
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    ddp_cls = getattr(ddp, "DistributedDataParallel", None)
    if ddp_cls is not None and any(isinstance(v, ddp_cls) for v in list(script_globals.values())):
        _PARKED_GLOBALS.append(script_globals)


def exit_code_of(code: Any) -> int:
    """The process exit status ``python`` gives for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _hide_runner_frames(te: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the runner's frames (torchscalpel's, runpy's) from ``te`` and the exceptions chained to it.

    Why every frame, not only those above the script: the wrappers torchscalpel puts on torch functions
    for a run (``torch.load``, ``load_state_dict``, ...) sit between the script's line and torch's, and
    ``python SCRIPT`` shows none of them. A traceback whose innermost frame is torchscalpel's keeps all
    of them: that error is ours, and hiding its frames would hide where it is.
    """
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    if not frames or file_kind(frames[-1].filename) is not Kind.SCALPEL:
        te.stack = traceback.StackSummary.from_list([f for f in frames if not is_runner_file(f.filename)])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _hide_runner_frames(chained, seen)


def print_script_traceback(exc: BaseException) -> None:
    """The script's own traceback as ``python SCRIPT`` prints it: without the frames of the runner
    (torchscalpel's and runpy's), above the script or between its lines and torch's (a SyntaxError in
    the script itself then shows only the offending line, as python shows it)."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _hide_runner_frames(te, set())
    print("".join(te.format()), end="", file=sys.stderr)


INTERRUPTED = 130
"""The exit status a shell reports for a program ended by Ctrl-C (128 + SIGINT)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ExecOptions:
    """How :func:`run_script` treats the ways a script can end, where its callers need different things."""

    interrupt: Literal["exit", "raise"] = "exit"
    """Ctrl-C: ``exit`` ends the run with status 130 and the caller carries on (writes its record, prints
    its summary); ``raise`` lets the ``KeyboardInterrupt`` go, so that a process that is only the script
    (a launched rank) dies of SIGINT as ``python SCRIPT`` does, which is what torchrun expects to see."""
    restore_sys: bool = True
    """Put ``sys.argv`` and ``sys.path`` back afterwards: the caller's process goes on after the script.
    False where the process ends with the script (a rank): the script's ``sys.path[0]`` then stays, as
    under ``python SCRIPT``, for its atexit handlers and the late imports of threads it left running."""
    passthrough: tuple[type[BaseException], ...] = ()
    """Exceptions the caller handles itself (the session's stop-after-N-steps, ``--memory-limit``): re-raised
    after the restore, not taken for the script's failure."""

    def __post_init__(self) -> None:
        if self.interrupt not in ("exit", "raise"):
            raise ValueError(f"interrupt must be 'exit' or 'raise', not {self.interrupt!r}")


@dataclass(slots=True, frozen=True)
class ScriptOutcome:
    """How the script ended."""

    status: Literal["complete", "failed", "interrupted"]
    """``complete``: it returned or exited 0; ``failed``: a non-zero exit or an exception; ``interrupted``: Ctrl-C."""
    exit_code: int
    """What ``python SCRIPT`` would have exited with."""
    error: str | None = None
    """One line for the record (None when it completed)."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    """What the script raised when it failed (``SystemExit`` for a non-zero exit), for the caller's
    observers (the doctor's crash finding); never stored: it holds the script's frames."""


def run_script(
    target: Target, options: ExecOptions | None = None, *, before: Callable[[], object] | None = None
) -> ScriptOutcome:
    """Run ``target`` as ``__main__`` with its argv, as ``python SCRIPT ARGS`` would; how it ended.

    ``before`` runs first, inside the same guard (the session attaches its hooks there: a set-up that
    fails is the run's failure, reported as the script's would be). ``sys.exit(code)`` gives ``code``
    (a message is printed and gives 1), an exception its own traceback and 1, Ctrl-C 130 or, with
    ``interrupt="raise"``, the ``KeyboardInterrupt`` itself.
    """
    options = options or ExecOptions()
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    try:
        if before is not None:
            before()
        sys.argv = target.argv()
        park_if_distributed(run_as_main(target))
    except options.passthrough:
        raise
    except SystemExit as exc:
        code = exit_code_of(exc.code)
        return ScriptOutcome(
            "failed" if code else "complete",
            code,
            f"the script exited with code {code}" if code else None,
            exc if code else None,
        )
    except KeyboardInterrupt:
        if options.interrupt == "raise":
            raise
        return ScriptOutcome("interrupted", INTERRUPTED, "interrupted (Ctrl-C)")
    except BaseException as exc:  # the script's own error: its traceback and exit 1, as python prints them
        print_script_traceback(exc)
        return ScriptOutcome("failed", 1, one_line_error(exc), exc)
    finally:
        if options.restore_sys:
            sys.argv, sys.path[:] = saved_argv, saved_path
    return ScriptOutcome("complete", 0)
