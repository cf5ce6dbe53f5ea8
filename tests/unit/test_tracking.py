"""--tensorboard and --mlflow writers: TensorBoard's events read back with its own reader, a missing package
(MLflow's run read back with its client: tests/integration/test_tracking_mlflow.py, importing MLflow starts a
process)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from torchscalpel.tracking import TrackingOptions, write_tracking
from torchscalpel.tracking.scalars import run_params, step_scalars
from tracking_runs import make_run


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
