"""A run folder as ``scalpel profile`` leaves it, for the tracking writers' tests (tests/unit/test_tracking.py
and tests/integration/test_tracking_mlflow.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from torchscalpel.record import RunRecord, StepRecord, save_record
from torchscalpel.runtime.summary import summarize


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
