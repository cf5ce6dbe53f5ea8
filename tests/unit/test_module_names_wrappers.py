"""Module names in memory output drop wrapper segments (Fabric's ``_forward_module``, DDP's ``module``,
torch.compile's ``_orig_mod``, FSDP1's ``_fsdp_wrapped_module``, ``checkpoint_wrapper``), issue 27."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.runtime.module_names import user_modules, user_path


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.module = nn.Linear(4, 4)  # a layer the model itself calls "module": not a wrapper, kept


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.blocks = nn.ModuleList([Block(), checkpoint_wrapper(Block())])


class FSDPStandIn(nn.Module):
    """FSDP1's attribute layout (FSDP1 itself refuses to run without an accelerator, TORCH-FACTS.md)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self._fsdp_wrapped_module = inner


def _names(root: nn.Module) -> set[str]:
    return {name for name, _ in user_modules(root)[1]}


def test_every_wrapper_names_the_modules_as_the_bare_model_does():
    model = TinyLM()
    bare_root, bare = user_modules(model)
    bare_names = {name for name, _ in bare}
    assert {
        "blocks.0 (Block)",
        "blocks.0.attn",
        "blocks.0.module",
        "blocks.1 (Block)",
        "blocks.1.attn",
    } <= bare_names
    assert bare_root == "TinyLM"
    for wrapped in (
        torch.compile(model),
        nn.DataParallel(model),
        FSDPStandIn(model),
        torch.compile(nn.DataParallel(model)),
    ):
        root, named = user_modules(wrapped)
        assert root == "TinyLM", type(wrapped)
        assert {n for n, _ in named} == bare_names, type(wrapped)
        by_module = dict((m, n) for n, m in named)
        assert by_module[wrapped] == "TinyLM"  # the wrapper is named as the model it holds


def test_fabric_module_names_drop_forward_module():
    import lightning as L

    model = TinyLM()
    wrapped = L.Fabric(accelerator="cpu", devices=1).setup_module(model)
    assert user_path(wrapped, "_forward_module.blocks.0.attn") == "blocks.0.attn"
    assert _names(wrapped) == _names(model)
    tracker = AllocationTracker(limit=None, device_kind="cpu")
    tracker.name_modules(wrapped)
    assert tracker.module_names[model.blocks[0].attn] == "blocks.0.attn"
    assert tracker.module_names[wrapped] == "TinyLM"
    assert not any("_forward_module" in n or "_original_module" in n for n in tracker.module_names.values())


def test_profile_module_times_show_fabric_names_and_keep_the_path_tune_compiles_by():
    """profile's per-module table under Fabric read ``_forward_module.blocks.0``: it now shows the user's name
    and keeps the qualified path (what ``get_submodule`` and tune's compile knob take) beside it."""
    import lightning as L

    from torchscalpel.record import StepRecord
    from torchscalpel.runtime.clock import Clock
    from torchscalpel.runtime.module_times import ModuleTimes

    model = TinyLM()
    wrapped = L.Fabric(accelerator="cpu", devices=1).setup_module(model)
    timer = ModuleTimes()

    class Session:  # the two attributes ModuleTimes reads
        timeline = type("Timeline", (), {"clock": Clock()})()

    timer.on_start(Session())  # type: ignore[arg-type]
    # the root forward call, then one block's, as the global hooks would report them
    timer.on_forward_pre(wrapped, (), {}, True)
    timer.on_forward_pre(model.blocks[0], (), {}, False)
    timer.on_forward_post(model.blocks[0], (), {}, None, False)
    timer.on_forward_post(wrapped, (), {}, None, True)
    timer.on_step_end(StepRecord(index=0))
    rows = {r["shown"]: r for r in timer.table()}
    assert "blocks.0" in rows and not any("_forward_module" in shown for shown in rows)
    assert rows["blocks.0"]["name"] == "_forward_module.blocks.0"
    assert wrapped.get_submodule(rows["blocks.0"]["name"]) is model.blocks[0]
