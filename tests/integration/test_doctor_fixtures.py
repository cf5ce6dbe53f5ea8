"""Every doctor rule fires on its positive fixture and nothing above info fires on the clean ones.

The fixtures run in-process through torchscalpel.doctor.api.diagnose (the same path as the CLI,
without paying a Python + torch start-up per script).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from torchscalpel.doctor.api import diagnose
from torchscalpel.doctor.finding import Severity
from torchscalpel.netutil import free_port
from torchscalpel.runtime.target import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# fixture -> (warning/error rules that must fire, further rules allowed to fire as well)
POSITIVE: dict[str, tuple[set[str], set[str]]] = {
    "module_in_plain_container.py": ({"module-in-plain-container"}, set()),
    "tensor_attribute_not_registered.py": ({"tensor-attribute-not-registered"}, set()),
    "module_created_in_forward.py": ({"module-created-in-forward"}, set()),
    "param_not_in_optimizer.py": ({"param-not-in-optimizer"}, set()),
    "frozen_param_in_optimizer.py": ({"frozen-param-in-optimizer"}, set()),
    "grad_not_zeroed.py": ({"grad-not-zeroed"}, {"loss-diverging", "grad-norm-explosion"}),
    "loss_graph_retained.py": ({"loss-graph-retained"}, set()),
    "loss_graph_retained_outputs.py": ({"loss-graph-retained"}, set()),
    "eval_in_train_mode.py": ({"eval-in-train-mode"}, set()),
    "eval_without_no_grad.py": ({"eval-without-no-grad"}, set()),
    "train_loader_not_shuffled.py": ({"train-loader-not-shuffled"}, set()),
    "nan_loss.py": ({"nan-loss"}, {"grad-norm-explosion"}),
    "loss_diverging.py": ({"loss-diverging"}, {"grad-norm-explosion"}),
    "grad_norm_explosion.py": ({"grad-norm-explosion"}, {"loss-diverging"}),
    "vanishing_gradients.py": ({"vanishing-gradients"}, set()),
    "clip_before_unscale.py": ({"clip-before-unscale"}, set()),
    "clip_before_unscale_cuda_scaler.py": ({"clip-before-unscale"}, set()),
    "scaler_skipped_steps.py": ({"scaler-skipped-steps"}, set()),
    "dataloader_bound.py": ({"dataloader-bound"}, set()),
    "empty_cache_in_loop.py": ({"empty-cache-in-loop"}, set()),
    "cudnn_benchmark_dynamic_shapes.py": ({"cudnn-benchmark-dynamic-shapes"}, set()),
    "compile_graph_breaks.py": ({"compile-graph-breaks", "compile-recompiles"}, set()),
    "ddp_no_distributed_sampler.py": ({"ddp-no-distributed-sampler"}, set()),
    "sampler_set_epoch_missing.py": ({"sampler-set-epoch-missing"}, set()),
    "ddp_find_unused_parameters.py": ({"ddp-find-unused-parameters"}, set()),
    "rank_conditional_step.py": ({"rank-conditional-step"}, set()),
    "dataparallel_used.py": ({"dataparallel-used"}, set()),
    "optimizer_before_fsdp.py": ({"optimizer-before-fsdp"}, set()),
    "unsafe_torch_load.py": ({"unsafe-torch-load"}, set()),
    "whole_model_save.py": ({"whole-model-save"}, set()),
    "state_dict_prefix_mismatch.py": ({"state-dict-prefix-mismatch"}, set()),
}
CLEAN = sorted(p.name for p in FIXTURES.glob("clean_*.py"))
# gpu_host_device_copy.py (host-device-copy-bound) needs CUDA: scripts/gpu_check.d/doctor.sh runs it.


def loud(findings) -> set[str]:
    return {f.rule for f in findings if f.severity >= Severity.WARNING}


def run(path: Path, args=(), **kw):
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
        for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
            mp.setenv(name, value)
        yield


def test_no_rule_reports_an_internal_error_on_any_fixture_or_example() -> None:
    for path in [*sorted(FIXTURES.glob("clean_*.py")), FIXTURES / "clip_before_unscale_cuda_scaler.py"]:
        _, findings = run(path)
        assert not [f.message for f in findings if "internal error" in f.message], path.name


def test_every_rule_has_a_positive_fixture() -> None:
    from torchscalpel.doctor.registry import RULES

    covered = set().union(*(must for must, _ in POSITIVE.values())) | {
        "cannot-overfit-batch", "unseeded-run", "host-device-copy-bound", "ddp-batchnorm-not-synced"}
    assert covered == set(RULES)
    assert all((FIXTURES / name).exists() for name in POSITIVE)


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


@pytest.mark.parametrize("name", CLEAN)
def test_clean_fixture_has_no_warning_or_error(name: str) -> None:
    record, findings = run(FIXTURES / name)
    assert record.status in {"complete", "stopped"}, record.error
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
@pytest.mark.parametrize(("script", "args"), [
    ("digits_cnn.py", ["--epochs", "1"]),
    ("char_transformer.py", ["--steps", "40", "--corpus-chars", "200000", "--dim", "64", "--layers", "2"]),
])
def test_examples_are_clean(script: str, args: list[str]) -> None:
    record, findings = run(EXAMPLES / script, args)
    assert record.status in {"complete", "stopped"}, record.error
    assert loud(findings) == set(), [f.message for f in findings]
