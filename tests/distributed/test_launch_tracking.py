"""scalpel launch --profile with --tensorboard / --mlflow, and the traces/ folder HTA reads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import REPO, run_cli, run_ranks
from torchscalpel.distributed.launch import build_parser, rank_command
from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.errors import UsageError
from torchscalpel.trace.layout import trace_rank

pytestmark = pytest.mark.dist
EXAMPLE = REPO / "examples" / "ddp_fsdp_transformer.py"


def test_tracking_flags_reach_every_rank_and_need_a_stage(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    args = build_parser().parse_args(
        ["--nproc", "2", "--profile", "--tensorboard", "tb", "--mlflow", "ml", "--", str(script), "--lr", "1"]
    )
    options = LaunchOptions.from_args(args, env={})
    assert options.stage == "profile"
    assert list(rank_command(options, tmp_path).args) == [
        "profile",
        str(tmp_path),
        "--steps",
        "20",
        "--tensorboard",
        "tb",
        "--mlflow",
        "ml",
        "--",
        str(script),
        "--lr",
        "1",
    ]
    plain = build_parser().parse_args(["--nproc", "2", "--tensorboard", "tb", "--", str(script)])
    with pytest.raises(UsageError, match="need --profile or --doctor"):
        LaunchOptions.from_args(plain, env={})


@pytest.mark.slow
def test_launch_profile_tensorboard_per_rank_and_hta_layout(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, logdir = tmp_path / "prof", tmp_path / "tb"
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--profile",
        "--steps",
        "3",
        "--tensorboard",
        str(logdir),
        "--out",
        str(out),
        "--",
        str(EXAMPLE),
        "--steps",
        "40",
        "--workers",
        "0",
        "--ckpt",
        str(tmp_path / "ckpt"),
        cwd=tmp_path,
        timeout=280,
        expect=[out / "launch.json"],
    )
    assert (out / "launch.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank in (0, 1):
        acc = EventAccumulator(str(logdir / "prof" / f"rank{rank}"))
        acc.Reload()
        assert len(acc.Scalars("step/time_ms")) >= 3
        assert (logdir / "plugins" / "profile" / "prof" / f"rank{rank}.pt.trace.json.gz").is_file()
    traces = sorted((out / "traces").iterdir())
    assert [p.name for p in traces] == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    assert [trace_rank(p) for p in traces] == [0, 1]  # torch wrote distributedInfo under gloo
    with gzip.open(traces[1], "rt") as f:
        data = json.load(f)
    assert data["distributedInfo"]["world_size"] == 2
    assert any(e.get("ph") == "C" and e["name"].startswith("Memory") for e in data["traceEvents"])
    analyzed = run_cli("analyze", str(out))
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    assert "rank 0 · cpu" in analyzed.stdout and "rank 1 · cpu" in analyzed.stdout
