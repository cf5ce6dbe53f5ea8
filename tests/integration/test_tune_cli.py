"""``scalpel tune`` and ``scalpel run`` end to end on a tiny fixture script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune"
TINY = FIXTURES / "tiny_train.py"


@pytest.mark.slow
def test_tune_end_to_end_writes_table_record_report_and_settings(tmp_path):
    out = tmp_path / "out"
    config = tmp_path / "scalpel.toml"
    proc = run_cli(
        "tune",
        "--knobs",
        "optimizer,channels_last,compile",
        "--compile-backend",
        "aot_eager",
        "--budget",
        "4m",
        "--steps",
        "3",
        "--warmup",
        "2",
        "--confirm",
        "1",
        "--out",
        str(out),
        "--config",
        str(config),
        "--",
        str(TINY),
        "--steps",
        "40",
        "--crash-with-fused",
        "--break",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "variants ranked" in proc.stderr
    # progress counts "trial N of M" with the budget left; the table names each ratio's baseline
    assert "trial 1 of " in proc.stderr and " s left)" in proc.stderr
    assert "vs baseline ms" in proc.stderr and "profile of the baseline:" in proc.stderr
    data = json.loads((out / "run.json").read_text())
    tune = data["sections"]["tune"]
    trials = {t["label"]: t for t in tune["trials"]}
    # the baseline was profiled and classified; every trial that ran says why it was chosen
    assert tune["facts"]["bottleneck"]["shares"], tune["facts"]["bottleneck"]
    ran = [t for t in tune["trials"] if t["verdict"] not in ("skipped",)]
    assert ran and all(t["reason"] for t in ran)
    assert all(t["baseline_ms"] for t in ran if t["speedup"] is not None)
    # a crash in one trial is reported with its cause and the search goes on
    assert trials["optimizer=fused"]["verdict"] == "failed"
    assert "this script refuses fused optimizers" in trials["optimizer=fused"]["cause"]
    # a knob that cannot apply is skipped with the reason
    assert trials["channels_last"]["verdict"] == "skipped" and "no Conv2d" in trials["channels_last"]["cause"]
    # compile regions: repeated blocks first, then the whole model; graph breaks counted per region
    block = (
        trials["compile(Block, backend=aot_eager)"]
        if "compile(Block, backend=aot_eager)" in trials
        else next(t for label, t in trials.items() if label.startswith("compile(Block"))
    )
    assert block["compile"]["graph_breaks"] >= 1
    # triage: the break with file:line and reason; fullgraph was attempted and failed there
    assert any(b["where"].startswith(str(TINY)) and b["reason"] for b in block["compile"]["breaks"])
    assert block["compile"]["fullgraph"]["attempted"] and not block["compile"]["fullgraph"]["ok"]
    assert any(label.startswith("compile(model") for label in trials)
    for t in tune["trials"]:
        assert t["verdict"] in {
            "winner",
            "faster",
            "not faster",
            "numerics",
            "failed",
            "timeout",
            "skipped",
            "not applied",
            "not run",
            "not confirmed",
        }
        if t["deviation"] is not None and t["verdict"] != "numerics":
            assert t["deviation"] <= t["tolerance"]
    # never recommended without confirmation beyond the margin
    if tune["winner"]:
        assert tune["confirmed_speedup"] >= tune["required_speedup"]
    # a settings file only when something is recommended (an empty [tune] table applies nothing)
    assert (out / "scalpel.toml").exists() == config.exists() == bool(tune["winner"])
    assert "Tune: variants ranked" in (out / "report.html").read_text()
    # scalpel run applies what tune wrote
    if config.exists():
        ran = run_cli("run", "--config", str(config), "--show", "--", str(TINY), "--steps", "3", timeout=120)
        assert ran.returncode == 0, ran.stderr[-2000:]


@pytest.mark.slow
def test_a_compile_failure_is_traced_to_one_function_excluded_and_retried(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        "tune",
        "--knobs",
        "compile",
        "--compile-backend",
        "tiny_no_sin",
        "--budget",
        "3m",
        "--steps",
        "3",
        "--warmup",
        "2",
        "--confirm",
        "1",
        "--out",
        str(out),
        "--config",
        str(tmp_path / "scalpel.toml"),
        "--",
        str(TINY),
        "--steps",
        "30",
        "--sin",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tune = json.loads((out / "run.json").read_text())["sections"]["tune"]
    block = next(t for t in tune["trials"] if t["label"].startswith("compile(Block"))
    assert block["status"] == "ok", block  # the retry ran: the trial measured steps
    (excluded,) = block["compile"]["excluded"]
    assert excluded["function"] == "wobble" and excluded["where"].startswith(f"{TINY}:")
    assert "cannot lower sin" in excluded["cause"]
    assert block["deviation"] is not None and block["deviation"] <= block["tolerance"]
    assert any("excluded with torch.compiler.disable and retried" in a for a in block["apply"]["applied"])
    assert "compile failed in wobble" in proc.stderr


def test_run_applies_settings_and_reports_them(tmp_path):
    config = tmp_path / "scalpel.toml"
    config.write_text(
        'version = "1.0"\n[tune]\namp = "bf16"\nthreads = 1\n[tune.dataloader]\nnum_workers = 1\n'
    )
    proc = run_cli("run", "--config", str(config), "--show", "--", str(TINY), "--steps", "3", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "scalpel run: amp=bf16 + num_workers=1 + threads=1" in proc.stderr
    assert "applied autocast(cpu, bfloat16) around Net" in proc.stderr
    assert "applied DataLoader num_workers=1" in proc.stderr


def test_run_passes_the_script_exit_code_and_skips(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nsys.exit(3)\n")
    config = tmp_path / "scalpel.toml"
    config.write_text("[tune]\nchannels_last = true\n")
    proc = run_cli("run", "--config", str(config), "--", str(script))
    assert proc.returncode == 3


@pytest.mark.parametrize(
    "args,needle",
    [
        (["tune", "--budget", "soon", "--", str(TINY)], "--budget 'soon' is not a duration"),
        (["tune", "--knobs", "amp,turbo", "--", str(TINY)], "Unknown knob turbo"),
        (["tune", "--compile-mode", "fastest", "--", str(TINY)], "--compile-mode takes"),
        (["tune", "--steps", "1", "--", str(TINY)], "--steps must be at least 2"),
        (["tune", "--min-measure", "a while", "--", str(TINY)], "--min-measure 'a while' is not a duration"),
        (["tune"], "Name the script to run"),
        (["tune", "--", "missing.py"], "does not exist"),
        (["run", "--config", "nope.toml", "--", str(TINY)], "does not exist"),
    ],
)
def test_usage_errors_are_one_sentence_exit_2(args, needle, tmp_path, monkeypatch, capsys):
    # In-process: validation happens before any script runs, so no subprocess is needed.
    from torchscalpel.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_tune_refuses_a_script_whose_baseline_fails(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise ValueError('no data here')\n")
    proc = run_cli(
        "tune",
        "--budget",
        "60s",
        "--out",
        str(tmp_path / "o"),
        "--config",
        str(tmp_path / "c.toml"),
        "--",
        str(script),
        timeout=120,
    )
    assert proc.returncode == 1
    assert "The baseline run failed" in proc.stderr and "no data here" in proc.stderr
    assert "Traceback" not in proc.stderr.split("scalpel: error")[-1]


def test_run_under_a_memory_limit_needs_no_config(tmp_path, monkeypatch, capsys):
    # 'scalpel run --memory-limit SIZE -- SCRIPT' checks a fix made in the script itself: no scalpel.toml
    # in the folder and no --config, so it runs the script as it is under the limit (it used to refuse:
    # "Config file scalpel.toml does not exist").
    from torchscalpel.cli.main import main

    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "n = int(sys.argv[1])\n"
        "model = torch.nn.Linear(256, 256)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    model(torch.randn(n, 256)).square().mean().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "print('trained', flush=True)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--memory-limit", "64MiB", "--", str(script), "8"]) == 0
    out, err = capsys.readouterr()
    assert "trained" in out
    assert "no --config and no ./scalpel.toml: no tuning settings" in err
    assert "under the limit 64.0 MiB" in err
    # the same limit still stops a batch that does not fit, and says so
    assert main(["run", "--memory-limit", "64MiB", "--", str(script), "40000"]) == 1
    assert "scalpel memory --memory-limit 64MiB" in capsys.readouterr().err
    # without --memory-limit a missing default config is still the clear usage error
    assert main(["run", "--", str(script), "8"]) == 2
    assert "scalpel.toml does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_every_output_of_a_tune_run_shows_the_same_speedup(tmp_path):
    # A step 30 ms slower unless the optimizer is fused: optimizer=fused wins screening and confirmation
    # on any load. The terminal table, the recommendation, report.html, run.json, code.txt and
    # scalpel.toml must show one figure for it (one run showed 1.64x in its table and 1.32x below it).
    import html
    import re

    out, config = tmp_path / "out", tmp_path / "scalpel.toml"
    proc = run_cli(
        "tune",
        "--knobs",
        "optimizer",
        "--budget",
        "5m",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--confirm",
        "2",
        "--out",
        str(out),
        "--config",
        str(config),
        "--",
        str(TINY),
        "--steps",
        "30",
        "--slow-unfused",
        "30",
        timeout=400,
        OMP_NUM_THREADS="1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    tune = json.loads((out / "run.json").read_text())["sections"]["tune"]
    assert tune["winner"] and tune["winner"]["label"] == "optimizer=fused", tune["notes"]
    stored = next(t for t in tune["trials"] if t["label"] == "optimizer=fused")
    figure = f"{stored['speedup']:.2f}x"
    assert stored["speedup"] == tune["winner"]["speedup"] == tune["confirmed_speedup"]
    base_ms, cand_ms = stored["speedup_pair"]
    assert [base_ms, cand_ms] in stored["confirm_pairs"] and stored["speedup"] == pytest.approx(
        base_ms / cand_ms
    )
    # terminal: the table row and the recommendation
    row = next(line for line in text.splitlines() if line.startswith("│ optimizer=fused"))
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    assert cells[1:4] == [f"{cand_ms:.1f}", f"{base_ms:.1f}", figure], cells
    assert re.search(
        rf"recommended: optimizer=fused: {re.escape(figure)} faster per step than the baseline "
        r"\(2 interleaved pairs, spread \d+\.\d\d-\d+\.\d\dx\)",
        text,
    ), text[-2000:]
    # the files
    for name in ("code.txt", "scalpel.toml"):
        assert f"{figure} faster per step" in (out / name).read_text(), name
    assert f"{figure} faster per step" in config.read_text()
    page = html.unescape((out / "report.html").read_text())
    assert f"<b>{figure}</b>faster per step" in page
    assert f"recommended: optimizer=fused: {figure} faster per step" in page
    # no other figure for it anywhere: the screening ratio is said as the screening's
    screened = stored["baseline_ms"] / stored["median_ms"]
    assert f"screened {screened:.2f}x" in text or f"{screened:.2f}x" == figure  # a footnote under the table
