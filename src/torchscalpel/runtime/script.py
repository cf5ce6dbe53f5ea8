"""Running a script or module as ``__main__`` in this process, as ``python SCRIPT`` would.

The session (:mod:`torchscalpel.runtime.session`) attaches the hooks; this module only runs the
code, turns ``sys.exit`` into an exit status, prints the script's own traceback, and keeps a
finished distributed script's objects alive as the script's own process would.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from torchscalpel.runtime.target import Target

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


def print_script_traceback(exc: BaseException) -> None:
    """The script's own traceback, without torchscalpel's frames above it."""
    tb = exc.__traceback__
    while tb is not None and not _is_user_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


def _is_user_frame(filename: str) -> bool:
    here = str(Path(__file__).resolve().parents[1])
    return not (filename.startswith(here) or "runpy" in filename or filename.startswith("<frozen runpy"))
