"""``scalpel lr`` end to end: a plain loop beside Lightning's Tuner.lr_find on the same model, a
Lightning fit (optimizer.step through closures) and HF Trainer (a LambdaLR) under the sweep, bad input."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from torchscalpel.lrfind.sweep import schedule, suggest

CORPUS = REPO / "benchmarks" / "lr_corpus"
FIXTURES = REPO / "tests" / "fixtures"


def _lr_section(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())["sections"]["lr"]


def test_plain_loop_against_lightning_on_the_same_model(tmp_path: Path) -> None:
    """The corpus MLP (SGD + momentum, seeded), 100 steps from 1e-7 to 10, under scalpel lr and under
    Tuner.lr_find: scalpel's suggestion is within a factor of 2 of scalpel's rule applied to the curve
    Lightning recorded (the two runs measure the same curve). Tuner.lr_find's own suggestion is not
    held to it: its slope per linear lr follows the flat start's noise (BENCHMARKS.md, docs/lr.md)."""
    done = run_cli(
        "lr",
        "--out",
        str(tmp_path / "lr"),
        "--",
        str(CORPUS / "plain.py"),
        "mlp",
        cwd=tmp_path,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "suggested lr:" in done.stdout and "discard them" in done.stdout
    ours = _lr_section(tmp_path / "lr")
    assert len(ours["points"]) == 100
    # the second suggestion, fastai's smoothed minimum / 10 (it trains better on the corpus: BENCHMARKS.md)
    tenth = ours["min_over_10"]
    assert tenth is not None and tenth["lr"] == tenth["min_lr"] / 10
    assert f"minimum / 10: {tenth['lr']:.3g} (" in done.stdout
    assert ours["scheduler_steps_suspended"] >= 99  # plain.py steps a LambdaLR after every optimizer step
    theirs_run = subprocess.run(
        [sys.executable, str(CORPUS / "lightning_version.py"), "mlp"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    assert theirs_run.returncode == 0, theirs_run.stderr[-2000:]
    theirs = json.loads(theirs_run.stdout.strip().splitlines()[-1])
    finite = [
        (lr, loss) for lr, loss in zip(theirs["lr"], theirs["loss"], strict=True) if math.isfinite(loss)
    ]
    on_theirs = suggest([lr for lr, _ in finite], [loss for _, loss in finite])
    assert ours["suggestion"] is not None and on_theirs is not None
    assert 0.5 <= ours["suggestion"]["lr"] / on_theirs.lr <= 2.0, (ours["suggestion"], on_theirs)
    html = (tmp_path / "lr" / "report.html").read_text()
    assert 'data-chart="lr-range-test"' in html


def test_lightning_fit_sees_the_swept_lr_through_its_closures(tmp_path: Path) -> None:
    log = tmp_path / "lrs.txt"
    done = run_cli(
        "lr",
        "--min",
        "1e-4",
        "--max",
        "10",
        "--steps",
        "30",
        "--out",
        str(tmp_path / "lr"),
        "--no-report",
        "--",
        str(FIXTURES / "lr" / "lightning_fit.py"),
        str(log),
        cwd=tmp_path,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    section = _lr_section(tmp_path / "lr")
    seen = [float(x) for x in log.read_text().split()]
    expected = schedule(1e-4, 10.0, 30)
    # every optimizer step ran with the sweep's lr, not the LambdaLR's warm-up value (0.05 * (s+1)/100)
    assert seen[: len(section["points"])] == pytest.approx(expected[: len(section["points"])])
    assert [p["lr"] for p in section["points"]] == pytest.approx(expected[: len(section["points"])])
    assert all(p["loss"] is not None for p in section["points"])
    assert section["scheduler_steps_suspended"] >= len(section["points"]) - 1


def test_hf_trainer_lambda_lr_is_suspended(tmp_path: Path) -> None:
    done = run_cli(
        "lr",
        "--min",
        "1e-5",
        "--max",
        "1",
        "--steps",
        "12",
        "--out",
        str(tmp_path / "lr"),
        "--no-report",
        "--",
        str(FIXTURES / "corpus" / "hf_trainer.py"),
        cwd=tmp_path,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    section = _lr_section(tmp_path / "lr")
    assert len(section["points"]) == 12
    assert [p["lr"] for p in section["points"]] == pytest.approx(schedule(1e-5, 1.0, 12))
    assert section["scheduler_steps_suspended"] >= 11
    assert all(p["loss"] is not None and math.isfinite(p["loss"]) for p in section["points"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min", "0"], "--min must be a positive finite learning rate"),
        (["--min", "1", "--max", "0.1"], "must be below --max"),
        (["--steps", "2"], "--steps must be a whole number of at least 8"),
        # finite, but max/min overflows: it swept lr = inf and wrote NaN into run.json
        (
            ["--max", "1e308"],
            "--max 1e+308 is 315 decades above --min 1e-07: the sweep's ratio max/min overflows",
        ),
        (["--max", "inf"], "--max must be a positive finite learning rate, got inf"),
        (["--max", "nan"], "--max must be a positive finite learning rate, got nan"),
        (["--max", "-1"], "--max must be a positive finite learning rate, got -1"),
    ],
)
def test_bad_sweeps_are_one_sentence_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    done = run_cli("lr", *flags, "--", str(CORPUS / "plain.py"), "mlp", cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "scalpel-runs").exists()


def test_a_short_script_gets_no_suggestion_but_how_far_it_got(tmp_path: Path) -> None:
    """The corpus MLP for one epoch of 20 batches: 20 of the sweep's 100 steps, up to lr 3.43e-06 of 1e-7 -> 10
    and no divergence (as pytorch/examples mnist for one epoch). Before, it printed "suggested lr: 2.1e-07" from
    that start of the curve; now neither suggestion is given, in the terminal, run.json or report.html, and the
    output names the script's own --epochs/--batches arguments and --steps 20."""
    done = run_cli(
        "lr", "--out", str(tmp_path / "lr"), "--", str(CORPUS / "plain.py"), "mlp", "--epochs", "1",
        "--batches", "20", cwd=tmp_path, OMP_NUM_THREADS="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    section = _lr_section(tmp_path / "lr")
    assert len(section["points"]) == section["steps_run"] == 20 and section["divergence"] is None
    assert section["suggestion"] is None and section["min_over_10"] is None
    assert section["reached_lr"] == pytest.approx(schedule(1e-7, 10.0, 100)[19])
    assert section["range_share"] == pytest.approx(19 / 99)
    assert section["not_measured"].startswith(
        "the script ended after 20 of the sweep's 100 steps, at lr 3.43e-06"
    )
    out = " ".join(done.stdout.split())  # the terminal may wrap the prose
    assert "suggested lr: not measured: the script ended after 20 of the sweep's 100 steps" in out
    assert "minimum / 10: not measured" in out
    assert "(its --epochs, --batches arguments)" in out and "scalpel lr --steps 20 " in out
    assert "train afresh" not in out and not re.search(r"suggested lr: \d", out)
    html = (tmp_path / "lr" / "report.html").read_text()
    assert "suggested lr: not measured" in html and not re.search(r"suggested \d", html)


def test_a_script_without_an_optimizer_is_told_nothing_was_swept(tmp_path: Path) -> None:
    script = tmp_path / "no_optimizer.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\nfor _ in range(5):\n"
        "    m(torch.randn(8, 4)).pow(2).mean().backward()\n"
    )
    done = run_cli("lr", "--out", str(tmp_path / "lr"), "--no-report", "--", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = " ".join(done.stdout.split())
    assert "swept no lr: none of the sweep's 100 steps (1e-07 -> 10) ran" in out
    assert "suggested lr: not measured: the script never called an optimizer's step()" in out
    assert "suggested lr" not in out.replace("suggested lr: not measured", "")
    assert "train afresh" not in out
    section = _lr_section(tmp_path / "lr")
    assert section["suggestion"] is None and section["steps_run"] == 0 and section["not_measured"]


def test_batch_names_the_best_size_and_states_the_lr_rule(tmp_path: Path) -> None:
    done = run_cli(
        "batch", "--sizes", "8,64", "--steps", "3", "--warmup", "1", "--out", str(tmp_path / "b"),
        "--", str(CORPUS / "plain.py"), "mlp", cwd=tmp_path, OMP_NUM_THREADS="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    section = json.loads((tmp_path / "b" / "run.json").read_text())["sections"]["batch"]
    rows = {r["batch_size"]: r for r in section["rows"]}
    assert set(rows) == {8, 64} and all(r["fits"] and r["samples_per_s"] > 0 for r in rows.values())
    assert section["best"] == max(rows, key=lambda b: rows[b]["samples_per_s"])
    assert section["script_batch_size"] == 32 and section["optimizer"] == "SGD"
    assert "linearly" in section["advice"] and "not applied" in section["advice"]
    assert f"best samples/s at batch {section['best']}" in done.stdout
    page = (tmp_path / "b" / "report.html").read_text()
    assert 'id="batch"' in page and f"Best samples/s at batch <b>{section['best']}</b>" in page


def test_batch_names_no_best_size_when_no_loader_took_the_sizes(tmp_path: Path) -> None:
    """A script that makes its own batches (no DataLoader) ran its own batch at every size: before, the finder
    named "best samples/s at batch 64" from two runs of the same batch; now each size is not measured."""
    script = tmp_path / "own_batches.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(8, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(20):\n    loss = m(torch.randn(32, 8)).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    )
    done = run_cli(
        "batch", "--sizes", "8,64", "--steps", "3", "--warmup", "1", "--out", str(tmp_path / "b"), "--no-report",
        "--", str(script), cwd=tmp_path, OMP_NUM_THREADS="1",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    section = json.loads((tmp_path / "b" / "run.json").read_text())["sections"]["batch"]
    assert section["best"] is None
    assert all(r["fits"] is None and r["samples_per_s"] is None for r in section["rows"])
    out = " ".join(done.stdout.split())
    assert "8 not measured: the script built no DataLoader, so batch 8 was never set" in out
    assert (
        "best samples/s: not measured: no size was measured" in out and "best samples/s at batch" not in out
    )
