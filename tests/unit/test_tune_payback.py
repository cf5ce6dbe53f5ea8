"""Issue 39: compiled candidates at steady state, pays-back arithmetic, and verdicts that agree with
their table (tune/runner.steady_steps, tune/payback.py, stages/tune, report/tune_*)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from test_tune_search import FakeRunner

import torchscalpel.report.tune_terminal as tune_terminal
from torchscalpel.record import RunRecord
from torchscalpel.report.tune_sections import build
from torchscalpel.runtime.target import Target
from torchscalpel.sections import TuneSection
from torchscalpel.stages.tune import save_outputs
from torchscalpel.tune import search as search_mod
from torchscalpel.tune.payback import payback_of, run_steps
from torchscalpel.tune.runner import TrialResult, steady_steps
from torchscalpel.tune.search import TuneOptions, tune
from torchscalpel.tune.triage import guard_advice

# -- steady state ---------------------------------------------------------------------------------


def test_steps_before_a_compile_in_the_window_are_not_steady_state():
    steps = [(i, 100.0 if i == 4 else 50.0) for i in range(3, 13)]
    compiled = [{"index": 1, "warmup": True}, {"index": 4, "warmup": False, "compile_s": 2.5, "guard": ""}]
    kept, note = steady_steps(steps, compiled)
    assert kept == [50.0] * 8  # steps 5..12, after the compile in step 4
    assert "dynamo compiled during 1 of 10 measured step(s) (2.5 s" in note and "timed the 8 steps" in note


def test_a_window_that_keeps_compiling_is_not_measured_with_the_guard_and_its_fix():
    steps = [(i, 50.0) for i in range(3, 9)]
    guard = "0/3: ___check_obj_id(L['past_key_values']) # transformers/cache_utils.py:412"
    compiled = [{"index": i, "warmup": False, "compile_s": 1.0, "guard": guard} for i in (4, 6, 7)]
    kept, note = steady_steps(steps, compiled)
    assert kept == [] and note.startswith("not measured: dynamo compiled during 3 of 6")
    assert "model.config.use_cache = False" in note


def test_warmup_compiles_leave_every_measured_step():
    kept, note = steady_steps([(3, 1.0), (4, 2.0)], [{"index": 1, "warmup": True}])
    assert kept == [1.0, 2.0] and note == ""


@pytest.mark.parametrize(
    ("guard", "words"),
    [
        ("tensor 'x' size mismatch at index 0. expected 32, actual 17", "dynamic=True"),
        ("___check_type_id(L['past_key_values'].layers[0]) transformers/cache_utils.py", "use_cache"),
        ("___check_obj_id(L['self'].training)", ""),
    ],
)
def test_guard_advice_names_the_configuration_that_causes_a_recompile(guard, words):
    advice = guard_advice(guard)
    assert (words in advice) if words else advice == ""


# -- pays back ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "batches", "steps", "source"),
    [
        (["--steps", "2000"], None, 2000, "--steps 2000"),
        (["--lr", "3e-4", "--max_steps=500"], None, 500, "--max_steps 500"),
        (["--epochs", "3"], 469, 1407, "--epochs 3 x 469 batches"),
        (["--epochs", "3"], None, None, None),
        (["--batch-size", "64"], 100, None, None),
    ],
)
def test_the_run_length_comes_from_the_script_arguments(args, batches, steps, source):
    found = run_steps(args, batches)
    assert (found.steps, found.source) == (steps, source) if steps else found is None


def compile_trial(**extra) -> dict:
    return {
        "label": "compile(model)",
        "settings": {"compile": {"target": "model"}},
        "verdict": "winner",
        "confirm_pairs": [[180.0, 100.0], [200.0, 100.0], [160.0, 100.0]],
        "startup_ms": 43_000.0,
        "baseline_startup_ms": 2_000.0,
        "compile": {"compile_ms": 40_000.0},
        **extra,
    }


def test_compile_pays_back_after_its_one_time_cost_over_the_per_step_gain():
    value = payback_of(compile_trial(), {"startup_ms": 9_999.0}, run_steps(["--steps", "2000"], None))
    assert value is not None
    assert value.per_step == pytest.approx(1.8)  # the lower-median pair, 180/100
    assert value.one_time_s == pytest.approx(41.0)  # 43 s of warm-up above its steps, less the baseline's 2 s
    assert value.steps == 513  # ceil(41000 ms / 80 ms per step)
    assert value.end_to_end() == pytest.approx(2000 * 180 / (2000 * 100 + 41_000))
    text = value.sentence()
    assert text.startswith("compile(model): 1.80x per step, 41.0 s to compile")
    assert (
        "pays back after 513 steps; this run does 2,000 steps (--steps 2000): pays back, 1.49x end to end"
        in text
    )
    short = payback_of(compile_trial(), {}, run_steps(["--steps", "300"], None))
    assert short is not None and "does NOT pay back" in short.sentence()
    unknown = payback_of(compile_trial(), {}, None)
    assert unknown is not None and "the run's length is not known" in unknown.sentence()


def test_a_cold_first_compile_is_said_beside_the_warm_one_the_pairs_measured():
    # screening ran on a cold inductor cache (18 s above the baseline's start-up), the confirmation
    # runs on the warm one (41 s in the fixture's figures would be cold too: make them warm here)
    trial = compile_trial(compile={"compile_ms": 17_800.0, "first_startup_ms": 20_000.0})
    trial["startup_ms"], trial["baseline_startup_ms"] = 4_700.0, 2_000.0
    value = payback_of(trial, {}, run_steps(["--steps", "60"], None))
    assert value is not None
    assert value.one_time_s == pytest.approx(2.7) and value.first_s == pytest.approx(18.0)
    text = value.sentence()
    assert "2.7 s to compile" in text and "pays back after 34 steps" in text  # ceil(2700 / 80)
    assert (
        "pays back after 34 steps (18.0 s and 225 steps on a cold inductor cache, as on a new machine)"
        in text
    )
    assert value.to_dict()["first_s"] == pytest.approx(18.0)
    # a first run no slower to start than the pairs (the cache was warm already) is not said apart
    warm = compile_trial(compile={"compile_ms": 2_500.0, "first_startup_ms": 4_900.0})
    warm["startup_ms"], warm["baseline_startup_ms"] = 4_700.0, 2_000.0
    same = payback_of(warm, {}, None)
    assert same is not None and same.first_s is None and "cold" not in same.sentence()


def test_each_compile_mode_has_its_own_payback_line_with_its_own_compile_time():
    # max-autotune's longer compile (every GEMM choice compiled and timed) is what its line counts
    autotune = compile_trial(
        label="compile(model, max-autotune-no-cudagraphs)",
        settings={"compile": {"target": "model", "mode": "max-autotune-no-cudagraphs"}},
        confirm_pairs=[[180.0, 95.0]],
        startup_ms=122_000.0,
    )
    run = run_steps(["--steps", "2000"], None)
    default, tuned = payback_of(compile_trial(), {}, run), payback_of(autotune, {}, run)
    assert default is not None and tuned is not None
    assert tuned.one_time_s == pytest.approx(120.0) and default.one_time_s == pytest.approx(41.0)
    assert tuned.steps == 1412  # ceil(120000 ms / 85 ms per step)
    assert tuned.sentence().startswith("compile(model, max-autotune-no-cudagraphs): 1.89x per step, 120.0 s")
    assert tuned.end_to_end() < default.end_to_end()  # faster per step, slower over this run


def test_a_candidate_without_a_start_up_cost_has_no_payback_line():
    trial = {**compile_trial(), "settings": {"amp": "bf16"}, "label": "amp=bf16"}
    assert payback_of(trial, {}, None) is None


def test_a_slower_compile_never_pays_back():
    trial = compile_trial(confirm_pairs=[[100.0, 120.0]])
    value = payback_of(trial, {}, None)
    assert value is not None and value.steps is None and "never pays back" in value.sentence()


# -- one set of measurements behind the verdict, the table and the chart ---------------------------


def search(monkeypatch, tmp_path, medians, **opts):
    monkeypatch.setattr(search_mod, "run_trial", FakeRunner(medians))
    return tune(Target(script=Path("t.py")), TuneOptions(out_dir=tmp_path / "o", steps=3, **opts))


def test_nothing_recommended_writes_no_settings_file_and_says_so(monkeypatch, tmp_path):
    result = search(monkeypatch, tmp_path, {}, knobs=("amp",))
    assert result.winner is None
    config = tmp_path / "scalpel.toml"
    paths = save_outputs(result, tmp_path / "o", config_path=config, command=[], target_text="t.py")
    assert "settings" not in paths and "config" not in paths
    assert not config.exists() and not (tmp_path / "o" / "scalpel.toml").exists()
    assert "settings" not in json.loads((tmp_path / "o" / "run.json").read_text())["artifacts"]
    out = io.StringIO()
    tune_terminal.render(
        TuneSection.from_dict(result.to_dict()),
        out_dir=tmp_path / "o",
        config_path=None,
        out=Console(file=out, width=200),
        target_text="t.py",
    )
    text = out.getvalue()
    assert "no change recommended" in text and "no scalpel.toml written" in text and "apply with" not in text


def test_the_last_line_applies_the_file_actually_written(monkeypatch, tmp_path):
    result = search(monkeypatch, tmp_path, {"amp=bf16 + amp_fp32_attention": 60.0}, knobs=("amp",))
    config = tmp_path / "runs" / "scalpel.toml"
    config.parent.mkdir()
    paths = save_outputs(result, tmp_path / "o", config_path=config, command=[], target_text="t.py --x 1")
    assert f"apply with: scalpel run --config {config} -- t.py --x 1" in config.read_text()
    inner = tmp_path / "o" / "scalpel.toml"
    assert f"apply with: scalpel run --config {inner} -- t.py --x 1" in inner.read_text()
    out = io.StringIO()
    tune_terminal.render(
        TuneSection.from_dict(result.to_dict()),
        out_dir=tmp_path / "o",
        config_path=paths["config"],
        out=Console(file=out, width=200),
        target_text="t.py --x 1",
    )
    assert (
        out.getvalue().rstrip().splitlines()[-1] == f"apply with: scalpel run --config {config} -- t.py --x 1"
    )


def test_the_chart_draws_the_speedups_the_table_shows_in_its_order(monkeypatch, tmp_path):
    # screened at 60 ms (1.67x), confirmed at 80 ms against 100 ms (1.25x): the chart draws 1.25x
    monkeypatch.setattr(
        search_mod,
        "run_trial",
        FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}, confirm={"amp=bf16 + amp_fp32_attention": 80.0}),
    )
    result = tune(Target(script=Path("t.py")), TuneOptions(out_dir=tmp_path / "o", steps=3, knobs=("amp",)))
    assert result.winner is not None
    body = build(RunRecord(sections={"tune": result.to_dict()}))[1].body
    assert "ranked by speedup per step" in body
    chart = body[body.index("<svg") :]
    assert "1.25" in chart and "1.67" not in chart and "60.0" not in chart
    drawn = re.findall(r'class="bar-label"[^>]*>([^<]+)<title>', chart)
    listed = re.findall(r'<tr><td class="">([^<]+)</td>', body)
    assert drawn == listed[: len(drawn)] and drawn[0] == "amp=bf16 + amp_fp32_attention"


def test_screened_candidate_carries_its_startup_into_the_record(monkeypatch, tmp_path):
    class WithStartup(FakeRunner):
        def __call__(self, target, settings, out_dir, **kw):
            result: TrialResult = super().__call__(target, settings, out_dir, **kw)
            result.startup_ms = 30_000.0 if settings.compile is not None else 1_000.0
            result.compile = {"compile_ms": 28_000.0} if settings.compile is not None else {}
            return result

    monkeypatch.setattr(search_mod, "run_trial", WithStartup({"compile(model, backend=aot_eager)": 50.0}))
    result = tune(
        Target(script=Path("t.py"), args=["--steps", "900"]),
        TuneOptions(out_dir=tmp_path / "o", steps=3, knobs=("compile",), compile_backend="aot_eager"),
    )
    trial = next(t for t in result.trials if t.label.startswith("compile(model"))
    assert trial.payback["one_time_s"] == pytest.approx(29.0) and trial.payback["run_steps"] == 900
    assert result.to_dict()["run_source"] == "--steps 900"
    if result.winner is trial:
        assert "end to end over this run's 900 steps (--steps 900)" in result.headline()


# -- a transformers model in training: no key/value cache under compile ------------------------------


def tiny_llama(use_cache: bool | None = None):
    transformers = pytest.importorskip("transformers")
    extra = {} if use_cache is None else {"use_cache": use_cache}
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        **extra,
    )
    return transformers.LlamaForCausalLM(config)


def test_the_compile_candidate_turns_the_training_cache_off_and_puts_it_back():
    from torchscalpel.tune.knobs import ApplyLog
    from torchscalpel.tune.knobs.compile import builds_cache_in_training, no_cache_in_training

    model = tiny_llama()  # use_cache defaults to True: a training forward builds a DynamicCache
    model.train()
    assert builds_cache_in_training(model)
    log = ApplyLog()
    undo = no_cache_in_training(model, log)
    assert model.config.use_cache is False and any("use_cache=False" in d for d in log.to_dict()["applied"])
    undo()
    assert model.config.use_cache is True
    assert not builds_cache_in_training(model.eval())
    assert not builds_cache_in_training(tiny_llama(use_cache=False).train())


def test_compile_candidates_and_code_carry_use_cache_off_only_for_such_a_model():
    from torchscalpel.tune.facts import ModelFacts
    from torchscalpel.tune.knobs.compile import CompileKnob

    facts = ModelFacts(models=["LlamaForCausalLM"], cache_in_training=True)
    knob = CompileKnob()
    settings, _ = knob.candidates(facts)
    assert settings and all(s.compile is not None and s.compile.use_cache is False for s in settings)
    assert "model.config.use_cache = False" in "\n".join(knob.code_lines(settings[0]))
    plain, _ = knob.candidates(ModelFacts(models=["Net"]))
    assert all(s.compile is not None and s.compile.use_cache is None for s in plain)
    assert "use_cache" not in "\n".join(knob.code_lines(plain[0]))


def test_fix_inserts_use_cache_off_beside_the_compile_it_goes_with():
    pytest.importorskip("libcst")
    from torchscalpel.fix.code import cache_off_statement
    from torchscalpel.fix.cst import Edit
    from torchscalpel.fix.edits import apply_edit

    src = (
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n"
        "net = LlamaForCausalLM(LlamaConfig())\nnet.train()\n"
    )
    edit = Edit(
        kind="after_statement",
        line=3,
        code="{var}.compile()\n" + cache_off_statement("{var}"),
        marker="{var}.compile(",
    )
    new, out = apply_edit(src, edit)
    assert out.status == "applied"
    assert "net = LlamaForCausalLM(LlamaConfig())\nnet.compile()\nnet.config.use_cache = False" in new
    assert apply_edit(new, edit)[1].status == "already"
