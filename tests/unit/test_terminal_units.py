"""Terminal helpers: ANSI stripped from copied messages, pipe width, progress that never passes its total."""

from __future__ import annotations

import ast
import io
import itertools
import re

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


def test_progress_fits_80_columns_with_every_number_whole():
    # the tmux at 80x45: the bar cut elapsed and ETA to "0:0… left 0:00:…" and wrapped "140 of 200"
    buf = io.StringIO()
    out = Console(file=buf, width=80)
    progress = terminal.stage_progress(out)
    task = progress.add_task("profiling train_transformer_with_a_long_name.py", total=2000, info="")
    progress.update(task, completed=1400, info="profiled 1234.5 ms loss 2.345")
    out.print(progress.get_renderable())
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80, lines
    for whole in ("1400 of 2000", "1234.5 ms", "loss 2.345", "left"):
        assert whole in lines[0], (whole, lines[0])
    assert lines[0].startswith("profiling")


def test_piped_profile_prints_a_heartbeat_line_instead_of_a_bar():
    buf = io.StringIO()
    out = Console(file=buf, width=80)  # a StringIO is not a terminal: no bar is drawn
    now = [0.0]
    bar = StepProgress(200, "profiling train.py", out=out, heartbeat_s=10.0, clock=lambda: now[0])
    with bar:
        for i in range(200):
            now[0] += 0.125  # 8 steps a second of wall clock
            bar.update(StepRecord(index=i, total_ms=12.3))
    lines = buf.getvalue().splitlines()
    # one line per 10 s (80 steps) of the 25 s run, nothing drawn between them
    assert lines == [
        "profiling train.py: step 80 of 200, 12.3 ms/step, 15 s left",
        "profiling train.py: step 160 of 200, 12.3 ms/step, 5 s left",
    ]


def test_time_left_is_the_steps_estimate_or_what_the_cap_leaves_whichever_is_less():
    # the doctor: 2:10 left by its steps, 78 s left under its 120 s cap (42 s in)
    assert terminal.time_left(130.0, 42.0, 120.0) == 78.0
    assert terminal.time_left(30.0, 42.0, 120.0) == 30.0  # the steps end first
    assert terminal.time_left(130.0, 42.0, None) == 130.0  # no cap
    assert (
        terminal.time_left(None, 42.0, 120.0) == 78.0
    )  # steps unknown (--steps all): the cap still bounds it
    assert terminal.time_left(None, 42.0, None) is None
    assert terminal.time_left(10.0, 500.0, 120.0) == 0.0  # past the cap: never negative


def test_piped_doctor_heartbeat_honours_the_time_cap():
    buf = io.StringIO()
    out = Console(file=buf, width=80)
    now = [0.0]
    bar = StepProgress(300, "doctor t.py", out=out, heartbeat_s=10.0, clock=lambda: now[0], time_cap_s=30.0)
    with bar:
        for i in range(100):
            now[0] += 0.25  # 4 steps a second: 300 steps would take 75 s, the cap ends it at 30 s
            bar.update(StepRecord(index=i, total_ms=5.0))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "doctor t.py: step 40 of 300, 5.0 ms/step, 20 s left", lines


def test_progress_bar_time_left_honours_the_time_cap():
    bar = StepProgress(300, "doctor t.py", time_cap_s=120.0)
    task = bar._progress.tasks[0]
    assert task.fields["time_cap_s"] == 120.0
    out = str(terminal.TimesColumn().render(task))
    assert out.endswith("left")


def test_phase_prints_a_plain_line_as_it_starts_and_as_it_ends():
    buf = io.StringIO()
    out = Console(file=buf, width=80)
    now = [0.0]
    with terminal.Phase("verify", "start of the patched copy", out=out, clock=lambda: now[0]) as phase:
        now[0] += 41.4
        phase.outcome = "exit 0"
    try:
        with terminal.Phase("verify", "timing pair 1 of 3: original", out=out, clock=lambda: now[0]):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert buf.getvalue().splitlines() == [
        "verify: start of the patched copy ...",
        "verify: start of the patched copy: exit 0 (41 s)",
        "verify: timing pair 1 of 3: original ...",
        "verify: timing pair 1 of 3: original: failed (0 s)",
    ]


def test_columns_set_on_a_pipe_wraps_between_words_at_that_width(monkeypatch):
    # `COLUMNS=80 scalpel profile ... | tee log` viewed in an 80-column pane: lines were one long line each
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    c = make_console(file=buf)
    c.print(
        "step time: median 1234.50 ms, p90 4.58 ms (over 6 step(s), 3 profiled, 1 FLOP-counting left out) "
        * 2
    )
    c.print(
        "    x = torch.autocast(device_type=device.type, dtype=torch.bfloat16)  # never wrapped: code" * 2,
        soft_wrap=True,
    )
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines[:-1]), lines
    assert "1234.50" in buf.getvalue() and len(lines[-1]) > 80  # the code line stays whole


def test_say_wraps_between_words_but_never_parts_a_figure_from_its_unit():
    # the tmux at 80 columns: rich's wrap left "5.02" at the end of a line and "MFLOP/s achieved" below
    buf = io.StringIO()
    out = Console(file=buf, width=80)
    line = "throughput 2139.8 samples/s · loss 1.453 -> 1.459 · 45.1 kFLOP per step, 5.02 MFLOP/s achieved"
    terminal.say(out, line)
    lines = buf.getvalue().splitlines()
    assert lines == [
        "throughput 2139.8 samples/s · loss 1.453 -> 1.459 · 45.1 kFLOP per step,",
        "5.02 MFLOP/s achieved",
    ]
    for width in range(20, 90):
        pieces = [line[start:end] for start, end, _ in terminal.wrap_spans(line, width)]
        assert " ".join(pieces) == line  # broken only at spaces, nothing lost
        for above, below in itertools.pairwise(pieces):
            assert not (re.search(r"\d$", above) and re.match(r"samples/s|kFLOP|MFLOP/s", below)), (
                width,
                pieces,
            )


def test_say_keeps_markup_brackets_and_a_pipe_line_whole(monkeypatch):
    buf = io.StringIO()
    out = Console(file=buf, width=30)
    terminal.say(out, "  batch arg0=int64[35,20]:50 [bold]x[/] and peak (1.6 MiB with it)", hang=2)
    text = buf.getvalue()
    assert "int64[35,20]:50" in text and "[bold]x[/]" in text and "(1.6 MiB" in text
    assert all(line.startswith("  ") for line in text.splitlines())  # the first line's indent, plus hang
    monkeypatch.delenv("COLUMNS", raising=False)
    sink = io.StringIO()
    piped = make_console(file=sink)
    terminal.say(piped, "word " * 60)
    assert sink.getvalue().count("\n") == 1


def test_fit_code_relays_long_lines_so_they_fit_and_still_parse():
    # tune's equivalent code at 80 columns (4 of them the indent): the terminal cut a 91-character line anywhere
    code = "\n".join(
        [
            "with torch.autocast(device_type=device.type, dtype=torch.bfloat16):  # around the model call",
            "    out = model(x)",
            "loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True, persistent_workers=True)",
            "s = 'a # in a string, not a comment'",
        ]
    )
    fitted = terminal.fit_code(code, 76)
    assert all(len(line) <= 76 for line in fitted.splitlines()), fitted
    assert ast.dump(ast.parse(fitted)) == ast.dump(ast.parse(code))
    assert "# around the model call\nwith torch.autocast(" in fitted
    assert terminal.fit_code(code, 200) == code  # nothing changes where it fits
