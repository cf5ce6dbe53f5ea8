"""``torchscalpel.tune`` in this process: the tune stage's one ``run`` with the CLI's defaults, a typed result
and every output written; its trials answered without starting a process (the search itself is under test in
test_tune_search.py)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from test_tune_search import FakeRunner

import torchscalpel
from torchscalpel.cli.main import build_parser
from torchscalpel.tune import search as search_mod
from torchscalpel.tune.options import TuneOptions
from torchscalpel.tune.settings import TuneSettings, read_settings_file
from torchscalpel.tune.window import MIN_MEASURE_S, TUNE_STEPS


def test_tune_in_process_writes_what_scalpel_tune_writes(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    script = tmp_path / "train.py"
    script.write_text("print('never run: the trials are answered')\n", encoding="utf-8")
    out = tmp_path / "tune"
    result = torchscalpel.tune(script, "--epochs", "1", budget_s=60, knobs=["amp"], out=out)
    assert isinstance(result, torchscalpel.TuneRunResult) and result.exit_code == 0
    assert result.search is not None and result.search.winner is not None
    assert result.paths["record"] == out / "run.json" and "config" not in result.paths  # no config= given
    assert read_settings_file(out / "scalpel.toml") == TuneSettings(amp="bf16", amp_fp32_attention=True)
    record = json.loads((out / "run.json").read_text())
    assert record["sections"]["tune"]["winner"]["label"] == "amp=bf16 + amp_fp32_attention"
    assert (out / "report.html").is_file() and (out / "code.txt").is_file()


def test_tune_in_process_has_the_cli_defaults() -> None:
    api = {k: p.default for k, p in inspect.signature(torchscalpel.tune).parameters.items()}
    args = build_parser().parse_args(["tune", "x.py"])
    assert args.steps == "auto" and api["steps"] is None  # None is --steps auto: TUNE_STEPS, MIN_MEASURE_S
    assert (api["warmup"], api["confirm_pairs"], api["seed"]) == (args.warmup, args.confirm, args.seed)
    assert args.budget == "10m" and api["budget_s"] == 600.0 == TuneOptions().budget_s
    assert (TUNE_STEPS, MIN_MEASURE_S) == (10, 2.0)


def test_tune_in_process_refuses_bad_values_naming_the_argument(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^confirm_pairs must be at least 1"):
        torchscalpel.tune(script, confirm_pairs=0)
    with pytest.raises(ValueError, match=r"^budget_s must be positive"):
        torchscalpel.tune(script, budget_s=0)
