"""Terminal output of ``scalpel tune``: progress while trials run, the ranked table, the verdict.

The table and the verdict are drawn from the record's tune section (:func:`render`), the data the page draws
(:func:`torchscalpel.report.tune_sections.build`), never from the live search. A cell never wraps: a note too
long for the width becomes a numbered footnote below the table, and prose is wrapped between words at the
console's width, on a pipe too (a CI log greps one row per variant)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from torchscalpel.console import console as default_console
from torchscalpel.console import fit_code, say_command, wrap_spans
from torchscalpel.envcheck.host_checks import check_machine_busy
from torchscalpel.sections import TuneSection
from torchscalpel.tune.result import TuneResult
from torchscalpel.tune.speedup import RANK_ORDER, speedup_of
from torchscalpel.tune.states import TrialStatus, Verdict
from torchscalpel.units import fmt_bytes

if TYPE_CHECKING:
    from torchscalpel.tune.runner import TrialResult

VERDICT_STYLE: dict[Verdict, str] = {
    Verdict.WINNER: "bold green",
    Verdict.FASTER: "green",
    Verdict.BASELINE: "bold",
    Verdict.NOT_FASTER: "yellow",
    Verdict.NUMERICS: "red",
    Verdict.NOT_CONFIRMED: "yellow",
    Verdict.FAILED: "red",
    Verdict.TIMEOUT: "red",
    Verdict.SKIPPED: "dim",
    Verdict.NOT_APPLIED: "dim",
    Verdict.NOT_RUN: "dim",
}


class RichProgress:
    """One line per finished trial, and a spinner with the running trial's name and time limit."""

    def __init__(self, out: Console | None = None) -> None:
        self.console = out or default_console()
        self._status: Any = None
        self._n = 0
        self._of = ""
        self._left = 0.0

    def message(self, text: str) -> None:
        # wrapped between words at the width, piped too: a "plan:" line with its reasons ran to 321 columns
        say_wrapped(self.console, Text(text, style="dim"), hang=2)

    def trial_started(
        self, label: str, limit_s: float, *, index: int = 0, total: int = 0, left_s: float = 0.0
    ) -> None:
        self._n = index or self._n + 1
        self._of = f" of {total}" if total else ""
        self._left = left_s
        if self.console.is_terminal:
            self._status = self.console.status(
                f"trial {self._n}{self._of}: {label} "
                f"(limit {limit_s:.0f} s, {left_s:.0f} s of the budget left)"
            )
            self._status.start()

    def trial_finished(self, result: TrialResult) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if result.ok and result.status == TrialStatus.OK:
            info = f"{result.median_ms:.1f} ms/step"
        else:
            info = f"[red]{result.status}[/]: {escape(result.cause)}"
        left = max(0.0, self._left - result.wall_s)
        say_wrapped(
            self.console,
            Text.from_markup(
                f"  trial {self._n}{self._of}: [bold]{escape(result.label)}[/] {info} "
                f"[dim]({result.wall_s:.0f} s, {left:.0f} s left)[/]"
            ),
            hang=2,
        )
        for ex in (getattr(result, "compile", None) or {}).get("excluded") or []:
            # said on its own line as it happens: in the final table it is one wrapped cell among many
            self.console.print(
                f"    compile failed in {ex.get('function')} ({ex.get('where')}): excluded with "
                "torch.compiler.disable and retried once",
                markup=False,
                highlight=False,
            )


def fmt_ms(value: float | None) -> str:
    """Milliseconds with one decimal, or ``-``."""
    return f"{value:.1f}" if value is not None else "-"


def compile_summary(stats: dict[str, Any]) -> str:
    """Compile triage in one cell: fullgraph, breaks (file:line reason), recompiles (guard), exclusions."""
    if not stats:
        return ""
    parts: list[str] = []
    for ex in stats.get("excluded") or []:
        parts.append(
            f"compile failed in {ex.get('function')} ({ex.get('where')}): excluded with "
            f"torch.compiler.disable, retried once ({ex.get('cause', '')})"
        )
    full = stats.get("fullgraph") or {}
    if full.get("attempted"):
        parts.append(
            "fullgraph: one graph, no breaks"
            if full.get("ok")
            else f"fullgraph failed at {full.get('where') or '?'}: {full.get('reason', '')}"
        )
    breaks = stats.get("breaks") or []
    if breaks:
        shown = "; ".join(f"{b.get('where') or '?'} {b.get('reason', '')}" for b in breaks[:3])
        parts.append(f"{len(breaks)} graph break(s): {shown}")
    elif stats.get("graph_breaks"):
        parts.append(f"{stats['graph_breaks']} graph break(s): {'; '.join(stats.get('break_reasons') or [])}")
    guards = stats.get("recompile_guards") or []
    if guards:
        parts.append(f"{len(guards)} recompile(s): " + "; ".join(f"{g.get('guard', '')}" for g in guards[:2]))
    elif stats.get("recompiles"):
        parts.append(f"{stats['recompiles']} recompile(s): {'; '.join(stats.get('recompile_reasons') or [])}")
    return " | ".join(parts)


def row_cells(trial: TrialResult, *, full: bool = False) -> list[str]:
    """Cells of one ranked-table row (shared with the HTML report).

    ``speedup`` is :func:`~torchscalpel.tune.speedup.speedup_of` (the one definition every output
    uses), and ``vs baseline ms`` / ``step ms`` are the two runs it is the ratio of: the screening pair
    (the baseline re-measure just before the trial, and the trial), or for a confirmed candidate the
    confirmation pair with the median ratio, the lowest-highest pair in ``spread``. ``full`` gives the
    whole reason (the HTML report); the terminal shows its short form.
    """
    compile_ms = trial.compile.get("compile_ms") if trial.compile else None
    dev = "-" if trial.deviation is None else f"{trial.deviation:.1e}"
    measured = speedup_of(trial)
    screened = ""
    if measured.confirmed and trial.baseline_ms and trial.median_ms:
        screened = (
            f"screened {trial.baseline_ms / trial.median_ms:.2f}x "
            f"({fmt_ms(trial.baseline_ms)} / {fmt_ms(trial.median_ms)} ms) before confirmation"
        )
    why = "; ".join(p for p in (trial.note or trial.cause, screened, compile_summary(trial.compile)) if p)
    if measured.ratio is None:
        step, ref, ratio, spread = fmt_ms(trial.median_ms), "-", "-", "-"
    elif trial.verdict == Verdict.BASELINE:
        step = ref = fmt_ms(trial.median_ms)
        ratio, spread = measured.text(), "-"
    else:
        step, ref = fmt_ms(measured.candidate_ms), fmt_ms(measured.baseline_ms)
        ratio, spread = measured.text(), measured.spread_text()
    return [
        trial.label,
        step,
        ref,
        ratio,
        end_to_end_cell(trial),
        spread,
        f"{compile_ms / 1000:.1f} s" if compile_ms else "-",
        fmt_bytes(trial.peak_bytes) if trial.peak_bytes else "-",
        dev,
        str(trial.verdict),
        (trial.reason if full else trial.reason_short or trial.reason) or "-",
        why,
    ]


HEADERS = [
    "variant",
    "step ms",
    "vs baseline ms",
    "speedup",
    "end to end",
    "spread",
    "compile",
    "peak mem",
    "loss dev",
    "verdict",
    "why tried",
    "result",
]
NUMERIC = [False, True, True, True, True, False, True, True, True, False, False, False]
"""Which columns hold figures (right-aligned)."""
TABLE_NOTE = (
    "speedup = 'vs baseline ms' / 'step ms' of the same row (per step), two runs measured beside each other: "
    "the baseline re-measured just before the trial, or for a confirmed candidate the interleaved pair with "
    "the median ratio ('spread': lowest-highest pair); the recommendation, report.html, run.json and "
    "code.txt show the same figure. 'end to end' counts a start-up cost (compile, workers) over the run's "
    "steps when its arguments give them"
)


def end_to_end_cell(trial: TrialResult) -> str:
    """The end-to-end speedup over the run's steps with the start-up counted (``1.75x``), ``pays back
    after 95 steps`` when the run's length is not known, or ``-`` (no start-up cost: the per-step figure
    is the end-to-end one)."""
    payback = trial.payback or {}
    if not payback:
        return "-"
    if payback.get("end_to_end") is not None:
        return f"{payback['end_to_end']:.2f}x"
    steps = payback.get("steps")
    return f"after {steps:,} steps" if steps is not None else "never"


def noise_line(noise: float | None, runs: int | None) -> str:
    """``baseline noise 4.1% over 5 baseline runs``, or why it is not measured (``runs`` None: a record
    older than the list of baseline runs, whose stated noise is shown as it is)."""
    if runs is None:
        return f"baseline noise {noise or 0.0:.1%}"
    if noise is None or runs < 2:
        return (
            f"baseline noise not measured: {runs} plain baseline run{'s' if runs != 1 else ''} (it needs two)"
        )
    return f"baseline noise {noise:.1%} over {runs} baseline runs"


FEW_PAIRS = 3
"""Below this many confirmation pairs the recommendation carries a re-measure note."""


TABLE_MIN_WIDTH = 150
"""Below this many columns the ranked table's eleven columns collapse to 1-4 characters (the issue's
80-column tmux: step ms shown as "4", the why and result columns gone): one block per variant instead."""
NOTE_COLUMNS = (HEADERS.index("why tried"), HEADERS.index("result"))
"""The columns of prose; the others hold figures and short words."""
NOTE_CELL = 24
"""A note longer than this becomes a numbered footnote when the table would not fit with it in its cell."""


def say_wrapped(c: Console, text: str | Text, *, hang: int = 0) -> None:
    """One line of prose wrapped between words at the console's width (:func:`~torchscalpel.console.wrap_spans`:
    never between a figure and its unit), on a pipe too: tune's prose runs to hundreds of columns (a plan line
    with its reasons, a compile note) and a CI log shows it whole on one line otherwise."""
    line = text if isinstance(text, Text) else Text(text)
    for start, end, indent in wrap_spans(line.plain, c.width, hang=hang):
        piece = line[start:end]
        if indent:
            piece = Text.assemble(" " * indent, piece)
        c.print(piece, soft_wrap=True, highlight=False)


def print_ranked_blocks(c: Console, result: TuneResult) -> None:
    """The ranked variants as one block each, for narrow consoles: a heading line (rank, variant,
    verdict), then the figures as ``name value`` pairs that wrap between pairs, never inside one."""
    c.print(f"[bold]scalpel tune: variants {RANK_ORDER}[/]", highlight=False)
    for rank, trial in enumerate(result.ranked(), 1):
        cells = dict(zip(HEADERS, row_cells(trial), strict=True))
        head = Text(f"{rank}. ")
        head.append(cells["variant"], style="bold")
        head.append(f"  {cells['verdict']}", style=VERDICT_STYLE.get(trial.verdict, ""))
        c.print(head)
        pairs = [
            f"{name} {cells[name]}"
            for name in (
                "step ms",
                "vs baseline ms",
                "speedup",
                "end to end",
                "spread",
                "compile",
                "peak mem",
                "loss dev",
            )
            if cells[name] != "-"
        ]
        # lines filled pair by pair: a figure is never cut from its name or broken across lines
        line = ""
        for pair in pairs:
            if line and 3 + len(line) + 3 + len(pair) > c.width:
                c.print(f"   {line}", highlight=False, soft_wrap=True)
                line = ""
            line = f"{line} · {pair}" if line else pair
        if line:
            c.print(f"   {line}", highlight=False, soft_wrap=True)
        for name in ("why tried", "result"):
            if cells[name] and cells[name] != "-":
                say_wrapped(c, Text(f"   {name}: {cells[name]}", style="dim"))
    say_wrapped(c, Text(TABLE_NOTE, style="dim"))


def busy_note(environment: Mapping[str, Any] | None) -> str | None:
    """The note that the machine was busy when the baseline ran (the 1-minute load, less the run itself, at
    or above the usable cores: env's own check, :func:`~torchscalpel.envcheck.host_checks.check_machine_busy`),
    or None: every speedup is a ratio of step times measured at that load, and noisy with it."""
    for busy in check_machine_busy(dict(environment or {})):
        return (
            f"{busy.message.removesuffix('.')}; the speedups and the noise above were measured at that load: "
            "re-run tune on an idle machine before trusting a small gain."
        )
    return None


def ranked_table(c: Console, result: TuneResult) -> tuple[Table, list[str]] | None:
    """The ranked variants as one table whose cells never wrap, and its footnotes: each note cell whole when the
    table then fits the width, else a note longer than :data:`NOTE_CELL` (then every result, then every note)
    as ``[n]`` with its text below the table. None when the table does not fit even so (the blocks of
    :func:`print_ranked_blocks` then)."""
    ranked = [(trial, row_cells(trial)) for trial in result.ranked()]
    why, res = NOTE_COLUMNS
    for limits in ({}, {why: NOTE_CELL, res: NOTE_CELL}, {why: NOTE_CELL, res: 0}, {why: 0, res: 0}):
        notes: list[str] = []
        table = Table(title=f"scalpel tune: variants {RANK_ORDER}", title_justify="left")
        for i, h in enumerate(HEADERS):
            table.add_column(h, justify="right" if NUMERIC[i] else "left", no_wrap=True)
        for trial, cells in ranked:
            shown = list(cells)
            for i in (why, res):
                if i in limits and len(shown[i]) > limits[i] and shown[i] != "-":
                    notes.append(f"[{len(notes) + 1}] {trial.label}: {HEADERS[i]}: {shown[i]}")
                    shown[i] = f"[{len(notes)}]"
            table.add_row(*shown, style=VERDICT_STYLE.get(trial.verdict, ""))
        # the table's own width, unclamped (Console.measure clamps to the console's width)
        if Measurement.get(c, c.options.update_width(10**6), table).maximum <= c.width:
            return table, notes
    return None


def render(
    tune: TuneSection,
    *,
    out_dir: Any,
    config_path: Any,
    out: Console | None = None,
    environment: Mapping[str, Any] | None = None,
    target_text: str = "SCRIPT ...",
) -> None:
    """The ranked table, the recommendation (or why there is none), the code lines and where files are, drawn
    from the record's tune section (``record.section(TuneSection)``: what report.html draws). ``environment``:
    the baseline record's facts, for :func:`busy_note`; ``target_text``: the script and its arguments, for the
    closing ``apply with:`` line."""
    c = out or default_console()
    if tune.baseline is None:  # a hand-made section: no search to show
        say_wrapped(c, "scalpel tune: the record holds no tune result")
        return
    result = TuneResult.from_section(tune)
    # (a pipe's width is make_console's: COLUMNS when set, else PIPE_WIDTH)
    fitted = ranked_table(c, result) if c.width >= TABLE_MIN_WIDTH else None
    if fitted is None:
        print_ranked_blocks(c, result)
    else:
        table, notes = fitted
        c.print(table)
        for note in notes:
            say_wrapped(c, Text(note, style="dim"), hang=4)
        say_wrapped(c, Text(TABLE_NOTE, style="dim"))
    print_tune_verdict(
        c,
        result,
        code=tune.code_lines,
        out_dir=out_dir,
        config_path=config_path,
        environment=environment,
        target_text=target_text,
    )


def print_tune_verdict(
    c: Console,
    result: TuneResult,
    *,
    code: list[str],
    out_dir: Any,
    config_path: Any,
    environment: Mapping[str, Any] | None = None,
    target_text: str = "SCRIPT ...",
) -> None:
    """Under the ranking: the baseline's profile, the noise (and a busy machine), the recommendation, its
    ``code`` (the section's ``code_lines``, what code.txt and the page show), the files."""
    bottleneck = (result.facts or {}).get("bottleneck")
    if bottleneck:
        from torchscalpel.tune.bottleneck import Bottleneck

        say_wrapped(
            c,
            _markup(
                f"[bold]profile of the baseline:[/] {escape(Bottleneck.from_dict(bottleneck).summary())}"
            ),
        )
    say_wrapped(
        c,
        _markup(
            f"[dim]required speedup {result.required:.2f}x; "
            f"{noise_line(result.noise, len(result.baseline_medians))}[/]"
        ),
    )
    busy = busy_note(environment)
    if busy:
        say_wrapped(c, _markup(f"[yellow]note:[/] {escape(busy)}"))
    if result.winner is not None:
        pairs = len(result.winner.confirm_pairs or [])
        say_wrapped(
            c,
            _markup(f"[bold green]recommended:[/] {escape(result.headline().removeprefix('recommended: '))}"),
        )
        if pairs < FEW_PAIRS:
            # Seen on a shared GPU: one pair said 1.59x, an independent 2-round re-measure 1.07x.
            say_wrapped(
                c,
                _markup(
                    f"[yellow]note:[/] {pairs} pair{'s' if pairs != 1 else ''} can overstate the gain on a busy "
                    f"machine; re-measure with --confirm {FEW_PAIRS} before quoting the figure."
                ),
            )
        c.print("[bold]equivalent code[/] (if you prefer to edit the script):")
        text = "\n".join(code)
        if not c.soft_wrap:  # a terminal (or COLUMNS): re-laid to fit, still valid Python
            text = fit_code(text, c.width - 4)
        for line in text.splitlines():
            # soft wrap: a code line is never wrapped by rich, so a copy of it still parses
            c.print(f"    {line}", markup=False, highlight=False, soft_wrap=True)
        # a command is never wrapped (soft wrap; a terminal copies its own wrap back as one line), so a copy
        # of it still runs; it has a line of its own, so no prose around it is left to the terminal to wrap
        say_wrapped(c, _markup(f"settings: [bold]{escape(str(config_path))}[/]"))
    else:
        said = escape(result.headline().removeprefix("no change recommended: "))
        say_wrapped(c, _markup(f"[bold yellow]no change recommended:[/] {said}"))
    for trial in result.trials:
        if (trial.payback or {}).get("sentence"):
            say_wrapped(c, f"pays back: {trial.payback['sentence']}")
    for note in result.notes:
        if note != result.no_candidate:  # already the headline
            say_wrapped(c, Text(f"note: {note}", style="dim"))
    # one path a line: three paths on one line were cut wherever the terminal's edge fell
    say_wrapped(c, _markup(f"report: [bold]{escape(str(out_dir))}/report.html[/]"))
    say_wrapped(c, f"record: {out_dir}/run.json · trials: {out_dir}/trials/")
    if result.winner is not None and config_path is not None:
        # the last line, the path actually written; a command is never wrapped, so a copy of it still runs
        say_command(
            c,
            "apply with:",
            f"scalpel run --config {_from_here(str(config_path))} -- {_args_from_here(target_text)}",
        )
    else:
        say_wrapped(c, "no scalpel.toml written: nothing to apply")


def _markup(text: str) -> Text:
    return Text.from_markup(text)


def _from_here(path: str) -> str:
    """An absolute ``path`` below the working folder as :func:`~torchscalpel.findings.short_path` shows it (the
    command the user copies stays short enough for its own row); anything else as given."""
    import os

    from torchscalpel.findings import short_path

    return short_path(path) if os.path.isabs(path) else path


def _args_from_here(text: str) -> str:
    """The script and its arguments with each absolute path below the working folder made relative."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError:  # unbalanced quotes: shown as given
        return text
    return shlex.join(_from_here(w) for w in words) if words else text
