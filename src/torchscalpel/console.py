"""Scalpel's console and progress bars (rich), on the lowest floor: every stage's renderer and every
long-running stage use them, so they may import nothing of the package but the record's types."""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

if TYPE_CHECKING:
    from torchscalpel.record import StepRecord

PIPE_WIDTH = 200
"""Columns when the output is not a terminal (a pipe, a file, CI) and ``COLUMNS`` is unset: wide enough
for the tune table; plain lines are never wrapped there at all (soft wrap)."""


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A rich console for scalpel's output. On a terminal: rich's own width. Elsewhere (piped, redirected,
    CI): ``COLUMNS`` or :data:`PIPE_WIDTH` columns and soft wrapping, so a line is never broken mid-word
    and code is never cut at 80 columns. An explicit ``width`` wins."""
    probe = Console(stderr=stderr)
    if probe.is_terminal or "width" in kwargs:
        return Console(stderr=stderr, **kwargs)
    try:
        width = int(os.environ.get("COLUMNS", "")) or PIPE_WIDTH
    except ValueError:
        width = PIPE_WIDTH
    return Console(stderr=stderr, width=width, soft_wrap=True, **kwargs)


def rule(out: Console, title: str) -> None:
    """A section heading: rich's full-width rule on a terminal; in a pipe a short ``── title ──`` line
    (a rule across the pipe width would be 200 dashes in a log)."""
    if out.is_terminal:
        out.rule(title)
    else:
        out.print(f"── {title} " + "─" * max(4, 72 - len(Text.from_markup(title).plain)))


def console() -> Console:
    """The console for scalpel's own output: stderr, so a script's stdout stays clean for pipes."""
    return make_console(stderr=True, highlight=False)


class OfTotalColumn(ProgressColumn):
    """``N of M`` (``N`` alone while the total is unknown)."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        return Text(
            f"{done} of {int(task.total)}" if task.total is not None else f"{done}", style="progress.download"
        )


def stage_progress(out: Console) -> Progress:
    """The one progress style of every long stage: label, bar, ``N of M``, the step's info, elapsed, time left."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        OfTotalColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=out,
        transient=True,
        redirect_stdout=True,
        redirect_stderr=True,
    )


class TerminalProgress:
    """One :func:`stage_progress` bar, drawn only on a terminal (nothing in a pipe or a log, so a bad input
    stays a one-line error), as a context manager; subclasses turn their stage's events into ``update``."""

    def __init__(self, label: str, total: int | None, info: str) -> None:
        self.console = console()
        self.enabled = self.console.is_terminal
        self._progress = stage_progress(self.console)
        self._task = self._progress.add_task(label, total=total, info=info)

    def __enter__(self) -> TerminalProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._progress.stop()

    def show(self, **fields: Any) -> None:
        """Update the bar (``completed``, ``total``, ``info``)."""
        self._progress.update(self._task, **fields)


class StepProgress:
    """A progress bar over the steps, updated from the runtime's step-end events.

    The script's own prints still appear (rich redirects them above the bar); on a non-terminal
    stream the bar is not drawn, so logs stay readable.
    """

    def __init__(self, total: int | None, label: str) -> None:
        self.console = console()
        self.enabled = self.console.is_terminal
        self.total = total
        self.done = 0
        self._progress = stage_progress(self.console)
        self._task = self._progress.add_task(label, total=total, info="starting")

    def __enter__(self) -> StepProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self._progress.stop()

    def update(self, step: StepRecord) -> None:
        """Advance by one step and show its time and loss."""
        loss = f" loss {step.loss:.4g}" if step.loss is not None else ""
        tag = (
            "warm-up"
            if step.warmup
            else ("counting FLOPs" if step.flops_counted else "profiled" if step.profiled else "step")
        )
        self.done += 1
        if self.total is not None and self.done > self.total:
            # more steps than planned (a step kind merged late, an evaluation step): grow the total
            # rather than show "13 of 12"
            self.total = self.done
        self._progress.update(
            self._task, completed=self.done, total=self.total, info=f"{tag} {step.total_ms:.1f} ms{loss}"
        )
