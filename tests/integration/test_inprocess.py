"""The in-process API, driven the way a notebook drives it: the docs' own example is executed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import cli_env

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "inprocess.md"


def _doc_code() -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S))


def test_the_documented_notebook_example_runs_and_writes_a_record(tmp_path: Path) -> None:
    script = tmp_path / "cells.py"
    script.write_text(_doc_code() + "\nshort_run()\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped 12 steps" in proc.stdout
    assert (
        "['report.html', 'run.json', 'scalpel.log', 'trace.json.gz']" in proc.stdout
    )  # scalpel.log: the profiler's own messages
    record = json.loads((tmp_path / "runs/notebook/run.json").read_text())
    assert record["status"] == "stopped" and record["step_kind"] == "optimizer"
    measured = [s for s in record["steps"] if not s["warmup"]]
    assert len(measured) == 10 and all(s["forward_ms"] > 0 and s["backward_ms"] > 0 for s in measured)
    assert record["target"]["inprocess"].endswith(".py:" + record["target"]["inprocess"].rsplit(":", 1)[1])
    decorated = json.loads((tmp_path / "runs/decorated/run.json").read_text())
    assert decorated["status"] == "stopped" and len(decorated["steps"]) == 7


def test_a_block_that_raises_still_writes_its_record_and_the_error_propagates(tmp_path: Path) -> None:
    import torchscalpel

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = torchscalpel.profile(steps=50, profile_steps=0, out=tmp_path / "r", report=False)
    with pytest.raises(ZeroDivisionError), run:
        for i in range(5):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if i == 3:
                raise ZeroDivisionError("boom")
    assert run.record is not None and run.record.status == "failed"
    assert run.record.error == "ZeroDivisionError: boom" and len(run.record.steps) == 4
    assert (tmp_path / "r" / "run.json").exists()
    assert '<div class="scalpel-inline">' in run.record._repr_html_()


def test_blocks_do_not_nest_and_bad_options_raise_value_error(tmp_path: Path) -> None:
    import torchscalpel

    with pytest.raises(ValueError, match=r"^warmup must be"):  # the argument, not the CLI flag
        torchscalpel.profile(warmup=-1)
    outer = torchscalpel.profile(steps=None, profile_steps=0, out=tmp_path / "a", report=False)
    with (
        outer,
        pytest.raises(RuntimeError, match="already measuring"),
        torchscalpel.profile(out=tmp_path / "b"),
    ):
        pass
    assert outer.record is not None and outer.record.status == "complete"


def test_doctor_block_finds_a_planted_bug_in_code_built_before_it(tmp_path: Path) -> None:
    import torchscalpel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters())

    def train() -> None:
        for _ in range(40):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()  # planted: gradients are never zeroed

    with torchscalpel.doctor(steps=10, out=tmp_path / "doc") as run:
        train()
    assert run.record is not None and run.record.status == "stopped" and len(run.record.steps) == 12
    assert "grad-not-zeroed" in [f.rule for f in run.findings]
    saved = json.loads((tmp_path / "doc" / "run.json").read_text())
    assert "grad-not-zeroed" in [f["rule"] for f in saved["findings"]]
    assert saved["sections"]["doctor"]["static_files"] == [str(Path(__file__).resolve())]


def test_torchscalpel_doctor_is_the_same_function_whatever_was_imported_first() -> None:
    # a fresh interpreter, the subpackages' modules imported before the package's functions are used
    code = (
        "import inspect, sys\n"
        "from torchscalpel.doctor.api import diagnose\n"
        "from torchscalpel.memory import analysis\n"
        "import torchscalpel.report.doctor_terminal\n"
        "import torchscalpel\n"
        "from torchscalpel import doctor, memory\n"
        "assert inspect.isfunction(doctor) and torchscalpel.doctor is doctor, torchscalpel.doctor\n"
        "assert inspect.isfunction(memory) and torchscalpel.memory is memory, torchscalpel.memory\n"
        "assert sys.modules['torchscalpel.doctor'].__path__ and sys.modules['torchscalpel.memory'].__path__\n"
        "assert list(inspect.signature(doctor).parameters)[:2] == ['steps', 'warmup']\n"
        "run = torchscalpel.doctor(steps=1, report=False)\n"
        "print(type(run).__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "InProcessRun", proc.stderr


def test_a_doctor_block_leaves_no_wrapper_behind(tmp_path: Path) -> None:
    # the doctor's rules and the runtime's observers wrap the same functions (clip_grad_norm_, the seed
    # setters); whichever is undone first, each name must end as it was before the block
    import random

    import torch._dynamo

    import torchscalpel

    before = (
        torch.nn.utils.clip_grad_norm_,
        torch.nn.utils.clip_grad.clip_grad_norm_,
        torch.manual_seed,
        random.seed,
    )
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscalpel.doctor(steps=4, out=tmp_path / "doc", report=False, static=False):
        torch.manual_seed(0)
        for _ in range(10):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    after = (
        torch.nn.utils.clip_grad_norm_,
        torch.nn.utils.clip_grad.clip_grad_norm_,
        torch.manual_seed,
        random.seed,
    )
    assert after == before


def test_the_in_process_doctor_runs_the_cli_default_window(tmp_path: Path) -> None:
    # `scalpel doctor` measures 300 steps by default (--steps auto); the in-process doctor did 30
    import torchscalpel

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscalpel.doctor(out=tmp_path / "doc", report=False, static=False) as run:
        for _ in range(400):
            opt.zero_grad()
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step()
    assert run.record is not None and run.record.status == "stopped"
    assert len([s for s in run.record.steps if not s.warmup]) == 300
    window = run.record.sections["doctor"]["window"]
    assert (window["steps"], window["warmup"], window["time_cap_s"]) == (300, 2, 120.0), window
