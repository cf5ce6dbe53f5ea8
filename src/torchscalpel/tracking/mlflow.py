"""``--mlflow URI``: the run's metrics, parameters and files in an MLflow tracking store.

``URI`` is anything MLflow's client takes (``http://...``, ``sqlite:///...``, ``file:...``) or a
plain folder, taken as a local file store. MLflow 3 keeps its file store in maintenance mode and
refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``; naming a folder is that choice, so it is set
for this process when the URI is a file store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from torchscalpel.record import RunRecord
from torchscalpel.tracking.scalars import run_params, run_scalars, step_scalars

EXPERIMENT = "torchscalpel"
"""The experiment runs go to unless ``MLFLOW_EXPERIMENT_NAME`` names another."""
MAX_PARAM = 6000
"""MLflow's limit on a parameter value's length (longer values are cut, not refused)."""


def tracking_uri(uri: str) -> str:
    """A plain path becomes a ``file:`` URI; anything with a scheme is passed through."""
    if "://" in uri or uri.startswith("file:"):
        return uri
    return Path(uri).expanduser().resolve().as_uri()


def write_mlflow(record: RunRecord, run_dir: Path | None, uri: str, *, run: str) -> str:
    """Log ``record`` as one MLflow run; return its run id. ImportError when mlflow is absent."""
    uri = tracking_uri(uri)
    if not uri.startswith("file:"):
        return _write(record, run_dir, uri, run=run)
    saved = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the user named a folder: a file store is what they chose
    try:
        return _write(record, run_dir, uri, run=run)
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = saved


def _write(record: RunRecord, run_dir: Path | None, uri: str, *, run: str) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking_uri=uri)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    mlrun = client.create_run(experiment_id, run_name=run, tags={"torchscalpel.record": record.name})
    run_id = mlrun.info.run_id
    now = int(time.time() * 1000)
    metrics = [
        Metric(key=tag.replace("/", "."), value=value, timestamp=now, step=index)
        for index, values in step_scalars(record)
        for tag, value in values.items()
    ]
    last = record.steps[-1].index if record.steps else 0
    metrics += [
        Metric(key=tag.replace("/", "."), value=value, timestamp=now, step=last)
        for tag, value in run_scalars(record).items()
    ]
    params = [Param(key=k, value=v[:MAX_PARAM]) for k, v in run_params(record).items()]
    for start in range(0, max(len(metrics), 1), 1000):  # MLflow caps a batch at 1000 metrics
        client.log_batch(
            run_id,
            metrics=metrics[start : start + 1000],
            params=params if start == 0 else [],
            tags=[RunTag("torchscalpel.status", record.status)] if start == 0 else [],
        )
    if run_dir is not None:
        for role in ("record", "report"):
            name_ = record.artifacts.get(role) or {"record": "run.json"}.get(role)
            if name_ and (run_dir / name_).is_file():
                client.log_artifact(run_id, str(run_dir / name_))
    status = {"failed": "FAILED", "interrupted": "KILLED"}.get(record.status, "FINISHED")
    client.set_terminated(run_id, status=status)
    return run_id
