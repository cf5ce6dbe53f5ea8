"""End to end: profile runs that differ in one thing each, compared; --tensorboard / --mlflow read back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import REPO, run_cli

# A copy outside any git repository: the runs' provenance then holds no commit or diff hash, so a commit
# made while the suite runs (a developer's, in this checkout) cannot show up as a difference between them.
_COPY = Path(tempfile.mkdtemp(prefix="scalpel-tracking-")) / "tracking"
shutil.copytree(REPO / "tests" / "fixtures" / "tracking", _COPY, ignore=shutil.ignore_patterns("__pycache__"))
SCRIPT = _COPY / "tiny_train.py"
WINDOW = ("--steps", "8", "--warmup", "2", "--profile-steps", "2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three profiled runs: the baseline, one with a tune knob via --config, one with another seed."""
    root = tmp_path_factory.mktemp("runs")
    (root / "amp.toml").write_text('[tune]\namp = "bf16"\n')
    out = {}
    for name, extra, script_args in (
        ("base", (), ()),
        ("amp", ("--config", str(root / "amp.toml")), ()),
        ("seed", (), ("--seed", "1")),
    ):
        tracking = (
            ("--tensorboard", str(root / "tb"), "--mlflow", str(root / "mlruns")) if name == "base" else ()
        )
        proc = run_cli(
            "profile",
            *WINDOW,
            "--out",
            str(root / name),
            *extra,
            *tracking,
            "--",
            str(SCRIPT),
            *script_args,
            cwd=root,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = root / name
    out["root"] = root
    return out


def _verdict(*runs: Path) -> tuple[str, dict]:
    proc = run_cli("compare", *map(str, runs), "--json", "-")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    return data["pairs"][0]["verdict"], data


def test_profile_config_applies_the_settings_as_scalpel_run_does(runs: dict[str, Path]) -> None:
    record = json.loads((runs["amp"] / "run.json").read_text())
    assert record["config"]["tune_settings"] == {"amp": "bf16"}
    proc = run_cli(
        "run", "--config", str(runs["root"] / "amp.toml"), "--show", "--", str(SCRIPT), cwd=runs["root"]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = [
        line.removeprefix("scalpel run: applied ")
        for line in proc.stderr.splitlines()
        if line.startswith("scalpel run: applied ")
    ]
    assert shown and record["config"]["tune_applied"] == shown


def test_compare_names_the_tune_knob(runs: dict[str, Path]) -> None:
    verdict, data = _verdict(runs["base"], runs["amp"])
    assert "tune.amp (none) -> bf16 is the only recorded difference" in verdict, verdict
    assert data["pairs"][0]["losses"]["first_diff_step"] == 0  # bf16 autocast changes the numbers


def test_compare_names_the_seed_and_bit_identical_reruns(runs: dict[str, Path]) -> None:
    verdict, data = _verdict(runs["base"], runs["seed"])
    assert "--seed (none) -> 1" in verdict and "seed (torch, random) 0 -> 1" in verdict, verdict
    assert data["pairs"][0]["losses"]["first_diff_step"] == 0
    # a second baseline: same code, data and seed -> bit-identical losses, nothing recorded differs
    again = runs["root"] / "again"
    proc = run_cli("profile", *WINDOW, "--out", str(again), "--", str(SCRIPT), cwd=runs["root"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict, data = _verdict(runs["base"], again)
    assert data["pairs"][0]["losses"]["identical"] and "losses bit-identical over 10 steps" in verdict
    assert verdict.endswith(
        "no recorded difference in config, tune settings, code, data, seeds or environment"
    ), verdict


def test_compare_names_a_version_faked_in_the_record(runs: dict[str, Path], tmp_path: Path) -> None:
    data = json.loads((runs["base"] / "run.json").read_text())
    data["environment"]["torch"] = data["environment"]["packages"]["torch"] = "2.14.0"
    (tmp_path / "run.json").write_text(json.dumps(data))
    proc = run_cli("compare", str(runs["base"]), str(tmp_path), "--html", str(tmp_path / "c.html"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "-> 2.14.0 is the only environment change" in proc.stdout
    assert "losses bit-identical" in proc.stdout  # the same measured run, only the version changed
    assert 'data-chart="compare-loss"' in (tmp_path / "c.html").read_text()


def test_tensorboard_from_profile_reads_back(runs: dict[str, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = runs["root"] / "tb"
    acc = EventAccumulator(str(logdir / "base"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("step/time_ms")] == list(range(10))
    assert len(acc.Scalars("train/loss")) == 10 and all(
        e.value == pytest.approx(0.05) for e in acc.Scalars("train/lr")
    )
    assert acc.Scalars("summary/median_step_ms")
    traces = list((logdir / "plugins" / "profile" / "base").glob("*.pt.trace.json.gz"))
    assert len(traces) == 1
    proc = run_cli("analyze", str(logdir))  # analyze finds it in the logdir without flags
    assert proc.returncode == 0 and "ProfilerStep#" in proc.stdout, proc.stderr[-2000:]


def test_mlflow_from_profile_reads_back(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(runs["root"] / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("torchscalpel")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "base" and run.data.params["script"] == str(SCRIPT)
    assert run.data.params["command"].startswith("scalpel profile")
    assert len(client.get_metric_history(run.info.run_id, "step.time_ms")) == 10
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"run.json", "report.html"}


def test_run_with_tensorboard_records_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "s.toml").write_text("[tune]\nthreads = 1\n")
    proc = run_cli(
        "run",
        "--config",
        str(tmp_path / "s.toml"),
        "--tensorboard",
        str(tmp_path / "tb"),
        "--",
        str(SCRIPT),
        "--steps",
        "5",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (events,) = [p for p in (tmp_path / "tb").iterdir() if p.is_dir()]
    acc = EventAccumulator(str(events))
    acc.Reload()
    assert [e.step for e in acc.Scalars("step/time_ms")] == [0, 1, 2, 3, 4]


def test_a_missing_extra_is_one_sentence_and_the_run_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass _Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorboard' or name.startswith('tensorboard.') or name == 'mlflow':\n"
        "            raise ImportError(name)\n        return None\nsys.meta_path.insert(0, _Block())\n"
    )
    proc = run_cli(
        "profile",
        "--steps",
        "3",
        "--profile-steps",
        "0",
        "--no-report",
        "--out",
        str(tmp_path / "r"),
        "--tensorboard",
        str(tmp_path / "tb"),
        "--mlflow",
        str(tmp_path / "ml"),
        "--",
        str(SCRIPT),
        cwd=tmp_path,
        PYTHONPATH=os.pathsep.join([str(blocker), str(REPO / "src")]),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "r" / "run.json").is_file()
    assert (
        "scalpel: tensorboard: not written, the tensorboard package is not installed "
        "(pip install 'torchscalpel[tracking]')." in proc.stderr
    )
    assert "scalpel: mlflow: not written, the mlflow package is not installed" in proc.stderr


def test_doctor_with_tensorboard_and_mlflow(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = run_cli(
        "doctor",
        "--steps",
        "4",
        "--no-static",
        "--out",
        str(tmp_path / "doc"),
        "--tensorboard",
        str(tmp_path / "tb"),
        "--mlflow",
        str(tmp_path / "ml"),
        "--",
        str(SCRIPT),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc = EventAccumulator(str(tmp_path / "tb" / "doc"))
    acc.Reload()
    assert len(acc.Scalars("step/time_ms")) >= 4
    assert "scalpel: mlflow: run " in proc.stderr


@pytest.mark.slow
def test_tune_writes_its_baseline_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tune"
    proc = run_cli(
        "tune",
        "--knobs",
        "threads",
        "--budget",
        "2m",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--confirm",
        "1",
        "--out",
        str(out),
        "--config",
        str(tmp_path / "scalpel.toml"),
        "--tensorboard",
        str(tmp_path / "tb"),
        "--",
        str(SCRIPT),
        "--steps",
        "40",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = EventAccumulator(str(tmp_path / "tb" / "tune"))
    acc.Reload()
    assert len(acc.Scalars("step/time_ms")) >= 3  # the baseline's warm-up + measured steps
