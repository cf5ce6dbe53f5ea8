"""Each knob applied directly to tiny models and DataLoaders (no runtime, no subprocess)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from torchscalpel.tune.apply import applied, code_lines, knob_families, numerics_class
from torchscalpel.tune.facts import ModelFacts, describe_model
from torchscalpel.tune.knobs import ApplyLog, all_knobs
from torchscalpel.tune.knobs.base import RootHooks
from torchscalpel.tune.knobs.compile import (
    CompileKnob,
    compile_stats,
    matching_modules,
    region_targets,
    reset_compile_stats,
)
from torchscalpel.tune.knobs.dataloader import DataLoaderKnob
from torchscalpel.tune.settings import CompileSpec, DataLoaderSpec, TuneSettings


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def dataset() -> TensorDataset:
    return TensorDataset(torch.randn(8, 8), torch.zeros(8))


# -- data loading -------------------------------------------------------------------------------


def test_dataloader_values_forced_and_undone():
    spec = DataLoaderSpec(num_workers=2, persistent_workers=True, prefetch_factor=3)
    with applied(TuneSettings(dataloader=spec)) as log:
        loader = DataLoader(dataset(), 4, True)  # positional batch_size / shuffle still bind
        explicit = DataLoader(dataset(), batch_size=4, num_workers=0)
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 3)
    assert explicit.num_workers == 2  # the knob overrides the script's own value
    assert loader.batch_size == 4
    assert "dataloader" in log.fired
    assert DataLoader(dataset()).num_workers == 0


def test_dataloader_skips_iterable_dataset_and_worker_only_options():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with applied(TuneSettings(dataloader=DataLoaderSpec(num_workers=2, persistent_workers=True))) as log:
        loader = DataLoader(Stream())
    assert loader.num_workers == 0 and not loader.persistent_workers
    assert any("IterableDataset" in s for s in log.skipped)
    assert any("persistent_workers needs num_workers > 0" in s for s in log.skipped)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only skip")
def test_pin_memory_skipped_without_cuda():
    with applied(TuneSettings(dataloader=DataLoaderSpec(pin_memory=True))) as log:
        loader = DataLoader(dataset())
    assert not loader.pin_memory
    assert any("pin_memory needs CUDA" in s for s in log.skipped)


# -- root hooks and AMP -------------------------------------------------------------------------


def test_root_hooks_fire_only_for_outermost_parameterised_module():
    seen = []
    undo = RootHooks(on_pre=lambda m, a: seen.append(type(m).__name__)).install()
    try:
        Net()(torch.randn(2, 8))
        nn.CrossEntropyLoss()(torch.randn(2, 3), torch.zeros(2, dtype=torch.long))  # parameter-less root
    finally:
        undo()
    assert seen == ["Net"]


def test_amp_runs_inner_layers_in_bf16_and_returns_float32():
    model = Net()
    inner = []
    model.head.register_forward_hook(lambda m, a, out: inner.append(out.dtype))
    x = torch.randn(4, 8)
    with applied(TuneSettings(amp="bf16")) as log:
        out = model(x)
        out.sum().backward()
    assert inner == [torch.bfloat16]
    assert out.dtype == torch.float32
    assert model.head.weight.grad is not None and model.head.weight.grad.dtype == torch.float32
    assert "amp" in log.fired
    assert model(x).dtype == torch.float32 and inner[-1] == torch.float32  # undone
    assert not torch.is_autocast_enabled("cpu")


def test_amp_balanced_when_forward_raises():
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            raise ValueError("boom")

    with applied(TuneSettings(amp="bf16")):
        with pytest.raises(ValueError):
            Bad()(torch.randn(1, 2))
        assert not torch.is_autocast_enabled("cpu")


# -- compile ------------------------------------------------------------------------------------


def test_matching_modules_by_model_name_and_class():
    net = Net()
    assert matching_modules(net, "model") == [net]
    assert matching_modules(net, "head") == [net.head]
    assert matching_modules(net, "Block") == list(net.blocks)
    assert matching_modules(net, "Nothing") == []


def test_compile_region_replaces_forward_counts_graphs_and_undoes():
    reset_compile_stats()
    net = Net()
    x = torch.randn(4, 8)
    expected = net(x)
    settings = TuneSettings(compile=CompileSpec(target="Block", backend="aot_eager"))
    with applied(settings) as log:
        net(x)  # first call: regions replaced
        assert all(b.__dict__.get("_compiled_call_impl") is not None for b in net.blocks)
        torch.testing.assert_close(net(x), expected)
        stats = compile_stats()
    assert stats["graphs"] >= 1 and stats["graph_breaks"] == 0
    assert "compile" in log.fired
    assert all("_compiled_call_impl" not in b.__dict__ for b in net.blocks)


@pytest.mark.parametrize("target", ["model", "Block"])
def test_a_compiled_region_leaves_the_module_picklable(target: str) -> None:
    """Issue 37: the knob set ``forward`` on the instance, so the script's own ``torch.save(model, f)``
    died with a PicklingError and compile was never judged on such scripts."""
    import io
    import pickle

    reset_compile_stats()
    net = Net()
    x = torch.randn(4, 8)
    expected = net(x)
    with applied(TuneSettings(compile=CompileSpec(target=target, backend="aot_eager"))) as log:
        for _ in range(2):  # the whole model: the region is in place from its second call
            torch.testing.assert_close(net(x), expected)
        assert "compile" in log.fired
        assert not any("forward" in m.__dict__ for m in net.modules())  # none between calls
        buf = io.BytesIO()
        torch.save(net, buf)
        copy = pickle.loads(pickle.dumps(net))
        torch.testing.assert_close(net(x), expected)  # still the compiled region after the save
    assert copy._compiled_call_impl is None and all(b._compiled_call_impl is None for b in copy.blocks)
    torch.testing.assert_close(copy(x), expected)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), expected)


def test_compile_counts_graph_breaks_and_recompiles():
    reset_compile_stats()

    class Breaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc(x)
            print("", end="")  # graph break
            return y.relu()

    model = Breaky()
    with applied(TuneSettings(compile=CompileSpec(target="model", backend="aot_eager"))):
        for n in (2, 2, 3, 3):  # the first call is eager (forward replaced during it), then a new batch size
            model(torch.randn(n, 8))
        stats = compile_stats()
    assert stats["graph_breaks"] >= 1
    assert stats["recompiles"] >= 1
    assert any("print" in r.lower() or "builtin" in r.lower() for r in stats["break_reasons"]), stats


def test_compile_unknown_target_is_skipped_with_reason():
    with applied(TuneSettings(compile=CompileSpec(target="Nope", backend="aot_eager"))) as log:
        Net()(torch.randn(2, 8))
    assert "compile" not in log.fired
    assert any("no submodule or class named 'Nope'" in s for s in log.skipped)


def test_region_targets_repeated_then_hot_then_model():
    facts = ModelFacts(
        models=["Net"],
        forward_ms=10.0,
        repeated=[{"cls": "Block", "count": 4, "params": 9}],
        submodules=[
            {"name": "blocks", "cls": "ModuleList", "forward_ms": None},
            {"name": "emb", "cls": "Embedding", "forward_ms": 0.5},
            {"name": "head", "cls": "Linear", "forward_ms": 4.0},
        ],
    )
    assert region_targets(facts, 3) == ["Block", "head", "model"]
    assert region_targets(facts, 2) == ["Block", "model"]
    facts.submodules[2]["forward_ms"] = 1.0  # below the hot share: not a region of its own
    assert region_targets(facts, 3) == ["Block", "model"]


def test_describe_model_mingpt_block_is_block_not_moduledict():
    # minGPT keeps the blocks in ModuleDict -> ModuleList and a ModuleDict inside every Block: the
    # ModuleDicts hold the most parameters, but a container is never a block (it is never called)
    from block_models import MinGPT

    info = describe_model(MinGPT())
    assert [r["cls"] for r in info["repeated"]] == ["MinBlock"] and info["repeated"][0]["count"] == 3
    calls = {"<root>": 1, "transformer.h.0": 1, "lm_head": 1}  # only one block ran: not repeated
    info = describe_model(MinGPT(), calls=calls)
    assert info["repeated"] == [] and info["uncalled_blocks"] == ["MinBlock"]


def test_compile_block_region_skipped_with_reason_when_no_block_ran():
    knob = CompileKnob(backend="aot_eager")
    facts = ModelFacts(models=["GPT"], repeated=[], uncalled_blocks=["Block"])
    targets = [c.compile.target for c in knob.candidates(facts)[0]]
    assert targets == ["model"]  # no block region is run...
    assert knob.skipped_candidates(facts) == [
        ("compile(blocks)", "the repeated block class Block is never called in the forward")
    ]  # ...and the table says why
    facts.uncalled_blocks = []
    assert "no repeated block" in knob.skipped_candidates(facts)[0][1]
    facts.repeated = [{"cls": "Block", "count": 2, "params": 4}]
    assert knob.skipped_candidates(facts) == []
    assert [c.compile.target for c in knob.candidates(facts)[0]] == ["Block", "model"]


def test_compile_of_a_region_that_never_runs_is_not_applied():
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.spare = nn.ModuleList([Block(), Block()])  # built, never called
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(x)

    with applied(TuneSettings(compile=CompileSpec(target="Block", backend="aot_eager"))) as log:
        model = Unused()
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))
        assert all(b._compiled_call_impl is not None for b in model.spare)  # replaced, yet never run
    assert "compile" not in log.fired  # so the trial is "not applied", never a drift "speedup"


def test_describe_model_finds_repeated_blocks():
    info = describe_model(Net(), {"head": 1.5})
    assert info["repeated"][0]["cls"] == "Block" and info["repeated"][0]["count"] == 2
    assert {"name": "head", "cls": "Linear", "params": 18, "forward_ms": 1.5} in info["submodules"]
    assert not info["has_conv"]


# -- optimizer, layout, threads, backends --------------------------------------------------------


@pytest.mark.parametrize("impl,other", [("fused", "foreach"), ("foreach", "fused")])
def test_optimizer_impl_forced_and_undone(impl, other):
    params = [nn.Parameter(torch.randn(3))]
    with applied(TuneSettings(optimizer=impl)) as log:
        opt = torch.optim.AdamW(params, lr=0.1, **{other: True})  # the script's own choice is replaced
        sgd = torch.optim.SGD(params, lr=0.1)
    assert opt.param_groups[0][impl] is True and not opt.param_groups[0][other]
    assert sgd.param_groups[0][impl] is True
    assert "optimizer" in log.fired
    assert not torch.optim.AdamW(params, lr=0.1).param_groups[0][impl]


def test_channels_last_converts_conv_model_and_inputs():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    seen = []
    model[0].register_forward_pre_hook(
        lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last))
    )
    with applied(TuneSettings(channels_last=True)) as log:
        model(torch.randn(2, 3, 8, 8))
    assert seen == [True]
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert "channels_last" in log.fired


def test_channels_last_skips_models_without_conv():
    with applied(TuneSettings(channels_last=True)) as log:
        Net()(torch.randn(2, 8))
    assert "channels_last" not in log.fired and any("no Conv2d" in s for s in log.skipped)


def test_threads_and_matmul_precision_set_and_restored():
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    with applied(TuneSettings(threads=threads + 1, matmul_precision="medium")):
        assert torch.get_num_threads() == threads + 1
        assert torch.get_float32_matmul_precision() == "medium"
    assert torch.get_num_threads() == threads
    assert torch.get_float32_matmul_precision() == precision


def test_cudnn_benchmark_set_and_restored():
    before = torch.backends.cudnn.benchmark
    with applied(TuneSettings(cudnn_benchmark=not before)):
        assert torch.backends.cudnn.benchmark is (not before)
    assert torch.backends.cudnn.benchmark is before


# -- candidates and skip reasons -----------------------------------------------------------------


def candidates(facts: ModelFacts) -> dict[str, tuple[list[TuneSettings], str | None]]:
    return {k.name: k.candidates(facts) for k in all_knobs()}


def test_skip_reasons_for_a_bare_cpu_script():
    out = candidates(
        ModelFacts(device="cpu", bf16_supported=False, models=["Net"], cpu_count=2, torch_threads=2)
    )
    assert "bf16 is not supported" in out["amp"][1]
    assert "no torch DataLoader" in out["dataloader"][1]
    assert "no Conv2d" in out["channels_last"][1]
    assert "only on CUDA" in out["matmul"][1]
    assert "already uses all 2 CPUs" in out["threads"][1]
    assert "no torch.optim optimizer" in out["optimizer"][1]
    assert out["compile"][1] is None and out["compile"][0][-1].compile.target == "model"


def test_candidates_for_a_cpu_training_script():
    facts = ModelFacts(
        device="cpu",
        bf16_supported=True,
        models=["Net"],
        loaders=1,
        cpu_count=4,
        torch_threads=1,
        optimizers=["AdamW"],
        has_conv=True,
        input_shapes_vary=True,
    )
    out = candidates(facts)
    assert out["amp"][0] == [TuneSettings(amp="bf16", amp_fp32_attention=True), TuneSettings(amp="bf16")]
    assert out["dataloader"][0][0].dataloader.num_workers == 3
    assert out["threads"][0] == [TuneSettings(threads=4)]
    assert out["optimizer"][0] == [TuneSettings(optimizer="fused")]
    assert out["channels_last"][0] == [TuneSettings(channels_last=True)]
    assert out["compile"][0][0].compile.dynamic is True  # shapes vary


def test_iterable_dataset_skips_workers():
    assert "IterableDataset" in DataLoaderKnob().candidates(ModelFacts(loaders=1, iterable_dataset=True))[1]


# -- numerics class, families, code lines --------------------------------------------------------


def test_numerics_class_is_the_loosest_member():
    assert numerics_class(TuneSettings()) == "exact"
    assert numerics_class(TuneSettings(threads=2)) == "exact"
    assert numerics_class(TuneSettings(threads=2, optimizer="fused")) == "close"
    assert numerics_class(TuneSettings(amp="bf16", compile=CompileSpec())) == "bf16"
    assert knob_families(TuneSettings(amp="bf16", threads=1)) == ["amp", "threads"]


def test_code_lines_compile_regions_when_executed():
    reset_compile_stats()
    net = Net()
    lines = code_lines(TuneSettings(compile=CompileSpec(target="Block", backend="aot_eager")))
    exec("\n".join(line for line in lines if not line.startswith("#")), {"model": net, "torch": torch})
    assert all(b._compiled_call_impl is not None for b in net.blocks)
    assert net._compiled_call_impl is None
    net(torch.randn(2, 8))


def test_code_lines_cover_every_set_knob():
    settings = TuneSettings(
        amp="bf16",
        threads=2,
        optimizer="fused",
        channels_last=True,
        dataloader=DataLoaderSpec(num_workers=2),
        matmul_precision="high",
    )
    text = "\n".join(code_lines(settings))
    for needle in (
        "torch.autocast",
        "set_num_threads(2)",
        "fused=True",
        "channels_last",
        "num_workers=2",
        'set_float32_matmul_precision("high")',
    ):
        assert needle in text


def test_apply_log_records_once():
    log = ApplyLog()
    log.did("amp", "x")
    log.did("amp", "x")
    log.skip("amp", "y")
    log.skip("amp", "y")
    assert log.to_dict() == {"applied": ["x"], "skipped": ["amp: y"], "fired": ["amp"]}


def test_amp_fp32_attention_keeps_attention_in_float32():
    import torch.nn.functional as F

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 1, 4, 24).split(8, dim=-1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    model = Attn()
    with applied(TuneSettings(amp="bf16", amp_fp32_attention=True)) as log:
        out = model(torch.randn(2, 4, 8))
        inside = []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
            inside.append(F.scaled_dot_product_attention(q, q, q).dtype)
    assert inside == [torch.float32]
    assert out.dtype == torch.float32
    assert any("float32" in a for a in log.applied)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # undone: bf16 attention again
        q = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
        assert F.scaled_dot_product_attention(q, q, q).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="needs amp"):
        TuneSettings(amp_fp32_attention=True)


def test_amp_fp32_attention_and_compile_compose_without_graph_breaks():
    import torch.nn.functional as F

    reset_compile_stats()

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 1, 4, 24).split(8, dim=-1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    model = Attn()
    settings = TuneSettings(
        amp="bf16", amp_fp32_attention=True, compile=CompileSpec(target="model", backend="aot_eager")
    )
    with applied(settings) as log:
        for _ in range(3):
            model(torch.randn(2, 4, 8)).sum().backward()
        stats = compile_stats()
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["recompiles"] == 0
    assert log.fired == {"amp", "compile"}


def test_the_torch_free_knob_name_list_matches_the_knobs_built():
    from torchscalpel.tune.knobs import KNOB_NAMES, all_knobs

    assert tuple(k.name for k in all_knobs()) == KNOB_NAMES


def test_compile_on_cpu_with_dropout_uses_eager_random_and_restores_it():
    import torch._inductor.config as inductor_config

    class Dropping(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.drop(x)

    reset_compile_stats()
    before = inductor_config.fallback_random
    settings = TuneSettings(compile=CompileSpec(target="Block", backend="aot_eager"))
    net = Dropping().train()
    with applied(settings) as log:
        net(torch.randn(4, 8))
        assert inductor_config.fallback_random is True
    assert inductor_config.fallback_random == before
    assert any("fallback_random" in d for d in log.applied)
    # eval mode (or no dropout): inductor's RNG is left alone
    with applied(settings):
        Net()(torch.randn(4, 8))
        assert inductor_config.fallback_random == before
    assert any("fallback_random" in line for line in code_lines(settings))


def test_channels_last_is_held_to_the_close_tolerance():
    # NHWC convolutions sum in another order: digits_cnn deviated 1.6e-4, over the exact class's 1e-4.
    assert numerics_class(TuneSettings(channels_last=True)) == "close"
    assert numerics_class(TuneSettings(channels_last=True, amp="bf16")) == "bf16"
