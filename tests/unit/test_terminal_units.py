"""Terminal helpers: ANSI stripped from copied messages, pipe width, progress that never passes its total."""

from __future__ import annotations

import io

from rich.console import Console

from torchscalpel import console as terminal
from torchscalpel.console import OfTotalColumn, StepProgress, make_console
from torchscalpel.record import StepRecord
from torchscalpel.runtime.script import strip_ansi


def test_ansi_escapes_are_stripped():
    assert (
        strip_ansi("\x1b[31mRuntimeError\x1b[0m: shapes \x1b[1m(2, 3)\x1b[22m")
        == "RuntimeError: shapes (2, 3)"
    )
    assert strip_ansi("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\") == "link"


def test_piped_console_is_wide_and_soft_wraps(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    c = make_console()
    assert not c.is_terminal and c.width == terminal.PIPE_WIDTH and c.soft_wrap
    monkeypatch.setenv("COLUMNS", "132")
    assert make_console().width == 132
    buf = io.StringIO()
    wide = Console(file=buf, width=terminal.PIPE_WIDTH, soft_wrap=True)
    wide.print("word " * 60)
    assert buf.getvalue().count("\n") == 1  # one line, not wrapped at 80


def test_progress_grows_its_total_instead_of_overshooting():
    bar = StepProgress(12, "profiling x")
    for i in range(15):
        bar.update(StepRecord(index=i, total_ms=1.0))
    task = bar._progress.tasks[0]
    assert task.completed == 15 and task.total == 15
    assert str(OfTotalColumn().render(task)) == "15 of 15"
