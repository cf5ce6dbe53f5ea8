"""--mlflow's run, read back with MLflow's own client. Moved from tests/unit/test_tracking.py: importing MLflow
starts a process (``uname -p``, for the platform string of its telemetry)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchscalpel.tracking import TrackingOptions, write_tracking
from tracking_runs import make_run


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
