"""Scalpel's console and progress bars (rich), on the lowest floor: every stage's renderer and every
long-running stage use them, so they may import nothing of the package but the record's types."""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
import time
import tokenize
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
)
from rich.table import Column
from rich.text import Text

if TYPE_CHECKING:
    from torchscalpel.record import StepRecord

PIPE_WIDTH = 200
"""Columns when the output is not a terminal (a pipe, a file, CI) and ``COLUMNS`` is unset: wide enough
for the tune table; plain lines are never wrapped there at all (soft wrap)."""


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A rich console for scalpel's output. On a terminal: rich's own width. Elsewhere (piped, redirected,
    CI): :data:`PIPE_WIDTH` columns and soft wrapping, so a line is never broken and code is never cut at
    80 columns; with ``COLUMNS`` set, that width, wrapped between words. An explicit ``width`` wins."""
    probe = Console(stderr=stderr)
    if probe.is_terminal or "width" in kwargs:
        return Console(stderr=stderr, **kwargs)
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    # on a pipe every line ends at its last character: rich pads a table or grid row to the table's width
    # (env's grid to its widest value), which a log, grep or diff should never see
    unpadded = cast(
        "IO[str]", UnpaddedWriter(stderr=stderr, target=kwargs.pop("file", None))
    )  # a TextIOBase: what rich writes to
    if columns > 0:
        # COLUMNS set on a pipe (a log viewed in an 80-column pane): lines wrap between words at that
        # width, as on a terminal of that size; code and paths are printed with soft_wrap and stay whole
        return Console(file=unpadded, width=columns, **kwargs)
    return Console(file=unpadded, width=PIPE_WIDTH, soft_wrap=True, **kwargs)


class UnpaddedWriter(io.TextIOBase):
    """A text stream over the process's stdout (or stderr, or a given ``target``) that drops the spaces ending each line. The stream is
    looked up at every write (a test or a redirect may replace ``sys.stdout`` after the console was made), and
    only a run of spaces not yet followed by anything is held back, so output still streams line by line."""

    def __init__(self, *, stderr: bool = False, target: Any = None) -> None:
        super().__init__()
        self._stderr = stderr
        self._fixed = target
        self._held = ""

    @property
    def _target(self) -> Any:
        if self._fixed is not None:
            return self._fixed
        return sys.stderr if self._stderr else sys.stdout

    def write(self, text: str) -> int:
        """Write ``text`` without the spaces before each newline; trailing spaces wait for what follows."""
        if not text:
            return 0
        lines = (self._held + text).split("\n")
        last = lines.pop()
        out = "".join(line.rstrip(" ") + "\n" for line in lines)
        kept = last.rstrip(" ")
        self._held = last[len(kept) :]
        self._target.write(out + kept)
        return len(text)

    def flush(self) -> None:
        """Flush the stream underneath (held spaces stay held: they end a line unless more follows)."""
        self._target.flush()

    def isatty(self) -> bool:
        """Whether the stream underneath is a terminal (never, where this writer is used)."""
        return bool(self._target.isatty())

    def fileno(self) -> int:
        """The stream underneath's file descriptor (rich asks it for the terminal's size)."""
        return int(self._target.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The stream underneath's encoding (rich picks its box characters by it)."""
        return str(getattr(self._target, "encoding", None) or "utf-8")


_FIGURE_END = re.compile(r"(?:^|[^\w.])[-+±~≈]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?$")
_UNIT_START = re.compile(
    r"(?:ms/step|s/step|ms|µs|us|ns|s|%|x|B|KiB|MiB|GiB|TiB|kB|MB|GB|[kMGTP]?FLOP(?:/s)?|samples/s|steps/s)"
    r"(?![\w/])"
)


def _words(plain: str, start: int, end: int) -> list[list[int]]:
    """[start, end] of each unbreakable run of tokens in ``plain[start:end]``: a unit stays with its figure."""
    words: list[list[int]] = []
    for m in re.compile(r"\S+").finditer(plain, start, end):
        if words and _FIGURE_END.search(plain[words[-1][0] : words[-1][1]]) and _UNIT_START.match(m.group()):
            words[-1][1] = m.end()
        else:
            words.append([m.start(), m.end()])
    return words


def wrap_spans(
    plain: str, width: int, *, hang: int = 0, sep: str | None = None
) -> list[tuple[int, int, int]]:
    """Where to break ``plain`` to fit ``width`` columns: ``(start, end, indent)`` per line. Breaks only at
    spaces, never between a figure and its unit (``4.23 MFLOP/s``, ``1.6 MiB``, ``12 ms``): rich's own wrap
    breaks at any space, and at 80 columns left ``4.23`` at the end of one line and ``MFLOP/s`` on the next.
    With ``sep`` (``" · "`` between ``name value`` pairs), only at a separator, which the break drops, while a
    pair fits a line. A continuation line is indented like the first line, plus ``hang``; a word longer than
    the line is left whole (a path: the terminal wraps it, and copies it back as one)."""
    lead = len(plain) - len(plain.lstrip(" "))
    words: list[list[int]] = []  # [start, end] of each unbreakable run
    if sep:
        start = lead
        for end in [m.start() for m in re.finditer(re.escape(sep), plain)] + [len(plain)]:
            if end - start <= width - lead - hang:
                words.append([start, end])
            else:
                words += _words(plain, start, end)
            start = end + len(sep)
    else:
        words = _words(plain, 0, len(plain))
    if not words:
        return [(0, len(plain), 0)]
    lines: list[tuple[int, int, int]] = []
    start, end, indent = words[0][0], words[0][1], lead
    for w_start, w_end in words[1:]:
        if indent + (w_end - start) > width:
            lines.append((start, end, indent))
            start, indent = w_start, lead + hang
        end = w_end
    lines.append((start, end, indent))
    return lines


def say(
    out: Console, text: str | Text, *, markup: bool = False, hang: int = 0, sep: str | None = None
) -> None:
    """Print one line of prose that holds figures, wrapped at the console's width between words but never
    between a figure and its unit (:func:`wrap_spans`). ``text``: plain (``markup`` False, the default: a
    ``[2, 3]`` in it stays as it is) or rich markup, or a :class:`~rich.text.Text`. On a pipe without
    ``COLUMNS`` (:func:`make_console`'s soft wrap) the line is printed whole, as before. ``hang`` and
    ``sep``: as :func:`wrap_spans`."""
    line = text if isinstance(text, Text) else Text.from_markup(text) if markup else Text(text)
    if out.soft_wrap:
        out.print(line, soft_wrap=True, highlight=False)
        return
    for start, end, indent in wrap_spans(line.plain, out.width, hang=hang, sep=sep):
        piece = line[start:end]
        if indent:
            piece = Text.assemble(" " * indent, piece)
        out.print(piece, soft_wrap=True, highlight=False)


def say_command(out: Console, lead: str, command: str, tail: str = "") -> None:
    """A line that hands the user a command (``next: ... scalpel tune -- train.py``): whole when it fits the
    width (or on a pipe); otherwise the words around it wrapped by :func:`say` and the command on a line of its
    own, indented, never broken (a command cut at the terminal's edge, mid-path, no longer copies). Plain text."""
    whole = " ".join(x for x in (lead, command, tail) if x)
    if out.soft_wrap or len(whole) <= out.width:
        out.print(Text(whole), soft_wrap=True, highlight=False)
        return
    head = f"{lead} {command}" if lead else command
    if len(head) <= out.width:
        out.print(Text(head), soft_wrap=True, highlight=False)
    else:
        if lead:
            say(out, lead)
        # indented when the indent still fits: a command one indent too long keeps its row by losing it
        indent = "  " if len(command) + 2 <= out.width else ""
        out.print(Text(indent + command), soft_wrap=True, highlight=False)
    if tail:
        say(out, "  " + tail)


def say_lines(lines: Iterable[str], *, stderr: bool = False) -> None:
    """Plain lines on standard output (``stderr``: on standard error), each through :func:`say`: what the
    stages that print plain text lines (memory, lr, batch, plan) print, fitted to the terminal."""
    out = make_console(stderr=stderr, highlight=False)
    for text in lines:
        say(out, text)
    (sys.stderr if stderr else sys.stdout).flush()


def fit_code(code: str, width: int) -> str:
    """``code`` (Python lines) re-laid to ``width`` columns and still valid: a line that does not fit has its
    trailing comment moved to a line of its own above it, then is broken after the commas inside its
    brackets (continuation lines indented four more). A terminal wraps a long code line anywhere, and the
    copy no longer parses: tune's ``with torch.autocast(...):  # around the model call`` (91 characters)
    at 80 columns was the issue's example. A line that cannot be broken so is left whole."""
    out: list[str] = []
    for line in code.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if line.lstrip().startswith("#"):  # a comment line of its own: wrapped as comment lines
            text = line.lstrip().lstrip("#").strip()
            out.extend(
                f"{indent}# {piece}" for piece in textwrap.wrap(text, max(20, width - len(indent) - 2))
            )
            continue
        statement, comment = _split_comment(line)
        if comment:
            for piece in textwrap.wrap(comment.lstrip("# "), max(20, width - len(indent) - 2)):
                out.append(f"{indent}# {piece}")
            line = statement.rstrip()
        out.extend(_break_in_brackets(line, width) if len(line) > width else [line])
    return "\n".join(out)


def _split_comment(line: str) -> tuple[str, str]:
    """(the code, its trailing ``# comment``), by the tokenizer, so a ``#`` inside a string stays."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.lstrip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return line, ""
    offset = len(line) - len(line.lstrip())
    for tok in tokens:
        if tok.type == tokenize.COMMENT and line[: offset + tok.start[1]].strip():
            return line[: offset + tok.start[1]], tok.string
    return line, ""


def _break_in_brackets(line: str, width: int) -> list[str]:
    """``line`` broken after each comma inside brackets where the line would pass ``width``."""
    offset = len(line) - len(line.lstrip())
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.lstrip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return [line]
    depth, cuts = 0, []
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.OP and tok.string == "," and depth > 0:
            cuts.append(offset + tok.end[1])
    if not cuts:
        return [line]
    pieces: list[str] = []
    start = 0
    hang = " " * (offset + 4)
    for i, cut in enumerate(cuts):
        following = cuts[i + 1] if i + 1 < len(cuts) else len(line)
        prefix = len(hang) if pieces else 0
        if prefix + len(line[start:following].strip()) > width and cut > start:
            pieces.append(line[start:cut].rstrip() if not pieces else hang + line[start:cut].strip())
            start = cut
    pieces.append(hang + line[start:].strip() if pieces else line[start:])
    return pieces


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


def clock_text(seconds: float | None) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour); ``-:--`` while unknown."""
    if seconds is None:
        return "-:--"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def time_left(steps_left_s: float | None, elapsed_s: float | None, time_cap_s: float | None) -> float | None:
    """The time a run has left: the estimate from its steps, but never more than its time cap leaves
    (a doctor run with 78 s left under its 120 s cap showed ``2:10 left`` from the steps alone).
    None while neither is known."""
    cap_left = None
    if time_cap_s is not None and elapsed_s is not None:
        cap_left = max(0.0, time_cap_s - elapsed_s)
    if steps_left_s is None:
        return cap_left
    return steps_left_s if cap_left is None else min(steps_left_s, cap_left)


class TimesColumn(ProgressColumn):
    """Elapsed and time left in one short column (``0:05 · 0:10 left``): rich's two clock columns and the
    word between them took 25 columns, and at 80 columns the table cut them to ``0:0… left 0:00:…``.
    A task with a ``time_cap_s`` field shows no more time left than the cap leaves."""

    def render(self, task: Task) -> Text:
        left = time_left(task.time_remaining, task.elapsed, task.fields.get("time_cap_s"))
        return Text(f"{clock_text(task.elapsed)} · {clock_text(left)} left", style="progress.remaining")


def stage_progress(out: Console) -> Progress:
    """The one progress style of every long stage: label, bar, ``N of M``, the step's info, elapsed and time
    left. The figures never wrap (no_wrap); at a narrow width the label gives way first (ellipsis), then
    the bar, so an 80-column terminal shows every number whole on one line."""
    return Progress(
        TextColumn(
            "[bold]{task.description}",
            table_column=Column(no_wrap=True, overflow="ellipsis", ratio=2, min_width=8),
        ),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=4)),
        OfTotalColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[info]}", table_column=Column(no_wrap=True)),
        TimesColumn(table_column=Column(no_wrap=True)),
        console=out,
        expand=True,
        transient=True,
        redirect_stdout=True,
        redirect_stderr=True,
    )


HEARTBEAT_S = 30.0
"""Seconds between progress lines when the output is not a terminal (a CI log): the bar is not drawn
there, and a long run that printed nothing until it ended looked hung."""


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

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        out: Console | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
        time_cap_s: float | None = None,
    ) -> None:
        """``time_cap_s``: the run's time cap (doctor's --time-cap), so the time left never exceeds it."""
        self.console = out if out is not None else console()
        self.enabled = self.console.is_terminal
        self.total = total
        self.done = 0
        self.label = label
        self.heartbeat_s = heartbeat_s
        self._clock = clock
        self.time_cap_s = time_cap_s
        self._started = clock()
        self._last_beat = self._started
        self._beat_done = 0
        self._beat_ms: list[float] = []
        self._progress = stage_progress(self.console)
        self._task = self._progress.add_task(label, total=total, info="starting", time_cap_s=time_cap_s)

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
        if not self.enabled:
            self._beat_ms.append(step.total_ms)
            self._heartbeat()

    def _heartbeat(self) -> None:
        """Off a terminal: one line every ``heartbeat_s`` seconds (``step 40 of 200, 12.3 ms/step, 25 s
        left``). The time left comes from the wall clock per step since the last line (it includes what the
        script does between steps); ms/step is the steps' own measured mean since then."""
        now = self._clock()
        waited = now - self._last_beat
        if waited < self.heartbeat_s or self.done <= self._beat_done:
            return
        per_step_s = waited / (self.done - self._beat_done)
        mean_ms = sum(self._beat_ms) / len(self._beat_ms)
        of = f" of {self.total}" if self.total is not None else ""
        steps_left = None if self.total is None else max(0.0, (self.total - self.done) * per_step_s)
        remaining = time_left(steps_left, now - self._started, self.time_cap_s)
        left = "" if remaining is None else f", {remaining:.0f} s left"
        self.console.print(
            f"{self.label}: step {self.done}{of}, {mean_ms:.1f} ms/step{left}",
            highlight=False,
            soft_wrap=True,
        )
        self._last_beat, self._beat_done, self._beat_ms = now, self.done, []


class Phase:
    """One line as a long phase starts (``verify: plain run of the patched copy ...``) and one as it ends
    (``verify: plain run of the patched copy: exit 0 (41 s)``), on stderr: what fix --verify, plan and the
    demo's analyze printed nothing during for minutes. Plain lines, no bar, so a CI log reads the same as a
    terminal. Set ``outcome`` inside the block to say how it ended (``done`` when not set)."""

    def __init__(
        self,
        prefix: str,
        label: str,
        *,
        out: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out if out is not None else console()
        self.prefix, self.label, self.outcome = prefix, label, "done"
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> Phase:
        say(self.out, f"{self.prefix}: {self.label} ...")
        self._start = self._clock()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = self._clock() - self._start
        outcome = self.outcome if et is None else "stopped" if et is KeyboardInterrupt else "failed"
        say(self.out, f"{self.prefix}: {self.label}: {outcome} ({seconds:.0f} s)")
