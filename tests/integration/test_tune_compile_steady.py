"""Issue 39, for real: tune's compile candidate on a transformers model trained with the config's defaults
(``use_cache`` True). The baseline's facts see the cache; the candidate turns it off, compiles as one graph
with no break of ours and no recompile in the timed steps; its pays-back line's one-time cost matches the
compile time dynamo measured in the same run (within 35 %: judged by what the runs wrote, not by a timing
assertion of this test's own; 6 % apart on a quiet machine, 21 % on 2 cores shared with a distributed test run,
where the startup both runs time around the compile slows too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO

pytest.importorskip("transformers")

from torchscalpel.runtime.target import Target
from torchscalpel.tune.payback import payback_of, run_steps
from torchscalpel.tune.runner import run_trial
from torchscalpel.tune.settings import CompileSpec, TuneSettings

FIXTURES = REPO / "tests" / "fixtures" / "tune"


@pytest.mark.slow
@pytest.mark.timeout(900)  # two trials; the compile is 15-25 s warm-less on 2 busy cores
# a decoder trained as a causal LM, and an encoder fine-tuned for classification through a DataLoader with
# padded batches, dropout 0.1 and a warm-up schedule (the benchmark's second held-out library-model loop)
@pytest.mark.parametrize("script", ["llama_cache.py", "bert_classify.py"])
def test_compile_of_a_transformers_model_in_training_is_measured_at_steady_state(
    tmp_path: Path, script: str
) -> None:
    target = Target(script=FIXTURES / script, args=["--steps", "14"])
    kw = {"warmup": 3, "steps": 8, "seed": 0, "timeout_s": 600}  # the run's shared inductor cache
    base = run_trial(target, TuneSettings(), tmp_path / "base", facts=True, **kw)
    assert base.status == "ok", base.cause
    assert base.facts["cache_in_training"] is True
    spec = CompileSpec(target="model", use_cache=False)  # what the knob proposes for these facts
    cand = run_trial(target, TuneSettings(compile=spec), tmp_path / "compile", family="compile", **kw)
    assert cand.status == "ok", cand.cause
    stats = cand.compile
    # no graph break of ours (the sites recorder on nn.Module.__init__ broke it 8 times), one graph
    assert stats["graph_breaks"] == 0 and stats["fullgraph"]["ok"], stats
    assert stats["recompiles"] == 0, stats["recompile_reasons"]
    # compiles only in the warm-up steps: every measured step is steady state
    assert stats["compiled_steps"] and all(c["warmup"] for c in stats["compiled_steps"]), stats[
        "compiled_steps"
    ]
    assert cand.steady_note == "" and len(cand.step_ms) == 8
    assert any("use_cache=False" in line for line in cand.apply.get("applied", []))
    # the same losses as the script with its cache (the cache is never read in training)
    assert cand.losses == pytest.approx(base.losses, rel=2e-3)

    cand.baseline_ms = base.median_ms
    value = payback_of(cand.to_dict(), base.to_dict(), run_steps(target.args, None))
    assert value is not None and value.compile_s is not None
    assert value.one_time_s == pytest.approx(value.compile_s, rel=0.35), value.sentence()
    assert f"{value.one_time_s:.1f} s to compile" in value.sentence()
