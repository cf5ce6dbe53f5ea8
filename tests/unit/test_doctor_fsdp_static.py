"""FSDP1 as the tutorials write it (issue 40, item 5): each pitfall fires on its script and not on the clean twin.

The scripts follow the FullyShardedDataParallel tutorial's shape: a ``setup()``/``cleanup()`` pair, an
``fsdp_main(rank, world_size, args)`` that builds the model, wraps it with ``auto_wrap_policy``/``MixedPrecision``/
``CPUOffload`` and trains it in a ``train()`` function.
"""

from __future__ import annotations

import textwrap

from torchscalpel.doctor.static_scan import analyze_source

HEADER = """\
import functools
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import CPUOffload, MixedPrecision
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
"""

CLEAN = """
def train(model, loader, optimizer, rank):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        model.clip_grad_norm_(1.0)
        optimizer.step()


def fsdp_main(rank, world_size, loader):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
    model = Net().to(rank)
    model = FSDP(model, auto_wrap_policy=policy, mixed_precision=bf16)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    train(model, loader, optimizer, rank)
"""


def rules(code: str) -> list[str]:
    return sorted(f.rule for f in analyze_source(HEADER + textwrap.dedent(code), "fsdp_mnist.py"))


FSDP_RULES = {
    "optimizer-before-fsdp",
    "clip-grad-on-fsdp-wrapper",
    "fsdp-fp16-plain-grad-scaler",
    "fsdp-low-precision-master-weights",
    "fsdp-cpu-offload",
}


def test_the_tutorial_shaped_clean_script_has_no_fsdp_finding() -> None:
    assert not FSDP_RULES & set(rules(CLEAN))


def test_four_planted_fsdp1_pitfalls_are_each_found_once() -> None:
    """The script the issue describes: four FSDP1 pitfalls planted in the tutorial's shape got zero findings."""
    planted = CLEAN.replace(
        "        model.clip_grad_norm_(1.0)\n",
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
    ).replace(
        """    model = Net().to(rank)
    model = FSDP(model, auto_wrap_policy=policy, mixed_precision=bf16)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
""",
        """    model = Net().to(rank).to(torch.bfloat16)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model = FSDP(model, auto_wrap_policy=policy, mixed_precision=bf16,
                 cpu_offload=CPUOffload(offload_params=True))
""",
    )
    assert planted != CLEAN
    found = rules(planted)
    assert [r for r in found if r in FSDP_RULES] == sorted(
        [
            "clip-grad-on-fsdp-wrapper",
            "fsdp-cpu-offload",
            "fsdp-low-precision-master-weights",
            "optimizer-before-fsdp",
        ]
    )


def test_clip_on_the_wrapper_names_the_model_and_fsdps_own_clip() -> None:
    code = CLEAN.replace(
        "model.clip_grad_norm_(1.0)", "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"
    )
    (finding,) = [
        f for f in analyze_source(HEADER + code, "fsdp_mnist.py") if f.rule == "clip-grad-on-fsdp-wrapper"
    ]
    assert finding.fix.startswith("model.clip_grad_norm_(max_norm)")
    assert any("FSDP(model, auto_wrap_policy=policy, mixed_precision=bf16)" in e for e in finding.evidence)


def test_clip_on_an_fsdp2_model_is_not_flagged() -> None:
    """fully_shard's parameters are DTensors: torch.nn.utils.clip_grad_norm_ reduces their norm over the mesh."""
    code = """
from torch.distributed.fsdp import fully_shard

def main(model, opt, loss):
    fully_shard(model)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""
    assert "clip-grad-on-fsdp-wrapper" not in rules(code)


def test_fp16_params_with_the_plain_grad_scaler() -> None:
    fp16 = CLEAN.replace(
        "bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)",
        "bf16 = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32)\n"
        "    scaler = torch.amp.GradScaler('cuda')",
    )
    assert "fsdp-fp16-plain-grad-scaler" in rules(fp16)
    sharded = fp16.replace(
        "scaler = torch.amp.GradScaler('cuda')",
        "from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n    scaler = ShardedGradScaler()",
    )
    assert "fsdp-fp16-plain-grad-scaler" not in rules(sharded)
    bf16_scaler = (
        CLEAN + "\nscaler = torch.amp.GradScaler('cuda')\n"
    )  # bf16 parameters need no scaler: not this rule
    assert "fsdp-fp16-plain-grad-scaler" not in rules(bf16_scaler)


def test_cpu_offload_off_or_absent_is_not_flagged() -> None:
    off = CLEAN.replace(
        "mixed_precision=bf16)", "mixed_precision=bf16, cpu_offload=CPUOffload(offload_params=False))"
    )
    assert "fsdp-cpu-offload" not in rules(off)


def test_a_cast_model_without_mixed_precision_is_not_this_rule() -> None:
    """A model trained in bf16 on purpose, with no MixedPrecision policy, is the user's choice."""
    code = CLEAN.replace("model = Net().to(rank)", "model = Net().to(rank).bfloat16()").replace(
        "mixed_precision=bf16)", ")"
    )
    assert "fsdp-low-precision-master-weights" not in rules(code)


def test_optimizer_before_wrap_is_reported_once_and_only_within_one_function() -> None:
    """The static rule reported one case twice (the module's scope walked into main()) and paired an optimizer
    built in one function with a wrap in another."""
    once = """
def main(model):
    opt = torch.optim.AdamW(model.parameters())
    model = FSDP(model)
    model = FSDP(model)  # wrapped again: still the same optimizer, one finding
"""
    assert rules(once).count("optimizer-before-fsdp") == 1
    apart = """
def build_optimizer(model):
    return torch.optim.AdamW(model.parameters())

def wrap(model):
    return FSDP(model)

opt = None
"""
    assert "optimizer-before-fsdp" not in rules(apart)
    module_then_function = """
opt = torch.optim.AdamW(model.parameters())

def wrap(model):
    return FSDP(model)
"""
    assert "optimizer-before-fsdp" not in rules(module_then_function)


def test_the_fsdp1_finding_says_flatparameters_and_wraps_in_its_fix() -> None:
    code = (
        "def main(model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model = FSDP(model)\n"
    )
    (finding,) = [f for f in analyze_source(HEADER + code, "t.py") if f.rule == "optimizer-before-fsdp"]
    assert "FlatParameters" in finding.message
    assert finding.fix.startswith("model = FullyShardedDataParallel(model)  # first")
