"""tune -> fix on a combined winner, for real (issue 37): a tiny transformers Llama loop whose tune winner
is ``amp=bf16 + amp_fp32_attention``. The record is the baseline trial tune runs (its facts say where the
attention ran, its sites where the model, forward and backward are) with the tune section set to that
winner; fix patches both parts, the patched script runs under plain python and trains exactly as tune's
trial of the winner did. And tune's compile trial on a script that saves the whole model is judged.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_cli

pytest.importorskip("libcst")
pytest.importorskip("transformers")

from torchscalpel.record import load_record, save_record
from torchscalpel.runtime.target import Target
from torchscalpel.tune.apply import code_lines
from torchscalpel.tune.runner import run_trial
from torchscalpel.tune.settings import CompileSpec, TuneSettings

FIXTURES = REPO / "tests" / "fixtures" / "tune"
WINNER = TuneSettings(amp="bf16", amp_fp32_attention=True)


def _project(tmp_path: Path, fixture: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(fixture, root / "train.py")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "."], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "init"], check=True)
    return root / "train.py"


def _trial(label: str, settings: TuneSettings, verdict: str, pair: list[float]) -> dict[str, object]:
    return {
        "label": label,
        "settings": settings.to_dict(),
        "status": "ok",
        "verdict": verdict,
        "baseline_ms": pair[0],
        "median_ms": pair[1],
        "confirm_pairs": [pair] if verdict == "winner" else [],
    }


def test_a_combined_winner_is_patched_whole_and_trains_as_tune_measured(tmp_path: Path) -> None:
    script = _project(tmp_path, FIXTURES / "llama_loop.py")
    target = Target(script=script, args=["--steps", "6"])
    run = tmp_path / "tune-run"
    base = run_trial(target, TuneSettings(), run, warmup=1, steps=3, seed=0, timeout_s=300, facts=True)
    assert base.status == "ok", base.cause
    assert base.facts["attention_sites"] == [{"file": str(script), "line": 33, "library": "transformers"}]
    measured = run_trial(target, WINNER, tmp_path / "winner", warmup=1, steps=3, seed=0, timeout_s=300)
    assert measured.status == "ok", measured.cause

    record = load_record(run)
    record.name = "tune"
    winner = _trial(WINNER.label(), WINNER, "winner", [100.0, 75.8])
    record.sections["tune"] = {
        "settings": WINNER.to_dict(),
        "winner": winner,
        "trials": [winner, _trial("amp=bf16", TuneSettings(amp="bf16"), "not faster", [100.0, 123.5])],
        "code_lines": code_lines(WINNER),
        "facts": base.facts,
    }
    save_record(record, run)

    done = run_cli("fix", str(run), "--apply", cwd=script.parent)
    assert done.returncode == 0, done.stderr
    said = (done.stdout + done.stderr).splitlines()
    assert (
        "patched: autocast bf16 (train.py:33)" in said and "patched: amp_fp32_attention (train.py:29)" in said
    )
    assert not any(line.startswith("not patched") for line in said), said
    patched = script.read_text(encoding="utf-8")
    # autocast holds the forward only: zero_grad, backward and step stay outside
    assert (
        '        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):\n'
        "            out = model(input_ids=x, labels=x)\n"
        "        opt.zero_grad()\n"
    ) in patched
    assert '    model.set_attn_implementation("sdpa_fp32")\n    opt = torch.optim.AdamW(' in patched

    ran = subprocess.run(
        [sys.executable, "train.py", "--steps", "4"],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    losses = [float(v) for v in re.findall(r"^loss \d+ (\S+)$", ran.stdout, re.MULTILINE)]
    # the same numbers as tune's trial of the winner (its warm-up step and 3 measured ones), not bf16 alone's
    assert losses == measured.losses
    assert losses != base.losses

    again = run_cli("fix", str(run), cwd=script.parent)  # idempotent: both parts found done
    said = again.stdout + again.stderr
    assert again.returncode == 0 and "already done: amp_fp32_attention" in said and "no diff" in said, said


def test_tune_judges_compile_on_a_script_that_saves_the_whole_model(tmp_path: Path) -> None:
    saved = tmp_path / "model.pt"
    target = Target(script=FIXTURES / "saves_model.py", args=["--steps", "12", "--save", str(saved)])
    for region in ("Block", "model"):
        spec = CompileSpec(target=region, backend="aot_eager")
        result = run_trial(
            target, TuneSettings(compile=spec), tmp_path / region, warmup=2, steps=3, seed=0, timeout_s=240
        )
        # before: PicklingError from the script's torch.save(model, f), and compile was never judged
        assert result.status == "ok", result.cause
        assert result.median_ms and "compile" in result.apply["fired"]
        assert saved.is_file()
        saved.unlink()
