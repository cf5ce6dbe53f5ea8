"""Every doctor rule fires on its positive fixture and nothing above info fires on the clean ones.

The fixtures run in-process through torchscalpel.doctor.api.diagnose (the same path as the CLI,
without paying a Python + torch start-up per script).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from cpu_load import competing_load
from torchscalpel.doctor.api import diagnose
from torchscalpel.findings import Severity
from torchscalpel.netutil import free_port
from torchscalpel.runtime.target import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# fixture -> (warning/error rules that must fire, further rules allowed to fire as well)
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
# fixture -> (warning/error rules that must fire, further rules allowed to fire as well)
POSITIVE: dict[str, tuple[set[str], set[str]]] = {
    name: (set(e["must"]), set(e["allowed"])) for name, e in EXPECTED["positive"].items()
}
INFO_POSITIVE: dict[str, set[str]] = {name: set(rules) for name, rules in EXPECTED["info"].items()}
CLEAN = sorted(p.name for p in FIXTURES.glob("clean_*.py"))
# gpu_host_device_copy.py (host-device-copy-bound) needs CUDA: scripts/gpu_check.d/doctor.sh runs it.


def loud(findings) -> set[str]:
    return {f.rule for f in findings if f.severity >= Severity.WARNING}


_RUNS: dict[tuple, tuple] = {}
"""Each (fixture, arguments, options) is diagnosed once per module: several tests read the same run."""


def run(path: Path, args=(), **kw):
    """The fixture's doctor run, once per module (several tests read the same one)."""
    key = (path, tuple(args), tuple(sorted(kw.items())))
    if key not in _RUNS:
        _RUNS[key] = diagnose_fresh(path, args, **kw)
    return _RUNS[key]


def diagnose_fresh(path: Path, args=(), **kw):
    # the default window, as users get it; DDP/FSDP fixtures get the variables a 1-rank launcher sets
    # (doctor itself never sets them: it runs the script as 'python SCRIPT' would)
    with _launcher_env(path):
        return diagnose(Target(script=path, args=list(args)), **kw)


@contextlib.contextmanager
def _launcher_env(path: Path):
    if "init_process_group" not in path.read_text():
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }.items():
            mp.setenv(name, value)
        yield


def test_no_rule_reports_an_internal_error_on_any_fixture_or_example() -> None:
    for path in [*sorted(FIXTURES.glob("clean_*.py")), FIXTURES / "clip_before_unscale_cuda_scaler.py"]:
        _, findings = run(path)
        assert not [f.message for f in findings if "internal error" in f.message], path.name


def test_every_rule_has_a_positive_fixture() -> None:
    from torchscalpel.doctor.registry import RULES

    covered = set().union(*(must for must, _ in POSITIVE.values()), *INFO_POSITIVE.values()) | {
        "cannot-overfit-batch",
        "host-device-copy-bound",
        "ddp-batchnorm-not-synced",
        # a static rule whose fixtures (DDP on CPU refuses device_ids) live in tests/distributed/test_rank_rules.py
        "ddp-device-ids-not-local-rank",
        # static FSDP1 rules: FSDP1 needs a GPU process group to run; their tutorial-shaped fixtures and clean
        # twins are in tests/unit/test_doctor_fsdp_static.py
        "clip-grad-on-fsdp-wrapper",
        "fsdp-fp16-plain-grad-scaler",
        "fsdp-low-precision-master-weights",
        "fsdp-cpu-offload",
    }
    assert covered == set(RULES)
    assert all((FIXTURES / name).exists() for name in [*POSITIVE, *INFO_POSITIVE])


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_positive_fixture_fires_its_rule(name: str) -> None:
    must, allowed = POSITIVE[name]
    record, findings = run(FIXTURES / name)
    fired = loud(findings)
    assert must <= fired, f"{name}: expected {must}, got {fired} (status {record.status}: {record.error})"
    assert fired <= must | allowed, f"{name}: unexpected {fired - must - allowed}"
    for f in findings:
        if f.rule in must:
            assert f.message and f.fix and f.evidence
    assert record.findings and {d["rule"] for d in record.findings} >= must


def test_ddp_batchnorm_on_cpu_is_reported_as_info_with_the_cpu_fix() -> None:
    # SyncBatchNorm has no CPU kernel: the fact is reported, but it is not a mistake on CPU.
    # (On CUDA the same rule is a warning: tests/unit/test_doctor_observers.py.)
    _record, findings = run(FIXTURES / "ddp_batchnorm_not_synced.py")
    (f,) = [f for f in findings if f.rule == "ddp-batchnorm-not-synced"]
    assert f.severity == Severity.INFO and "cannot run" in f.message and "GroupNorm" in f.fix
    assert "1 (BatchNorm1d)" in f.evidence[0]
    assert "ddp-batchnorm-not-synced" not in loud(findings)


# Clean fixtures that still raise a warning (strict xfail: fixing the rule makes the test fail until the entry goes).
KNOWN_FALSE_ALARMS: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_FALSE_ALARMS[n], strict=True))
        if n in KNOWN_FALSE_ALARMS
        else n
        for n in CLEAN
    ],
)
def test_clean_fixture_has_no_warning_or_error(name: str) -> None:
    record, findings = run(FIXTURES / name)
    assert record.status in {"complete", "stopped"}, record.error
    assert loud(findings) == set(), [f.message for f in findings]


@pytest.mark.parametrize("name", sorted(INFO_POSITIVE))
def test_info_fixture_reports_its_rules_and_nothing_louder(name: str) -> None:
    _, findings = run(FIXTURES / name)
    assert INFO_POSITIVE[name] <= {f.rule for f in findings}, [f.rule for f in findings]
    assert loud(findings) == set(), [f.message for f in findings]


def test_nan_loss_names_the_op_and_line_from_the_rerun() -> None:
    _, findings = run(FIXTURES / "nan_loss.py")
    (nan,) = [f for f in findings if f.rule == "nan-loss"]
    assert "log" in nan.message and nan.location is not None
    assert nan.location.file.endswith("nan_loss.py") and nan.location.line == 13


def test_unseeded_run_is_info_only_and_seeded_scripts_are_quiet() -> None:
    _, findings = run(FIXTURES / "unseeded_run.py")
    assert [(f.rule, f.severity) for f in findings] == [("unseeded-run", Severity.INFO)]


def test_crashing_script_keeps_the_findings_gathered_before_the_crash() -> None:
    record, findings = run(FIXTURES / "state_dict_prefix_mismatch.py")
    assert record.status == "failed" and record.exit_code == 1
    (f,) = [f for f in findings if f.rule == "state-dict-prefix-mismatch"]
    assert "_orig_mod." in f.message and "removeprefix" in f.fix


def test_sanity_flags_a_model_that_cannot_overfit_and_passes_a_healthy_one() -> None:
    _, bad = run(FIXTURES / "cannot_overfit_batch.py", sanity=True)
    assert "cannot-overfit-batch" in loud(bad)
    _, good = run(FIXTURES / "clean_grad_accum.py", sanity=True)
    assert "cannot-overfit-batch" not in loud(good)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("digits_cnn.py", ["--epochs", "1"]),
        (
            "char_transformer.py",
            ["--steps", "40", "--corpus-chars", "200000", "--dim", "64", "--layers", "2"],
        ),
    ],
)
def test_examples_are_clean(script: str, args: list[str]) -> None:
    record, findings = run(EXAMPLES / script, args)
    assert record.status in {"complete", "stopped"}, record.error
    assert loud(findings) == set(), [f.message for f in findings]


def test_constant_loss_is_an_error_that_names_the_single_logit_cross_entropy() -> None:
    _, findings = run(FIXTURES / "constant_loss_one_logit.py")
    (f,) = [f for f in findings if f.rule == "loss-constant"]
    assert f.severity == Severity.ERROR and "cannot vary" in f.message and "single class" in f.message
    assert "[32, 1]" in f.message and "BCEWithLogitsLoss" in f.fix
    assert f.location is not None and f.location.file.endswith("constant_loss_one_logit.py")
    # zero gradients and unchanged parameters are its consequences, not separate findings
    assert not {"vanishing-gradients", "cannot-overfit-batch"} & {g.rule for g in findings}


def test_blow_up_at_step_1_then_crash_is_loss_diverging_from_the_first_loss() -> None:
    record, findings = run(FIXTURES / "loss_blowup_then_crash.py")
    assert record.status == "failed" and "diverged" in record.error
    (f,) = [f for f in findings if f.rule == "loss-diverging"]
    assert "blew up" in f.message and "crashed" in f.message and "step 1" in f.message
    assert f.message.startswith(
        "The loss blew up: 9."
    )  # the baseline is the first loss, not the blown-up one
    assert any("training diverged" in e for e in f.evidence)


def test_adamw_at_lr_20_is_loss_diverging_and_not_vanishing_gradients() -> None:
    _, findings = run(FIXTURES / "loss_diverging_adamw_lr20.py")
    rules = {f.rule for f in findings}
    assert "loss-diverging" in rules and "vanishing-gradients" not in rules
    (f,) = [f for f in findings if f.rule == "loss-diverging"]
    assert "learning rate" in f.fix


def test_unsafe_load_fix_fits_what_the_file_held() -> None:
    _, numpy_findings = run(FIXTURES / "unsafe_torch_load_numpy.py")
    (f,) = [f for f in numpy_findings if f.rule == "unsafe-torch-load"]
    assert "numpy" in f.message and "np.save" in f.fix and "np.load" in f.fix and "safe_globals" in f.fix
    assert any("numpy.ndarray" in e for e in f.evidence)
    _, tensor_findings = run(FIXTURES / "unsafe_torch_load.py")
    (g,) = [g for g in tensor_findings if g.rule == "unsafe-torch-load"]
    assert "weights_only=True loads it as is" in g.message and "np.save" not in g.fix


def test_pickle_the_repository_writes_itself_is_info_with_a_json_fix() -> None:
    from torchscalpel.doctor.api import check_static

    (f,) = [f for f in check_static([FIXTURES / "clean_pickle_vocab.py"]) if f.rule == "unsafe-torch-load"]
    assert f.severity == Severity.INFO and "prep_vocab.py" in f.message and "json" in f.fix
    (g,) = [
        g
        for g in _static_text("import pickle\nmeta = pickle.load(open('downloaded.pkl', 'rb'))\n")
        if g.rule == "unsafe-torch-load"
    ]
    assert g.severity == Severity.WARNING and "json" in g.fix and "safetensors" not in g.fix


def test_pickle_written_by_a_prepare_script_two_folders_down_is_info(tmp_path: Path) -> None:
    """nanoGPT: train.py reads data/<name>/meta.pkl, which data/<name>/prepare.py pickles."""
    from torchscalpel.doctor.api import check_static

    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "prepare.py").write_text(
        "import os, pickle\nmeta = {'vocab_size': 65}\n"
        "with open(os.path.join(os.path.dirname(__file__), 'meta.pkl'), 'wb') as f:\n    pickle.dump(meta, f)\n"
    )
    (tmp_path / "train.py").write_text(
        "import os, pickle\nmeta_path = os.path.join('data', 'shakespeare_char', 'meta.pkl')\n"
        "with open(meta_path, 'rb') as f:\n    meta = pickle.load(f)\n"
    )
    (f,) = check_static([tmp_path / "train.py"])
    assert f.rule == "unsafe-torch-load" and f.severity == Severity.INFO and "prepare.py:4" in f.message
    (tmp_path / "other.py").write_text("import pickle\nstate = pickle.load(open('weights.pkl', 'rb'))\n")
    (g,) = check_static([tmp_path / "other.py"])  # a name nothing here writes: still a warning
    assert g.severity == Severity.WARNING


def _static_text(source: str):
    from torchscalpel.doctor.static_scan import analyze_source

    return analyze_source(source, "/nonexistent-dir/train.py")


def test_static_unseeded_run_skips_library_modules_and_sees_manual_sgd() -> None:
    from torchscalpel.doctor.api import check_static

    lib = check_static([FIXTURES / "train_engine.py"])
    assert "unseeded-run" not in {f.rule for f in lib}
    manual = {f.rule for f in check_static([FIXTURES / "manual_sgd_unseeded.py"])}
    assert {"unseeded-run", "manual-parameter-update"} <= manual


def test_whole_model_save_in_uncommon_styles_points_at_the_call() -> None:
    from torchscalpel.doctor.api import check_static

    (kw,) = [
        f for f in check_static([FIXTURES / "whole_model_save_kwargs.py"]) if f.rule == "whole-model-save"
    ]
    assert kw.location.line == 27 and "net.state_dict()" in kw.fix
    (helper,) = [
        f for f in check_static([FIXTURES / "whole_model_save_trainer.py"]) if f.rule == "whole-model-save"
    ]
    assert "save_checkpoint" in helper.message and helper.location.line == 38
    quiet = _static_text(
        "import copy, torch\nbest_model = copy.deepcopy(model.state_dict())\n"
        "torch.save(best_model, 'b.pt')\ntorch.save(obj=model.state_dict(), f='m.pt')\n"
    )
    assert "whole-model-save" not in {f.rule for f in quiet}
    loud_dict = _static_text("import torch\ntorch.save({'model': self.model, 'step': 3}, 'c.pt')\n")
    assert "whole-model-save" in {f.rule for f in loud_dict}


def test_a_time_cap_that_shortens_the_window_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text(
        "import time, torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.01)\nfor _ in range(50):\n"
        "    time.sleep(0.3)\n    o.zero_grad(); m(torch.ones(4, 2)).sum().backward(); o.step()\n"
    )
    record, _ = diagnose(Target(script=script), steps=40, static=False, nan_rerun=False, time_cap_s=1.0)
    window = record.sections["doctor"]["window"]
    assert record.status == "stopped" and window["capped_after"] == len(record.steps) < 42
    assert "time cap" in window["capped"] and "may be missing" in window["capped"]
    # the end-of-run wording names the cap with its figures, not "the planned steps"
    from torchscalpel.runtime.run_notes import how_it_stopped

    assert how_it_stopped(record) == f"stopped by the 1 s time cap at step {len(record.steps)} of 42"
    record, _ = diagnose(Target(script=script), steps=3, static=False, nan_rerun=False, time_cap_s=None)
    assert record.sections["doctor"]["window"]["capped"] is None and len(record.steps) == 5
    assert how_it_stopped(record) == "ended after the 5 planned steps, as asked"


def test_the_run_goes_on_past_its_window_to_see_a_save_at_the_end() -> None:
    """The k-fold fixture saves its best model after 400 steps: the default window (2+300) ends first, the
    run goes on under the cheap checks, and the runtime rule (static rules off here) sees the save."""
    from torchscalpel.runtime.run_notes import how_it_stopped

    path = FIXTURES / "whole_model_save_kfold_best.py"
    save_line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("torch.save("))
    record, findings = diagnose(Target(script=path), static=False, nan_rerun=False, time_cap_s=None)
    assert len(record.steps) == 302 and record.status == "complete"
    (save,) = [f for f in findings if f.rule == "whole-model-save"]
    assert save.location is not None and save.location.line == save_line
    tail = record.sections["doctor"]["window"]["tail"]
    assert tail["end"] == "script" and tail["cap_s"] == 30.0 and 0 < tail["ran_s"] < 30
    assert how_it_stopped(record).startswith("measured 302 step(s), then ran on past the window for ")
    assert how_it_stopped(record).endswith("to the script's own end")
    # without the tail the window's end is the run's end, and the save is never seen
    record, findings = diagnose(
        Target(script=path), static=False, nan_rerun=False, time_cap_s=None, tail_cap_s=0
    )
    assert record.status == "stopped" and record.sections["doctor"]["window"]["tail"] is None
    assert "whole-model-save" not in {f.rule for f in findings}


def test_the_tail_cap_ends_a_script_that_trains_on(tmp_path: Path) -> None:
    from torchscalpel.runtime.run_notes import how_it_stopped

    script = tmp_path / "long.py"
    script.write_text(
        "import time, torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.01)\nwhile True:\n"
        "    time.sleep(0.01)\n    o.zero_grad(); m(torch.ones(4, 2)).sum().backward(); o.step()\n"
    )
    record, _ = diagnose(
        Target(script=script), steps=3, static=False, nan_rerun=False, time_cap_s=None, tail_cap_s=0.5
    )
    assert record.status == "stopped" and len(record.steps) == 5
    tail = record.sections["doctor"]["window"]["tail"]
    assert tail["end"] == "cap" and tail["ran_s"] >= 0.5
    assert how_it_stopped(record).endswith("until the 0.5 s tail cap stopped it (--tail-cap)")


@pytest.mark.parametrize(
    ("clean", "rule"),
    [
        ("clean_kfold_best_state_dict.py", "whole-model-save"),
        ("clean_lr_warmup.py", "no-lr-warmup"),
        ("clean_lr_warmup_lightning.py", "no-lr-warmup"),
        ("clean_other_phase_light.py", "other-phase-heavy"),
    ],
)
def test_the_clean_twins_get_no_finding_of_their_rule(clean: str, rule: str) -> None:
    _, findings = run(FIXTURES / clean)
    assert rule not in {f.rule for f in findings}, [f.message for f in findings if f.rule == rule]


def test_no_lr_warmup_reads_the_lr_the_optimizer_used_and_points_at_its_line() -> None:
    path = FIXTURES / "no_lr_warmup.py"
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "torch.optim.AdamW(" in t)
    _, findings = run(path)
    (f,) = [f for f in findings if f.rule == "no-lr-warmup"]
    assert f.source == "runtime" and f.location is not None and f.location.line == line
    assert "lr 0.001 at the first optimizer step, never higher" in f.evidence[0]
    assert "TransformerEncoderLayer" in f.evidence[1] and "SequentialLR(" in f.fix


def test_no_lr_warmup_in_lightning_returns_the_scheduler_from_configure_optimizers() -> None:
    _, findings = run(FIXTURES / "no_lr_warmup_lightning.py")
    (f,) = [f for f in findings if f.rule == "no-lr-warmup"]
    assert "estimated_stepping_batches" in f.fix and '"interval": "step"' in f.fix


def test_other_phase_names_the_validation_and_logging_lines() -> None:
    path = FIXTURES / "other_phase_heavy.py"
    text = path.read_text().splitlines()
    heavy = {i for i, t in enumerate(text, 1) if "model(x_val)" in t or t.strip().startswith("stats = ")}
    _, findings = run(path)
    (f,) = [f for f in findings if f.rule == "other-phase-heavy"]
    assert f.location is not None and f.location.line in heavy
    assert f.evidence[0].startswith("other: ") and any("other_phase_heavy.py:" in e for e in f.evidence[1:])


@pytest.mark.slow
@pytest.mark.timeout(900)  # every positive fixture once more, one after another, on a CPU it shares
def test_every_planted_bug_is_found_while_the_cpu_is_loaded() -> None:
    """Rules decide on step counts and same-step shares, never on time: a busy machine finds the same bugs."""
    missed = {}
    with competing_load():
        for name, (must, _allowed) in sorted(POSITIVE.items()):
            _, findings = diagnose_fresh(FIXTURES / name)  # a run of its own: the point is the loaded CPU
            if not must <= loud(findings):
                missed[name] = must - loud(findings)
    assert missed == {}


CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "args"),
    [*((p.name, []) for p in sorted(CORPUS.glob("*.py"))), ("nanogpt_style.py", ["--compile"])],
)
def test_clean_corpus_script_has_no_warning_or_error(name: str, args: list[str]) -> None:
    """The corpus of scripts in the styles real users write (Lightning, HF Trainer, accelerate, nanoGPT, ...),
    run as 'scalpel doctor -- SCRIPT' runs them: no launcher variables (nanoGPT takes its single-process branch)."""
    record, findings = diagnose(Target(script=CORPUS / name, args=args))
    assert record.status in {"complete", "stopped"}, record.error
    assert loud(findings) == set(), [f.message for f in findings]


def test_loader_order_comes_from_the_batch_sampler_when_one_was_given() -> None:
    """accelerate's prepare() and the HF Trainer build DataLoader(batch_sampler=BatchSampler(RandomSampler))."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

    from torchscalpel.doctor.rules._common import loader_facts

    ds = TensorDataset(torch.zeros(64, 2))
    shuffled = loader_facts(DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 16, False)))
    fixed = loader_facts(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 16, False)))
    assert shuffled["random"] and not shuffled["sequential"] and shuffled["sampler"] == "RandomSampler"
    assert fixed["sequential"]


# issue 32: each pitfall at the line the user edits (fixture, rule, line)
PITFALL_LINES = [
    ("softmax_before_cross_entropy.py", "softmax-before-cross-entropy", 24),
    ("softmax_before_cross_entropy_logsoftmax.py", "softmax-before-cross-entropy", 13),
    ("loss_task_mismatch.py", "loss-task-mismatch", 18),
    ("loss_task_mismatch_mse.py", "loss-task-mismatch", 16),
    ("loss_task_mismatch_onehot_bce.py", "loss-task-mismatch", 14),
    ("accumulated_loss_not_divided.py", "accumulated-loss-not-divided", 16),
    ("accumulated_loss_not_divided_twice.py", "accumulated-loss-not-divided", 23),
    ("ddp_accumulation_without_no_sync.py", "ddp-accumulation-without-no-sync", 21),
    ("distributed_sampler_wrong_world.py", "distributed-sampler-wrong-world", 13),
    ("super_init_missing.py", "super-init-missing", 9),
    ("cudnn_disabled.py", "cudnn-disabled", 5),
    ("inplace_autograd_error.py", "script-failed", 25),
]


@pytest.mark.parametrize(("name", "rule", "line"), PITFALL_LINES)
def test_pitfall_is_found_at_the_users_line(name: str, rule: str, line: int) -> None:
    _, findings = run(FIXTURES / name)
    (f,) = [f for f in findings if f.rule == rule]
    assert f.location is not None and f.location.file.endswith(name) and f.location.line == line, f.location


def test_softmax_before_cross_entropy_names_the_softmax_and_keeps_log_softmax_a_warning() -> None:
    _, findings = run(FIXTURES / "softmax_before_cross_entropy.py")
    (f,) = [f for f in findings if f.rule == "softmax-before-cross-entropy"]
    assert f.severity == Severity.ERROR and "softmax probabilities" in f.message
    assert any("Classifier.forward" in e and "softmax_before_cross_entropy.py:13" in e for e in f.evidence)
    assert "no softmax" in f.fix
    _, findings = run(FIXTURES / "softmax_before_cross_entropy_logsoftmax.py")
    (g,) = [g for g in findings if g.rule == "softmax-before-cross-entropy"]
    assert g.severity == Severity.WARNING and any("nn.LogSoftmax layer" in e for e in g.evidence)


def test_loss_task_mismatch_says_which_mismatch() -> None:
    _, bce = run(FIXTURES / "loss_task_mismatch.py")
    (f,) = [f for f in bce if f.rule == "loss-task-mismatch"]
    assert f.severity == Severity.ERROR and "class indices" in f.message and "up to 9" in f.evidence[0]
    _, mse = run(FIXTURES / "loss_task_mismatch_mse.py")
    (g,) = [g for g in mse if g.rule == "loss-task-mismatch"]
    assert g.message.startswith("mse_loss is given class indices") and "cross_entropy" in g.fix
    _, onehot = run(FIXTURES / "loss_task_mismatch_onehot_bce.py")
    (h,) = [h for h in onehot if h.rule == "loss-task-mismatch"]
    assert "one-hot" in h.message and "argmax" in h.fix


def test_in_place_autograd_error_names_the_op_the_version_and_the_write() -> None:
    record, findings = run(FIXTURES / "inplace_autograd_error.py")
    assert record.status == "failed"
    (f,) = [f for f in findings if f.rule == "script-failed"]
    assert "[64, 16], output 0 of relu" in f.message and "version 1, saved at version 0" in f.message
    assert "backward needed it for ReluBackward0 (its saved result)" in f.evidence
    assert any("inplace_autograd_error.py:14: h += x" in e for e in f.evidence)
    assert "h = h + 1.0" in f.fix and "set_detect_anomaly" in f.fix


def test_ddp_accumulation_reports_the_bytes_all_reduced_for_nothing() -> None:
    _, findings = run(FIXTURES / "ddp_accumulation_without_no_sync.py")
    (f,) = [f for f in findings if f.rule == "ddp-accumulation-without-no-sync"]
    assert f.source == "runtime" and "4 backward calls" in f.message
    assert any("per optimizer step are all-reduced for nothing" in e for e in f.evidence)
    assert "no_sync()" in f.fix


def test_super_init_missing_replaces_the_crash_it_explains() -> None:
    record, findings = run(FIXTURES / "super_init_missing.py")
    assert record.status == "failed" and [f.rule for f in findings] == ["super-init-missing"]


def test_validation_curve_verdicts_are_written_for_the_scripts_framework() -> None:
    """The overfitting fix is early stopping in the script's own idiom: a plain loop keeps the best weights by
    hand, Lightning gets its EarlyStopping callback (the same curve, recorded through Lightning's validation)."""
    plain_record, plain = run(FIXTURES / "val_loss_overfitting.py")
    lit_record, lit = run(FIXTURES / "val_loss_overfitting_lightning.py")
    (p,) = [f for f in plain if f.rule == "val-loss-overfitting"]
    (q,) = [f for f in lit if f.rule == "val-loss-overfitting"]
    assert "best.pt" in p.fix and "EarlyStopping(monitor=" in q.fix
    assert (
        p.location is not None and p.location.line == 31
    )  # total += criterion(model(xb), yb).item() * len(yb)
    # Lightning's sanity check adds a pass before the first step; every epoch adds one after it
    lit_passes = lit_record.sections["eval"]["passes"]
    assert lit_passes[0]["step"] == 0 and [x["step"] for x in lit_passes[1:4]] == [3, 6, 9]
    assert [x["step"] for x in plain_record.sections["eval"]["passes"][:3]] == [3, 6, 9]


def test_train_in_eval_mode_points_at_the_evaluations_model_eval() -> None:
    for name in ("train_in_eval_mode.py", "train_in_eval_mode_accelerate.py"):
        _, findings = run(FIXTURES / name)
        (f,) = [f for f in findings if f.rule == "train-in-eval-mode"]
        line = (FIXTURES / name).read_text().splitlines()[f.location.line - 1]
        assert line.strip() == "model.eval()", (name, line)


def test_hf_trainer_evaluation_loss_is_recorded_and_its_schedule_judged_at_its_training_arguments() -> None:
    path = FIXTURES / "clean_hf_trainer_eval.py"
    record, findings = run(path)
    passes = record.sections["eval"]["passes"]
    assert [p["step"] for p in passes] == [5, 10, 15, 20, 25, 30]
    assert all(p["batches"] == 2 for p in passes) and passes[-1]["loss"] < passes[0]["loss"]
    # the Trainer's default schedule decays linearly from its peak lr 3e-3: no warm-up, read from the lr the
    # optimizer used; the finding points at the TrainingArguments line the fix edits, not at trainer.train()
    text = path.read_text().splitlines()
    (f,) = [f for f in findings if f.rule == "no-lr-warmup"]
    assert f.source == "runtime" and f.location is not None
    assert text[f.location.line - 1].strip().startswith("args = TrainingArguments(")
    assert "lr 0.003 at the first optimizer step" in f.evidence[0] and "warmup_ratio=" in f.fix
    assert any(e.startswith("optimizer built at") and "clean_hf_trainer_eval.py:" in e for e in f.evidence)
