"""scalpel launch says what it does: resuming (or --fresh), --plan-strict, one meaning of "step time"."""

from __future__ import annotations

from torch import nn

from torchscalpel import distributed as sd
from torchscalpel.distributed import preflight
from torchscalpel.distributed.rankmerge import STEP_TIME_MEANS, merge, rank_row
from torchscalpel.distributed.resume import announce, find_resumes, start_fresh
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report.launch_terminal import table as format_table


def _checkpoint(root, step):
    ckpt = sd.Checkpointer(root, model=nn.Linear(2, 2), sigterm=False)
    ckpt.save(step)
    ckpt.close()


def test_resume_is_announced_and_fresh_moves_the_folder_aside(single_rank, tmp_path):
    _checkpoint(tmp_path / "ckpt", 10)
    (tmp_path / "data").mkdir()
    elsewhere = tmp_path / "runs" / "deep" / "ck"
    _checkpoint(elsewhere, 3)
    resumes = find_resumes(tmp_path, ["--ckpt-dir", "runs/deep/ck", "--lr=3"])
    assert [r.root for r in resumes] == [tmp_path / "ckpt", elsewhere]
    lines = announce(resumes, tmp_path)
    assert lines[0] == "scalpel launch: resuming from ckpt/step-000000010; pass --fresh to start over"
    assert lines[1].startswith("scalpel launch: resuming from runs/deep/ck/step-000000003")
    moved = start_fresh(resumes[:1], tmp_path)
    assert "moved ckpt aside to ckpt.before-fresh-" in moved[0] and "(it held step-000000010)" in moved[0]
    assert not (tmp_path / "ckpt").exists()
    assert [r.root for r in find_resumes(tmp_path, [])] == []  # the moved folder is not announced again
    assert len(list(tmp_path.glob("ckpt.before-fresh-*/step-000000010"))) == 1  # kept, not deleted


def test_plan_strict_refuses_to_launch_when_nothing_fits(tmp_path, monkeypatch, capsys):
    from torchscalpel.cli.main import main

    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the ranks must not start')\n")
    started = []
    monkeypatch.setattr(
        preflight,
        "run_preflight",
        lambda args, out: preflight.Preflight(True, False, ["WARNING: this run will not fit"]),
    )
    monkeypatch.setattr("torchscalpel.distributed.launch.launch", lambda *a, **k: started.append(1) or 0)
    code = main(
        ["launch", "--nproc", "2", "--plan", "--plan-strict", "--out", str(tmp_path / "o"), "--", str(script)]
    )
    assert code == 1 and started == []
    assert "--plan-strict: no strategy fits, so no rank was started" in capsys.readouterr().err
    monkeypatch.setattr(
        preflight, "run_preflight", lambda args, out: preflight.Preflight(True, True, ["fits"])
    )
    assert main(
        ["launch", "--nproc", "2", "--plan", "--plan-strict", "--out", str(tmp_path / "p"), "--", str(script)]
    ) == 0 and started == [1]
    assert main(["launch", "--nproc", "2", "--plan-strict", "--", str(script)]) == 2


def test_step_time_leaves_profiled_steps_out_and_says_so_once():
    steps = [StepRecord(index=0, warmup=True, total_ms=999.0)]
    steps += [StepRecord(index=i + 1, total_ms=t, data_ms=1.0) for i, t in enumerate([10.0, 12.0, 11.0])]
    steps += [StepRecord(index=4 + i, total_ms=t, profiled=True) for i, t in enumerate([30.0, 32.0])]
    record = RunRecord(
        status="stopped", steps=steps, profiler={"steps": [4, 5], "categories": {"communication": 8000.0}}
    )
    row = rank_row(0, record)
    assert row["step_ms"] == 11.0  # what the rank's own summary calls its median step
    assert row["collective_ms"] == 4.0 and row["compute_ms"] == 27.0  # both from the profiled steps
    table = format_table(merge({0: record, 1: record}))
    assert table.count(STEP_TIME_MEANS) == 1
