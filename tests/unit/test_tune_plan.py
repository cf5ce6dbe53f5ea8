"""Profile-guided candidates: synthetic baseline records of each bottleneck class decide the order
of the trials and the reason each row gives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from torchscalpel.tune.bottleneck import Bottleneck, classify, profile_measures, step_shares
from torchscalpel.tune.facts import ModelFacts, bf16_support
from torchscalpel.tune.knobs import all_knobs
from torchscalpel.tune.knobs.dataloader import worker_sweep
from torchscalpel.tune.plan import plan_candidates


def step(
    total: float,
    data: float = 0.0,
    forward: float = 0.0,
    backward: float = 0.0,
    optimizer: float = 0.0,
    warmup: bool = False,
    profiled: bool = False,
) -> SimpleNamespace:
    return SimpleNamespace(
        total_ms=total,
        data_ms=data,
        forward_ms=forward,
        backward_ms=backward,
        optimizer_ms=optimizer,
        other_ms=total - data - forward - backward - optimizer,
        warmup=warmup,
        profiled=profiled,
    )


COMPUTE_STEPS = [step(100, data=1, forward=40, backward=50, optimizer=5) for _ in range(5)]


def facts_for(bottleneck: Bottleneck, **kw) -> ModelFacts:
    base = {
        "device": "cpu",
        "bf16_supported": True,
        "models": ["Net"],
        "loaders": 1,
        "cpu_count": 4,
        "torch_threads": 1,
        "optimizers": ["AdamW"],
        "repeated": [{"cls": "Block", "count": 4, "params": 10}],
        "submodules": [],
        "bottleneck": bottleneck.to_dict(),
    }
    base.update(kw)
    return ModelFacts.from_dict(base)


def plan(facts: ModelFacts, knobs=None):
    knobs = [k for k in all_knobs(compile_backend="aot_eager") if knobs is None or k.name in knobs]
    return plan_candidates(knobs, facts)


def test_step_shares_skip_warmup_and_profiled_steps():
    steps = [step(1000, data=900, warmup=True), step(500, data=400, profiled=True), *COMPUTE_STEPS]
    shares = step_shares(steps)
    assert shares["data"] == pytest.approx(0.01) and shares["step_ms"] == 100
    assert shares["backward"] == pytest.approx(0.5)


def test_profile_measures_from_a_trace_summary():
    rank = {
        "steps": [
            {
                "dur_us": 1000.0,
                "cpu_busy_us": 600.0,
                "cpu_categories": {"matmul": 300.0, "elementwise": 200.0, "autograd": 50.0},
            },
            {
                "dur_us": 1000.0,
                "cpu_busy_us": 600.0,
                "cpu_categories": {"matmul": 300.0, "elementwise": 200.0},
            },
        ]
    }
    m = profile_measures(rank)
    assert m["host_gap"] == pytest.approx(0.4)
    assert m["compute_ops"] == pytest.approx(0.6)  # autograd bookkeeping is not op time
    assert m["gemm_ops"] == pytest.approx(0.6)  # matmuls alone (no conv, no attention here)
    assert "gpu_idle" not in m


def test_data_bound_sweeps_workers_first_with_the_reason():
    b = classify(
        device="cpu",
        shares={"data": 0.45, "forward": 0.2, "backward": 0.3, "optimizer": 0.05},
        measures={"host_gap": 0.05, "compute_ops": 0.3},
    )
    assert b.kind == "data" and "DataLoader wait 45% of the step" in b.evidence["data"]
    planned, _ = plan(facts_for(b))
    first = [c for c in planned if c.indicated]
    assert {c.knob.name for c in first} == {"dataloader"}
    assert [c.settings.dataloader.num_workers for c in first] == [1, 2, 4]
    assert all(
        c.settings.dataloader.persistent_workers and c.settings.dataloader.prefetch_factor == 4 for c in first
    )
    assert planned[0].reason.startswith("data-bound (DataLoader wait 45% of the step): DataLoader workers")
    assert planned[0].short == "data-bound: load batches ahead"  # the terminal table's form
    rest = [c for c in planned if not c.indicated]
    assert rest and all("not indicated by the profile (data-bound)" in c.reason for c in rest)
    assert all(c.short == "not indicated (data-bound)" for c in rest)


def test_worker_sweep_covers_zero_to_the_usable_cores_without_the_scripts_own():
    assert worker_sweep(2, 0) == [1, 2]
    assert worker_sweep(16, 2) == [0, 1, 4, 8, 16]
    assert worker_sweep(6, 0) == [1, 2, 4, 6]


def test_optimizer_bound_tries_fused_first():
    b = classify(device="cpu", shares={"data": 0.0, "optimizer": 0.5}, measures={"host_gap": 0.1})
    assert b.kind == "optimizer"
    planned, _ = plan(facts_for(b))
    assert planned[0].knob.name == "optimizer" and planned[0].settings.optimizer == "fused"
    assert "optimizer.step 50% of the step" in planned[0].reason


def test_cpu_host_overhead_is_the_launch_analogue_compile_default_first():
    b = classify(
        device="cpu", shares={"data": 0.0, "optimizer": 0.05}, measures={"host_gap": 0.5, "compute_ops": 0.2}
    )
    assert b.kind == "launch" and "outside ATen ops" in b.evidence["launch"]
    planned, _ = plan(facts_for(b))
    assert planned[0].knob.name == "compile"
    assert planned[0].settings.compile.mode == "default"  # reduce-overhead has no CUDA graphs on a CPU
    assert "CPU analogue of CUDA graphs" in planned[0].reason
    assert not any(c.settings.compile and c.settings.compile.mode == "reduce-overhead" for c in planned)


def test_cuda_launch_bound_tries_cuda_graphs_on_the_hot_region_and_whole_model_first():
    b = classify(
        device="cuda",
        shares={"data": 0.01, "optimizer": 0.1},
        measures={"gpu_idle": 0.7, "short_kernels": 0.8, "host_over_gpu": 2.0},
    )
    assert b.kind == "launch"
    assert (
        b.evidence["launch"] == "GPU idle 70% of the step, 80% of kernels < 10 µs, host op time >= GPU time"
    )
    facts = facts_for(b, device="cuda", bf16_supported=True)
    planned, _ = plan(facts)
    labels = [c.settings.label() for c in planned[:4]]
    assert labels[:2] == ["compile(Block, reduce-overhead)", "compile(model, reduce-overhead)"]
    assert "CUDA graphs" in planned[0].reason and planned[0].reason.startswith("launch-bound (GPU idle 70%")
    assert planned[0].short == "launch-bound: CUDA graphs"
    assert "compile(Block)" in labels  # the default mode follows
    assert planned[len([c for c in planned if c.knob.name == "compile"])].knob.name == "optimizer"


def test_cuda_graphs_not_offered_when_shapes_vary():
    b = classify(device="cuda", shares={}, measures={"gpu_idle": 0.7})
    planned, _ = plan(facts_for(b, device="cuda", input_shapes_vary=True))
    assert not any(c.settings.compile and c.settings.compile.mode == "reduce-overhead" for c in planned)


def test_cuda_compute_bound_tries_amp_tf32_then_compile_with_max_autotune():
    b = classify(device="cuda", shares={"data": 0.0, "optimizer": 0.05}, measures={"gpu_idle": 0.05})
    assert b.kind == "compute" and "GPU busy 95%" in b.evidence["compute"]
    planned, _ = plan(facts_for(b, device="cuda"))
    names = [c.knob.name for c in planned if c.indicated]
    assert names[:2] == ["amp", "matmul"] and "compile" in names
    assert planned[0].reason.startswith("compute-bound (GPU busy 95% of the step): bf16 autocast")
    modes = [c.settings.compile.mode for c in planned if c.settings.compile]
    assert "max-autotune" in modes


def test_cpu_compute_bound_tries_bf16_first():
    b = classify(device="cpu", shares={"data": 0.0}, measures={"host_gap": 0.1, "compute_ops": 0.7})
    assert b.kind == "compute"
    planned, _ = plan(facts_for(b))
    assert planned[0].knob.name == "amp" and "matmul/conv/attention 70% of op time" in planned[0].reason


def test_several_classes_strongest_first():
    b = classify(device="cpu", shares={"data": 0.2, "optimizer": 0.0}, measures={"host_gap": 0.9})
    assert b.order() == ["launch", "data"]  # 0.9/0.25 beats 0.2/0.10
    planned, _ = plan(facts_for(b))
    indicated = [c.knob.name for c in planned if c.indicated]
    assert indicated[0] == "compile" and "dataloader" in indicated


def test_memory_bound_uses_knobs_that_declare_it():
    b = classify(device="cuda", shares={}, measures={"gpu_idle": 0.1}, memory_fraction=0.95)
    assert b.kind == "memory" and "95% of the GPU's memory" in b.evidence["memory"]

    class Shrink(all_knobs()[0].__class__):  # a knob registered later names the class it addresses
        name = "shrink"
        addresses = ("memory",)

    knobs = [*all_knobs(), Shrink()]
    planned, _ = plan_candidates(knobs, facts_for(b, device="cuda"))
    names = [c.knob.name for c in planned]
    assert names[0] == "amp"  # in the memory row of the table (bf16 activations are half the size)
    shrink = next(c for c in planned if c.knob.name == "shrink")
    assert shrink.indicated and shrink.reason.startswith("memory-bound (peak 95% of the GPU's memory)")
    assert names.index("shrink") < min(i for i, c in enumerate(planned) if not c.indicated)


def test_no_profile_keeps_registry_order_and_says_why():
    b = classify(device="cpu", shares={"data": 0.0}, measures={})
    assert b.kind == "unknown"
    planned, skipped = plan(facts_for(b))
    registry = [k.name for k in all_knobs()]
    order = [c.knob.name for c in planned]
    assert order == sorted(order, key=registry.index)
    assert all("registry order" in c.reason for c in planned)
    assert any(s.family == "channels_last" and "no Conv2d" in s.cause for s in skipped)


def test_bottleneck_round_trips_and_summarises():
    b = classify(device="cpu", shares={"data": 0.3}, measures={"host_gap": 0.3})
    again = Bottleneck.from_dict(b.to_dict())
    assert again == b
    assert again.summary().startswith("data-bound (DataLoader wait 30% of the step); also launch-bound")


def test_cpu_bf16_native_only_with_the_flags():
    assert bf16_support("cpu", {"avx512f", "amx_bf16"}) == (True, "amx_bf16")
    assert bf16_support("cpu", {"avx512f", "avx512_bf16"}) == (True, "avx512_bf16")
    fast, detail = bf16_support("cpu", {"avx512f", "avx512bw"})
    assert not fast and detail in ("emulated", "absent")


def test_a_torch_layer_block_is_not_a_compile_region_and_loss_inputs_do_not_vary_shapes():
    from torchscalpel.tune.knobs.compile import CompileKnob

    facts = ModelFacts(
        device="cpu",
        models=["DigitsCNN"],
        repeated=[{"cls": "Conv2d", "count": 2, "params": 9}],
        submodules=[{"name": "features", "cls": "Sequential", "params": 9, "forward_ms": 9.0}],
    )
    knob = CompileKnob(backend="aot_eager")
    cands, _ = knob.candidates(facts)
    assert [c.compile.target for c in cands] == ["model"]
    ((label, why),) = knob.skipped_candidates(facts)
    assert label == "compile(Conv2d)" and "single torch.nn.Conv2d layer" in why


def test_facts_compare_input_shapes_per_model_not_with_the_loss_module():
    import torch
    from torch import nn

    from torchscalpel.tune.facts import FactsObserver

    obs = FactsObserver()
    model, loss = nn.Linear(4, 3), nn.CrossEntropyLoss()
    for _ in range(2):
        obs.on_forward_pre(model, (torch.randn(8, 4),), {}, True)
        obs.on_forward_pre(loss, (torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), {}, True)
    assert obs._shapes_vary is False
    obs.on_forward_pre(model, (torch.randn(5, 4),), {}, True)
    assert obs._shapes_vary is True


def _modes(planned) -> list[str]:
    return [c.settings.label() for c in planned if c.settings.compile]


def _gemm_bound(gemm: float, conv: float = 0.0) -> Bottleneck:
    """A CPU baseline whose profile (a synthetic trace summary) holds ``gemm`` matmul and ``conv`` conv
    shares of op time, the rest elementwise."""
    rank = {
        "steps": [
            {
                "dur_us": 1000.0,
                "cpu_busy_us": 900.0,
                "cpu_categories": {
                    "matmul": 1000.0 * gemm,
                    "conv": 1000.0 * conv,
                    "elementwise": 1000.0 * (1 - gemm - conv),
                },
            }
        ]
    }
    return classify(device="cpu", shares={"data": 0.0, "optimizer": 0.05}, measures=profile_measures(rank))


def test_a_gemm_bound_cpu_step_with_amx_tries_max_autotune_after_the_default_mode():
    b = _gemm_bound(0.6)
    assert b.kind == "compute"
    planned, _ = plan(facts_for(b, cpu_isa="amx"))
    labels = _modes(planned)
    assert labels == ["compile(Block)", "compile(model)", "compile(Block, max-autotune-no-cudagraphs)"]
    autotune = next(c for c in planned if c.settings.compile and c.settings.compile.mode != "default")
    assert autotune.indicated and autotune.short == "compute-bound: autotuned GEMMs"
    assert "C++ GEMM templates (AMX micro-kernels) against oneDNN" in autotune.reason
    assert "matmuls 60% of op time" in autotune.reason and "pays-back" in autotune.reason
    assert planned[0].knob.name == "amp"  # bf16 first: the mode is a compile candidate, not a new family


@pytest.mark.parametrize(
    ("gemm", "conv", "isa", "why"),
    [
        (0.6, 0.0, "avx2", "no AVX-512 or AMX micro-kernels"),
        (0.6, 0.0, "", "ISA not known"),
        (0.2, 0.5, "amx", "compute-bound by convolutions, not GEMMs"),
    ],
)
def test_no_cpu_max_autotune_without_gemms_or_the_isa(gemm: float, conv: float, isa: str, why: str):
    b = _gemm_bound(gemm, conv)
    assert b.kind == "compute", why
    planned, _ = plan(facts_for(b, cpu_isa=isa))
    assert all("max-autotune" not in label for label in _modes(planned)), why


def test_a_launch_bound_cpu_step_gets_no_cuda_graphs_and_no_autotune_even_with_amx():
    b = classify(device="cpu", shares={}, measures={"host_gap": 0.6, "compute_ops": 0.2, "gemm_ops": 0.2})
    planned, _ = plan(facts_for(b, cpu_isa="amx"))
    assert _modes(planned) == ["compile(Block)", "compile(model)"]


def test_cuda_compute_bound_autotunes_after_the_default_and_launch_bound_graphs_before():
    compute = classify(device="cuda", shares={}, measures={"gpu_idle": 0.05})
    labels = _modes(plan(facts_for(compute, device="cuda"))[0])
    assert labels == ["compile(Block)", "compile(model)", "compile(Block, max-autotune)"]
    launch = classify(device="cuda", shares={}, measures={"gpu_idle": 0.6})
    labels = _modes(plan(facts_for(launch, device="cuda"))[0])
    assert labels[:3] == [
        "compile(Block, reduce-overhead)",
        "compile(model, reduce-overhead)",
        "compile(Block)",
    ]


def test_gemm_isa_reads_the_flags_and_trusts_torchs_narrower_view():
    from torchscalpel.tune.facts import gemm_isa

    amx = {"avx2", "avx512f", "amx_tile", "amx_bf16"}
    assert gemm_isa(amx) == "amx" and gemm_isa(amx, "AVX512") == "amx"
    assert gemm_isa({"avx2", "avx512f"}) == "avx512"
    assert gemm_isa(amx, "AVX2") == "avx2"  # a hypervisor lists AMX that torch does not use
    assert gemm_isa({"avx2", "fma"}) == "avx2" and gemm_isa({"asimd"}) == "" and gemm_isa(set()) == ""


def test_the_tune_section_checks_cpu_isa_as_text():
    from torchscalpel.sections import check_section

    assert check_section("tune", {"facts": {"cpu_isa": "amx"}}) is None
    problem = check_section("tune", {"facts": {"cpu_isa": 5}})
    assert problem and "cpu_isa" in problem
