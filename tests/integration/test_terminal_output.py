"""What a user reads in a terminal or a pipe: full-width lines, the statistic named, third-party noise in the
run's log, `--json -` on stdout, help in workflow order, one sentence when there is nothing to show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import REPO, run_cli

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("term") / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "6",
        "--profile-steps",
        "2",
        "--",
        str(SCRIPTS / "epoch_loop.py"),
        COLUMNS="",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, out


def test_piped_summary_is_not_wrapped_at_80_columns(profiled):
    proc, _ = profiled
    head = next(line for line in proc.stderr.splitlines() if line.startswith("scalpel profile"))
    assert "measured steps" in head and "warm-up" in head and "clock" in head and len(head) > 80


def test_the_statistic_is_named_and_the_same_in_headline_and_table(profiled):
    proc, _ = profiled
    assert re.search(
        r"step time: median [\d.]+ ms, p90 [\d.]+ ms \(over 2 step\(s\), 2 profiled, 1 FLOP-counting, 1 op-line "
        r"left out\)",
        proc.stderr,
    )
    assert "median ms" in proc.stderr and "mean ms" not in proc.stderr
    headline = float(re.search(r"step time: median ([\d.]+) ms", proc.stderr).group(1))
    step_row = float(re.search(r"│ step\s+│\s+([\d.]+) │", proc.stderr).group(1))
    assert step_row == headline


def test_profiler_noise_goes_to_the_run_log_not_the_terminal(profiled):
    proc, out = profiled
    assert "USDT" not in proc.stderr and "CPUAllocator" not in proc.stderr
    log = (out / "scalpel.log").read_text()
    assert "profiler_start" in log and "profiler_stop" in log
    assert "scalpel.log" in proc.stderr  # the summary names where it went


def test_summary_ends_with_the_next_command(profiled):
    proc, out = profiled
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("next: scalpel doctor -- ") and str(out / "report.html") in last


def test_json_dash_writes_the_record_to_stdout_and_nothing_else(tmp_path):
    proc = run_cli(
        "profile",
        "--out",
        str(tmp_path / "run"),
        "--warmup",
        "0",
        "--steps",
        "2",
        "--profile-steps",
        "0",
        "--json",
        "-",
        "--",
        str(SCRIPTS / "plain_prints.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)  # the script's own prints went to stderr
    assert record["schema_version"] and not (tmp_path / "-").exists()


def test_analyze_json_dash_and_memory_peak_in_ms_from_the_trace_start(profiled, tmp_path):
    _, out = profiled
    proc = run_cli("analyze", str(out / "trace.json.gz"), "--json", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["memory"]["peak_ms_from_start"] >= 0 and not (tmp_path / "-").exists()
    assert re.search(r"memory: peak .* [\d,.]+ ms after the trace starts", proc.stderr)
    assert not re.search(r"at \d{8,} µs", proc.stderr)


def test_help_lists_commands_in_workflow_order_and_exit_codes():
    proc = run_cli("--help", COLUMNS="100")
    listed = re.findall(r"^    (\w+)\s", proc.stdout, re.M)
    assert listed == [
        "env",
        "profile",
        "doctor",
        "memory",
        "tune",
        "run",
        "fix",
        "lr",
        "batch",
        "plan",
        "launch",
        "compare",
        "analyze",
        "export",
        "serve",
        "report",
        "demo",
    ]
    assert "130 interrupted" in " ".join(proc.stdout.split())


def test_help_never_breaks_a_word():
    proc = run_cli("tune", "--help", COLUMNS="80")
    assert "amp, threads, dataloader" in " ".join(proc.stdout.split())
    assert "scalpel-\n" not in proc.stdout
    for line in proc.stdout.splitlines():  # a line ending in a comma-less fragment of a knob name was the bug
        assert not re.search(r",[a-z]+$", line), line


def test_launch_help_shows_its_own_options_first():
    proc = run_cli("launch", "-h", COLUMNS="100")
    text = proc.stdout
    assert proc.returncode == 0 and text.index("--nproc NPROC") < text.index("torchrun options (")
    assert len(text.splitlines()) < 50 and "--nproc-per-node" in text.split("torchrun options (")[1]


def test_run_show_with_nothing_to_apply_says_so(tmp_path):
    config = tmp_path / "scalpel.toml"
    config.write_text('version = "1.0"\n[tune]\n')
    proc = run_cli(
        "run", "--config", str(config), "--show", "--", str(SCRIPTS / "plain_prints.py"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nothing to apply" in proc.stderr


def test_readme_code_fences_are_balanced():
    lines = (REPO / "README.md").read_text().splitlines()
    fences = [line.strip() for line in lines if line.strip().startswith("```")]
    opening = fences[0::2]
    closing = fences[1::2]
    assert len(fences) % 2 == 0, "an unclosed code fence renders the rest of the README as code"
    assert all(f == "```" for f in closing), f"a closing fence carries a language, so it opens one: {closing}"
    assert all(len(f) >= 3 for f in opening)


def test_doctor_announces_its_window_and_ends_with_the_next_command(tmp_path):
    fixture = REPO / "tests" / "fixtures" / "doctor" / "module_in_plain_container.py"
    proc = run_cli(
        "doctor", "--steps", "3", "--no-report", "--out", str(tmp_path / "doc"), "--", str(fixture)
    )
    assert "running module_in_plain_container for 2 warm-up + 3 steps" in proc.stdout
    # why it stopped, in the one wording (runtime/run_notes.how_it_stopped), and the window's split
    assert "ended after the 5 planned steps, as asked (2 warm-up + 3 measured)" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("next: apply the fix(es) above") and f"scalpel tune -- {fixture}" in last


@pytest.mark.parametrize(
    "command",
    [
        ["doctor", "--static", "tests/fixtures/doctor/module_in_plain_container.py"],
        ["env", "--no-probe"],
    ],
)
def test_json_dash_for_doctor_and_env(command, tmp_path):
    proc = run_cli(*command, "--json", "-", cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert isinstance(data, dict) and data
    assert not (REPO / "-").exists()
