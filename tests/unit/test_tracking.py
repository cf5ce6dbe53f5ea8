"""--tensorboard and --mlflow writers, read back with each consumer's own library."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

from torchscalpel.record import RunRecord, StepRecord, save_record
from torchscalpel.runtime.summary import summarize
from torchscalpel.tracking import TrackingOptions, write_tracking
from torchscalpel.tracking.scalars import run_params, step_scalars


def make_run(folder: Path) -> RunRecord:
    """A run folder with a record of 6 steps (lr recorded per step) and a small trace."""
    folder.mkdir(parents=True, exist_ok=True)
    steps = [
        StepRecord(
            index=i,
            warmup=i < 2,
            total_ms=10.0 + i,
            data_ms=1.0,
            forward_ms=3.0,
            backward_ms=4.0 + i,
            optimizer_ms=1.0,
            other_ms=1.0,
            loss=1.0 / (i + 1),
            samples=16,
            profiled=i == 3,
        )
        for i in range(6)
    ]
    record = RunRecord(
        name="train",
        steps=steps,
        command=["scalpel", "profile", "--", "train.py"],
        target={"script": "train.py", "args": ["--lr", "0.1"]},
        environment={"torch": "2.13.0"},
        config={"warmup": 2, "steps": 4, "tune_settings": {"amp": "bf16", "compile": {"target": "Block"}}},
        profiler={"steps": [3], "trace": "trace.json.gz"},
        sections={"steps_extra": {"lr": {str(i): 0.1 * (i + 1) for i in range(6)}}},
    )
    record.summary = summarize(record)
    record.summary["flops_per_step"] = 2.0e9
    record.summary["mfu"] = {"gpu": "H100", "peak_tflops_bf16": 1000.0, "mfu": 0.1}
    with gzip.open(folder / "trace.json.gz", "wt") as f:
        json.dump(
            {"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}, f
        )
    record.artifacts["record"] = "run.json"
    save_record(record, folder)
    return record


def test_step_scalars_and_params_come_from_the_record(tmp_path: Path) -> None:
    record = make_run(tmp_path / "run")
    series = dict(step_scalars(record))
    assert series[4]["step/backward_ms"] == 8.0 and series[4]["train/lr"] == pytest.approx(0.5)
    assert series[4]["train/samples_per_s"] == pytest.approx(16 / 0.014)
    assert series[4]["perf/flops_per_s"] == pytest.approx(2.0e9 / 0.014)
    assert series[4]["perf/mfu"] == pytest.approx(2.0e9 / 0.014 / 1e15)
    params = run_params(record)
    assert params["tune.amp"] == "bf16" and params["tune.compile.target"] == "Block"
    assert params["script_args"] == "--lr 0.1"


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = make_run(tmp_path / "run")
    logdir = tmp_path / "tb"
    lines = write_tracking(
        record, tmp_path / "run", TrackingOptions(tensorboard=logdir), run="r1", worker="rank0"
    )
    assert lines[0].startswith("tensorboard: 2 file(s)")
    acc = EventAccumulator(str(logdir / "r1"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "step/time_ms",
        "step/backward_ms",
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "summary/median_step_ms",
    } <= tags
    backward = [(e.step, e.value) for e in acc.Scalars("step/backward_ms")]
    assert backward == [(i, 4.0 + i) for i in range(6)]
    assert [round(e.value, 6) for e in acc.Scalars("train/loss")] == [
        round(1.0 / (i + 1), 6) for i in range(6)
    ]
    trace = logdir / "plugins" / "profile" / "r1" / "rank0.pt.trace.json.gz"
    with gzip.open(trace, "rt") as f:
        assert json.load(f)["traceEvents"][0]["name"] == "aten::mm"


def test_mlflow_run_reads_back_with_mlflow_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    record = make_run(tmp_path / "run")
    store = tmp_path / "mlruns"
    lines = write_tracking(record, tmp_path / "run", TrackingOptions(mlflow=str(store)), run="r1")
    assert lines[0].startswith("mlflow: run "), lines
    run_id = lines[0].split()[2]
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while writing
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only with this
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.run_name == "r1" and run.info.status == "FINISHED"
    assert (
        run.data.params["tune.amp"] == "bf16" and run.data.params["command"] == "scalpel profile -- train.py"
    )
    history = client.get_metric_history(run_id, "step.backward_ms")
    assert sorted((m.step, m.value) for m in history) == [(i, 4.0 + i) for i in range(6)]
    assert {a.path for a in client.list_artifacts(run_id)} == {"run.json"}


def test_a_missing_package_is_one_sentence_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    lines = write_tracking(
        record, tmp_path / "run", TrackingOptions(tensorboard=tmp_path / "tb", mlflow=str(tmp_path / "ml"))
    )
    assert lines == [
        "tensorboard: not written, the tensorboard package is not installed (pip install 'torchscalpel[tracking]').",
        "mlflow: not written, the mlflow package is not installed (pip install 'torchscalpel[tracking]').",
    ]
    assert not (tmp_path / "ml").exists()


def test_cli_track_takes_a_record_path_and_does_nothing_without_flags(tmp_path: Path) -> None:
    import argparse

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchscalpel.cli.common import track

    make_run(tmp_path / "run")
    track(argparse.Namespace(tensorboard=None, mlflow=None), tmp_path / "run" / "run.json", tmp_path / "run")
    assert not (tmp_path / "tb").exists()
    # tune hands the baseline's run.json path
    track(
        argparse.Namespace(tensorboard=tmp_path / "tb", mlflow=None),
        tmp_path / "run" / "run.json",
        tmp_path / "run",
    )
    acc = EventAccumulator(str(tmp_path / "tb" / "run"))
    acc.Reload()
    assert len(acc.Scalars("step/time_ms")) == 6


def test_tensorboard_naming_a_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchscalpel.cli.main import main

    (tmp_path / "f").write_text("")
    assert main(["profile", "--tensorboard", str(tmp_path / "f"), "--", "x.py"]) == 2
    assert "is a file; name a log folder" in capsys.readouterr().err


def test_grad_norm_is_what_the_scripts_clipping_returned(tmp_path: Path) -> None:
    import torch

    import torchscalpel

    originals = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad.clip_grad_norm_)  # each as it was
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    returned: list[float] = []
    with torchscalpel.profile(warmup=1, steps=4, out=tmp_path / "run", report=False, profile_steps=0) as run:
        for _ in range(5):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            from torch.nn.utils import clip_grad_norm_  # bound after the attach, as a script's import is

            returned.append(float(clip_grad_norm_(model.parameters(), 1.0)))
            optimizer.step()
    series = run.record.sections["steps_extra"]["grad_norm"]
    assert [series[str(s.index)] for s in run.record.steps] == returned[: len(run.record.steps)]
    assert (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad.clip_grad_norm_) == originals
    grads = dict(step_scalars(run.record))
    assert grads[run.record.steps[-1].index]["train/grad_norm"] == returned[len(run.record.steps) - 1]
