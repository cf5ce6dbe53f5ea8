"""``torchscalpel.lr`` / ``batch`` / ``fix`` / ``analyze`` in this process: the same stage functions as the
``scalpel`` verbs, typed results, the CLI's defaults, errors that name the argument. Small scripts, short runs
(``torchscalpel.tune`` is in tests/unit/test_inprocess_tune.py: its trials are answered without processes)."""

from __future__ import annotations

import inspect
import json
import subprocess
from pathlib import Path

import pytest

import torchscalpel
from helpers import REPO, run_cli
from torchscalpel.cli.main import build_parser
from torchscalpel.errors import UsageError
from trace_builders import write_trace

LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
for epoch in range(4):
    for x, y in DataLoader(data, batch_size=16):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
"""


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    script = tmp_path / "loop.py"
    script.write_text(LOOP, encoding="utf-8")
    return script


def _defaults(name: str) -> dict[str, object]:
    return {k: p.default for k, p in inspect.signature(getattr(torchscalpel, name)).parameters.items()}


def test_lr_sweeps_in_process_with_the_cli_defaults(loop: Path, tmp_path: Path) -> None:
    cli, api = vars(build_parser().parse_args(["lr", "x.py"])), _defaults("lr")
    assert (api["min_lr"], api["max_lr"], api["steps"]) == (cli["min_lr"], cli["max_lr"], cli["steps"])
    result = torchscalpel.lr(loop, min_lr=1e-4, max_lr=10.0, steps=12, out=tmp_path / "lr")
    assert isinstance(result, torchscalpel.LrResult)
    assert result.out_dir == tmp_path / "lr" and (tmp_path / "lr" / "run.json").is_file()
    assert result.report == tmp_path / "lr" / "report.html" and result.report.is_file()
    saved = json.loads((tmp_path / "lr" / "run.json").read_text())["sections"]["lr"]
    assert saved["steps_run"] == result.section.steps_run and 0 < len(result.section.points) <= 12
    assert result.record.command[0] == "torchscalpel.lr"
    suggestion = result.section.suggestion
    assert result.suggested_lr == (suggestion["lr"] if suggestion else None)
    with pytest.raises(ValueError, match=r"^steps must be a whole number of at least 8"):
        torchscalpel.lr(loop, steps=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        torchscalpel.lr(tmp_path / "missing.py")
    with pytest.raises(TypeError, match="not both"):
        torchscalpel.lr(loop, module="json")


def test_batch_measures_each_size_in_process(loop: Path, tmp_path: Path) -> None:
    cli, api = vars(build_parser().parse_args(["batch", "--sizes", "8", "x.py"])), _defaults("batch")
    assert (api["steps"], api["warmup"]) == (cli["steps"], cli["warmup"])
    result = torchscalpel.batch(loop, sizes=[8, 32], steps=2, warmup=1, out=tmp_path / "b", report=False)
    assert isinstance(result, torchscalpel.BatchResult)
    rows = {row["batch_size"]: row for row in result.section.rows}
    assert sorted(rows) == [8, 32] and all(row["outcome"] == "measured" for row in rows.values())
    assert result.best in (8, 32) and result.exit_code == 0
    assert result.report is None and not (tmp_path / "b" / "report.html").exists()
    assert json.loads((tmp_path / "b" / "run.json").read_text())["sections"]["batch"]["best"] == result.best
    with pytest.raises(ValueError, match=r"^sizes lists a size twice"):
        torchscalpel.batch(loop, sizes=[8, 8])


def test_analyze_reads_a_trace_in_process(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "run" / "trace.json.gz")
    result = torchscalpel.analyze(trace)
    assert isinstance(result, torchscalpel.TraceAnalysis) and not result.errors
    ops = {row["name"] for row in result.to_dict()["top_ops"]}
    assert {"aten::mm", "aten::add"} <= ops
    with pytest.raises(ValueError, match=r"^top must be"):
        torchscalpel.analyze(trace, top=0)
    with pytest.raises(TypeError, match="at least one trace"):
        torchscalpel.analyze()


def test_fix_patches_what_a_doctor_run_found_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("libcst")
    source = (REPO / "tests" / "fixtures" / "doctor" / "loss_graph_retained.py").read_text(encoding="utf-8")
    root = tmp_path / "project"
    root.mkdir()
    script = root / "train_sum.py"
    script.write_text(source, encoding="utf-8")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "."], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "init"], check=True)
    run = tmp_path / "doctor-run"
    done = run_cli("doctor", "--no-report", "--out", str(run), "--", str(script), cwd=root)
    assert (run / "run.json").is_file(), done.stderr
    monkeypatch.chdir(root)
    result = torchscalpel.fix(run)
    assert isinstance(result, torchscalpel.FixResult)
    assert "+    total_loss += loss.item()" in result.patch and not result.applied
    assert script.read_text(encoding="utf-8") == source  # nothing written without apply=True
    with pytest.raises(UsageError, match="is not a run folder"):
        torchscalpel.fix(tmp_path / "nowhere")
