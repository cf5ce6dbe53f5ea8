"""tests/unit starts no process: every way to start one fails the test, naming what it tried.

A child process (a Python interpreter importing torch, a compiler, a launch) is what makes a test slow on a
loaded machine, and ``make test-fast`` runs tests/unit as the edit loop in under 3 minutes. So while a unit
test's setup, call and teardown run (module- and session-scoped fixtures included, which is why these are
hook wrappers rather than a function-scoped autouse fixture), the entry points below raise
:class:`AssertionError` instead of starting anything. A test that needs a process goes to tests/integration
(or tests/distributed with the ``dist`` marker for a process group of several ranks).

These hooks apply only to tests collected under this folder: pytest calls a conftest's runtest hooks for the
items below it, so a whole-suite ``pytest tests`` still lets tests/integration start its processes.
``tests/unit/test_no_process_guard.py`` fails when the guard is gone.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

GUARD_MESSAGE = "tests/unit must not start a process: move this test to tests/integration"


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        shown = ", ".join([repr(a)[:120] for a in args[:3]])
        raise AssertionError(f"{GUARD_MESSAGE} ({what}({shown}))")

    refuse.__name__ = f"refuse_{what.rsplit('.', 1)[-1]}"
    return refuse


def _popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    # Popen.__init__ is where subprocess.run, call, check_call, check_output, getoutput and os.popen all
    # start their child; `args` is the command, the most useful thing to name.
    raise AssertionError(f"{GUARD_MESSAGE} (subprocess.Popen({args!r:.200}))")


def _targets() -> Iterator[tuple[object, str, Callable[..., Any]]]:
    yield subprocess.Popen, "__init__", _popen_init
    # multiprocessing's resource tracker and forkserver start their helper through this function directly.
    yield _posixsubprocess, "fork_exec", _refuse("_posixsubprocess.fork_exec")
    # os.spawn* fork through the module's own `fork`, so patching os.fork covers them.
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            yield os, name, _refuse(f"os.{name}")
    yield multiprocessing.process.BaseProcess, "start", _refuse("multiprocessing.Process.start")
    # torch.multiprocessing is imported only if a test imported torch already: the guard must not import it.
    tmp = sys.modules.get("torch.multiprocessing")
    if tmp is not None:
        spawn_module = sys.modules.get("torch.multiprocessing.spawn")
        for owner in (tmp, spawn_module):
            if owner is None:
                continue
            for name in ("spawn", "start_processes"):
                if callable(getattr(owner, name, None)):
                    yield owner, name, _refuse(f"torch.multiprocessing.{name}")


@contextmanager
def _no_process() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for owner, name, replacement in _targets():
            patch.setattr(owner, name, replacement)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _no_process():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _no_process():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    with _no_process():
        return (yield)
