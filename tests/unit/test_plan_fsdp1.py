"""FSDP1 (FullyShardedDataParallel as the tutorial writes it) in ``scalpel plan`` and in ``wrap``'s advice.

The plan runs the tutorial-shaped script to its first step on one rank (its FSDP1 wrap recorded and handed back
unwrapped: FSDP1 refuses a CPU-only machine) and plans the strategy the wrap names, with its MixedPrecision
param dtype, CPU offload and ignored modules; the fully_shard twin of the same script gives the same row."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from torchscalpel.errors import UsageError
from torchscalpel.netutil import free_port
from torchscalpel.plan.devices import Device
from torchscalpel.plan.options import PlanOptions
from torchscalpel.plan.script import plan_script
from torchscalpel.runtime.fsdpwrap import read_source
from torchscalpel.runtime.target import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"
DEVICE = Device(name="cpu", memory=1 << 34, kind="cpu")
ROW_FIELDS = ("params", "grads", "optim", "activations", "comm", "peak", "host")


@pytest.fixture(autouse=True)
def _one_rank_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tutorial's setup() reads MASTER_ADDR/PORT; a free port, so parallel runs never meet."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _plan(name: str, *args: str, strategies: list[str] | None = None, world: int = 2):
    options = PlanOptions(
        target=Target(script=FIXTURES / name, args=list(args)), world_size=world, search_max_batch=False
    )
    result, _record = plan_script(options, DEVICE, strategies or ["ddp", "fsdp-grad-op", "fsdp-full"])
    return result


def _row(result, strategy: str) -> dict:
    return next(r.breakdown.to_dict() for r in result.rows if r.breakdown.strategy == strategy)


def test_an_fsdp1_script_is_planned_as_the_strategy_it_names_with_the_fully_shard_twins_figures() -> None:
    fsdp1 = _plan("fsdp1_mnist.py")
    assert [r.breakdown.strategy for r in fsdp1.rows] == ["fsdp-full"]
    wrap = fsdp1.request.fsdp
    assert wrap is not None and (wrap["api"], wrap["sharding"]) == ("FullyShardedDataParallel", "FULL_SHARD")
    assert wrap["site"].endswith("fsdp1_mnist.py:93")
    assert fsdp1.to_dict()["fsdp"]["strategy"] == "fsdp-full"
    twin = _plan("fsdp2_mnist.py")
    assert twin.request.fsdp is not None and twin.request.fsdp["api"] == "fully_shard"
    assert [r.breakdown.strategy for r in twin.rows] == ["fsdp-full"]
    assert {f: _row(fsdp1, "fsdp-full")[f] for f in ROW_FIELDS} == {
        f: _row(twin, "fsdp-full")[f] for f in ROW_FIELDS
    }
    grad_op = _plan("fsdp2_mnist.py", "--sharding", "SHARD_GRAD_OP")
    assert [r.breakdown.strategy for r in grad_op.rows] == ["fsdp-grad-op"]


@pytest.mark.parametrize(("sharding", "strategy"), [("SHARD_GRAD_OP", "fsdp-grad-op"), ("NO_SHARD", "ddp")])
def test_the_sharding_strategy_picks_the_row(sharding: str, strategy: str) -> None:
    result = _plan("fsdp1_mnist.py", "--sharding", sharding)
    assert [r.breakdown.strategy for r in result.rows] == [strategy]


def test_mixed_precision_offload_and_ignored_modules_are_planned() -> None:
    plain = _row(_plan("fsdp1_mnist.py"), "fsdp-full")
    bf16 = _plan("fsdp1_mnist.py", "--bf16")
    assert str(bf16.request.settings.precision) == "bf16-mixed"
    offloaded = _plan("fsdp1_mnist.py", "--offload")
    offload = _row(offloaded, "fsdp-full")
    import torchscalpel.report.plan_terminal as plan_terminal

    assert (
        "the script shards with FullyShardedDataParallel(FULL_SHARD, CPU offload: "
        in plan_terminal.render(offloaded)
    )
    # the page says what the terminal says, from the saved section (a record read back, not the live result)
    from torchscalpel.record import RunRecord
    from torchscalpel.report import plan_sections
    from torchscalpel.sections import PlanSection

    (line,) = plan_terminal.wrap_note(offloaded)
    assert PlanSection.from_dict(offloaded.to_dict()).wrap_sentence == line
    saved = RunRecord(sections={"plan": json.loads(json.dumps(offloaded.to_dict()))})
    (section,) = plan_sections.build(saved)
    assert line[1:].replace("'", "&#x27;") in section.body and "fsdp1_mnist.py:" in section.body
    assert offload["params"] == offload["grads"] == offload["optim"] == 0
    # the sharded parameters at least, at most every sharded state (the peak may move to before the optimizer's state)
    assert plain["params"] <= offload["host"] <= plain["params"] + plain["grads"] + plain["optim"]
    assert offload["peak"] < plain["peak"]
    ignored = _plan("fsdp1_mnist.py", "--ignore-head")
    head = (128 * 10 + 10) * 4
    assert (
        ignored.request.fsdp["ignored_modules"] == ["fc2"] and ignored.request.fsdp["ignored_bytes"] == head
    )
    total = ignored.measurement.param_bytes
    assert _row(ignored, "fsdp-full")["params"] == pytest.approx(head + (total - head) / 2, abs=2)


def test_an_explicit_strategy_still_plans_what_was_asked() -> None:
    # --strategy ddp: what if the script used DDP (only --strategy all follows the script's own wrap)
    options = PlanOptions(
        target=Target(script=FIXTURES / "fsdp1_mnist.py"),
        world_size=2,
        strategy="ddp",
        search_max_batch=False,
    )
    result, _ = plan_script(options, DEVICE, ["ddp"])
    assert [r.breakdown.strategy for r in result.rows] == ["ddp"]
    assert result.request.fsdp is not None  # the wrap is still recorded


TUTORIAL = """
import functools
import torch
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

def fsdp_main(rank, world_size):
    model = Net().to(rank)
    model = FSDP(
        model,
        sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
        mixed_precision=bf16,
        cpu_offload=CPUOffload(offload_params=True),
        ignored_modules=[model.head],
    )
"""


def test_the_source_is_read_where_running_it_needs_a_process_group(tmp_path: Path) -> None:
    (wrap,) = read_source(textwrap.dedent(TUTORIAL), "train.py")
    assert (wrap.sharding, wrap.param_dtype, wrap.cpu_offload, wrap.ignored_modules) == (
        "SHARD_GRAD_OP",
        "bfloat16",
        True,
        ("[model.head]",),
    )
    assert wrap.site == "train.py:11" and wrap.strategy == "fsdp-grad-op" and wrap.precision == "bf16-mixed"
    assert read_source("from torch.distributed.fsdp import fully_shard\nfully_shard(model)\n") == []
    assert read_source("FSDP(") == []  # not Python: nothing read, no traceback
    from torchscalpel.distributed import script_advice

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TUTORIAL))
    (advice,) = script_advice(script)
    assert (
        "FullyShardedDataParallel(SHARD_GRAD_OP, param_dtype bfloat16, CPU offload, 1 ignored module)"
        in advice
    )
    assert "reshard_after_forward=False" in advice and "CPUOffloadPolicy()" in advice
    assert "ignored_params" in advice and "MixedPrecisionPolicy" in advice
    clean = tmp_path / "clean.py"
    clean.write_text((FIXTURES / "fsdp2_mnist.py").read_text())
    assert script_advice(clean) == []


def test_wrap_refuses_a_model_fsdp1_already_wraps_and_says_the_fsdp2_form() -> None:
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from torchscalpel.distributed import wrap

    # FSDP1's constructor refuses a machine without an accelerator: the wrapper is built with the attributes
    # its constructor sets (sharding_strategy, mixed_precision, cpu_offload, _ignored_modules)
    wrapper = FSDP.__new__(FSDP)
    nn.Module.__init__(wrapper)
    wrapper._fsdp_wrapped_module = nn.Linear(4, 4)
    wrapper.sharding_strategy = ShardingStrategy.FULL_SHARD
    wrapper.mixed_precision = MixedPrecision(param_dtype=torch.bfloat16)
    wrapper.cpu_offload = CPUOffload(offload_params=False)
    wrapper._ignored_modules = set()
    with pytest.raises(UsageError) as raised:
        wrap(nn.Sequential(wrapper))
    message = str(raised.value)
    assert message.startswith("wrap() got a model FSDP1 already wraps. FullyShardedDataParallel(FULL_SHARD")
    assert 'wrap(model, strategy="fsdp", mixed_precision="bf16")' in message
