"""Issue 41, third round: one sentence where a traceback was, end to end through ``python -m torchscalpel``.

- numbers past 2^63: ``batch --sizes`` and ``profile --steps`` are refused as ``lr`` refuses them (exit 2);
- ``batch`` says "does not fit" only of a run that crossed a limit: a size above the script's data is
  "not measured", with the data's size;
- an output file that fails when written (``/dev/full``) is one sentence naming it, exit 2;
- a lone surrogate in any string of a record is printed escaped by ``report`` and ``compare`` (terminal,
  HTML, JSON), whatever the output's encoding;
- a reader that closes the pipe (``scalpel launch -h | head -1``) ends the command quietly.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, cli_env, run_cli

FIXTURES = REPO / "tests" / "fixtures"
FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")
BIG = "99999999999999999999"  # > 2^63


def _one_sentence(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["batch", "--sizes", BIG], "--sizes"),
        (["batch", "--sizes", "8", "--steps", BIG], "--steps"),
        (["lr", "--steps", BIG], "--steps"),
        (["profile", "--steps", "1" + "0" * 23], "--steps"),
        (["doctor", "--time-cap", BIG], "--time-cap"),
        (["memory", "--memory-limit", BIG + "GB"], "--memory-limit"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_numbers_past_2_63_are_one_sentence_exit_2(argv: list[str], flag: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the script must never run')\n")
    done = run_cli(*argv, "--", str(script), cwd=tmp_path)
    line = _one_sentence(done.stderr)
    assert done.returncode == 2 and line.startswith(f"scalpel: error: {flag} ") and "2^63" in line, line
    assert not (tmp_path / "scalpel-runs").exists()


SMALL_DATA = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(data, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_a_size_above_the_scripts_data_is_not_measured_not_does_not_fit(tmp_path: Path) -> None:
    """256 samples: at batch 300 every batch held 256 rows (3 steps in all), so nothing was measured at 300,
    and nothing crossed a limit: before, "does not fit: exit code 0"."""
    script = tmp_path / "small.py"
    script.write_text(SMALL_DATA)
    out = tmp_path / "b"
    done = run_cli(
        "batch", "--sizes", "16,300", "--steps", "2", "--warmup", "1", "--out", str(out), "--", str(script)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "300  not measured: the script's data has 256 samples, fewer than 300" in done.stdout, done.stdout
    assert "does not fit" not in done.stdout
    rows = {
        r["batch_size"]: r for r in json.loads((out / "run.json").read_text())["sections"]["batch"]["rows"]
    }
    assert rows[300]["outcome"] == "not measured" and rows[300]["fits"] is False
    assert rows[16]["outcome"] == "measured" and rows[16]["samples_per_s"] > 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "not measured" in page and "fewer than 300" in page and "does not fit" not in page


@needs_dev_full
def test_memory_json_of_a_snapshot_to_a_full_device_is_one_sentence(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.pickle"
    block = {
        "size": 4096,
        "state": "active_allocated",
        "frames": [{"filename": "/u/t.py", "line": 1, "name": "f"}],
    }
    snapshot.write_bytes(pickle.dumps({"segments": [{"total_size": 4096, "blocks": [block]}]}))
    done = run_cli("memory", "--json", str(FULL), str(snapshot), TORCHSCALPEL_NATIVE="0")
    line = _one_sentence(done.stderr)
    assert done.returncode == 2, done.stderr
    assert (
        line
        == "scalpel: error: Could not write --json /dev/full: No space left on device; choose another path."
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A doctor run (findings, sites) of a fixture in its own git tree, and a profile run (trace, top ops)."""
    root = tmp_path_factory.mktemp("project")
    shutil.copy(FIXTURES / "doctor" / "grad_not_zeroed.py", root / "grad_not_zeroed.py")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    doctor, profile = root.parent / "doctor-run", root.parent / "profile-run"
    done = run_cli("doctor", "--out", str(doctor), "--", "grad_not_zeroed.py", cwd=root)
    assert (doctor / "run.json").is_file(), done.stderr[-2000:]
    done = run_cli("profile", "--steps", "3", "--out", str(profile), "--", "grad_not_zeroed.py", cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"root": root, "doctor": doctor, "profile": profile}


@needs_dev_full
def test_fix_patch_to_a_full_device_is_one_sentence(runs: dict[str, Path]) -> None:
    pytest.importorskip("libcst")
    done = run_cli("fix", str(runs["doctor"]), "--patch", str(FULL), cwd=runs["root"])
    line = _one_sentence(done.stderr)
    assert done.returncode == 2
    assert line == "scalpel: error: Could not write /dev/full: No space left on device; choose another path."


SURROGATE = "\ud800"
KEEP = {"schema_version"}  # the one string a reader must parse to read the rest


def _with_surrogates(value: Any) -> Any:
    """``value`` with a lone surrogate appended to every string in it (keys included where they are names)."""
    if isinstance(value, dict):
        return {k: v if k in KEEP else _with_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_surrogates(v) for v in value]
    return value + SURROGATE if isinstance(value, str) else value


def _hostile_copy(run: Path, dest: Path) -> Path:
    dest.mkdir()
    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    strings = json.dumps(record).count('"')
    assert strings > 100  # a record with many string fields: names, paths, messages, ops, findings
    (dest / "run.json").write_text(json.dumps(_with_surrogates(record)), encoding="utf-8")  # \ud800 escapes
    return dest


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_lone_surrogate_in_every_string_of_a_record_is_printed_escaped(
    runs: dict[str, Path], tmp_path: Path, encoding: str
) -> None:
    a = _hostile_copy(runs["profile"], tmp_path / "a")
    b = _hostile_copy(runs["doctor"], tmp_path / "b")
    env = {"PYTHONIOENCODING": encoding}
    page = tmp_path / "report.html"
    done = run_cli("report", str(a), str(b), "--out", str(page), **env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    text = page.read_text(encoding="utf-8")  # valid UTF-8: the surrogate is written as a backslash escape
    assert "\\ud800" in text and "grad-not-zeroed" in text  # the doctor's finding was drawn
    for record in (a, b):
        done = run_cli("report", str(record), "--check", **env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    html, js = tmp_path / "compare.html", tmp_path / "compare.json"
    done = run_cli("compare", str(a), str(b), "--html", str(html), "--json", str(js), **env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "\\ud800" in done.stdout  # the terminal table, escaped
    assert "\\ud800" in html.read_text(encoding="utf-8")
    assert SURROGATE in json.loads(js.read_text(encoding="utf-8"))["runs"][0]["name"]  # JSON keeps \ud800
    done = run_cli("compare", str(a), str(b), "--json", "-", **env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert SURROGATE in json.loads(done.stdout)["runs"][1]["name"]


def test_launch_help_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """The reader is gone before scalpel writes a byte (the read end closed first), so every run meets the
    broken pipe that `| head -1` meets 1 run in 5; then the real `| head -1`, a few times."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "torchscalpel", "launch", "-h"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=tmp_path,
            timeout=240,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode == 1, done.stderr[-3000:]
    command = f"{sys.executable} -m torchscalpel launch -h | head -1"
    for _ in range(3):
        piped = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=tmp_path,
            timeout=240,
            check=False,
        )
        assert piped.stderr == "" and piped.stdout.startswith("usage: scalpel launch"), piped.stderr[-3000:]
