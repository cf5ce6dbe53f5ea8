"""Static doctor rules: each fires on its bug and stays silent on the correct variant."""

from __future__ import annotations

import textwrap

import pytest

from torchscalpel.doctor import static as static_mod
from torchscalpel.doctor.registry import RULES, rank_findings
from torchscalpel.doctor.static import analyze_source
from torchscalpel.findings import Severity

HEADER = "import torch\nimport torch.nn as nn\nimport torch.distributed as dist\n"


def rules_in(code: str) -> list[str]:
    return [f.rule for f in analyze_source(HEADER + textwrap.dedent(code), "t.py")]


CASES = [
    # (rule, buggy code, correct code)
    (
        "module-in-plain-container",
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.layers = [nn.Linear(2, 2) for _ in range(3)]
     """,
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
             layers = [nn.Linear(2, 2)]
             self.seq = nn.Sequential(*layers)
     """,
    ),
    (
        "module-in-plain-container",
        """
     class Block(nn.Module):
         pass
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.heads = {}
             self.heads["a"] = Block()
     """,
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.sizes = [1, 2, 3]
             self.names = {"a": "b"}
     """,
    ),
    (
        "module-in-plain-container",
        """
     from torch.nn import Linear, Module
     class M(Module):
         def __init__(self):
             super().__init__()
             self.blocks = []
             for i in range(2):
                 self.blocks.append(Linear(2, 2))
     """,
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.blocks = []
             for i in range(2):
                 self.blocks.append(nn.Linear(2, 2))
             self.blocks = nn.ModuleList(self.blocks)
     """,
    ),
    (
        "tensor-attribute-not-registered",
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.mask = torch.ones(4, 4).tril()
     """,
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.register_buffer("mask", torch.ones(4, 4).tril())
             self.scale = nn.Parameter(torch.ones(4))
             self.n = 4
         def forward(self, x):
             self.tmp = torch.zeros(2)
             return x
     """,
    ),
    (
        "module-created-in-forward",
        """
     class M(nn.Module):
         def forward(self, x):
             return nn.Linear(4, 4)(x)
     """,
        """
     class M(nn.Module):
         def __init__(self):
             super().__init__()
             self.fc = nn.Linear(4, 4)
         def forward(self, x):
             return nn.ReLU()(self.fc(x)) + nn.CrossEntropyLoss()(x, x)
     """,
    ),
    (
        "empty-cache-in-loop",
        """
     for step in range(10):
         torch.cuda.empty_cache()
     """,
        """
     for step in range(10):
         pass
     torch.cuda.empty_cache()
     """,
    ),
    (
        "unseeded-run",
        """
     for x in data:
         loss = model(x); loss.backward(); opt.step()
     """,
        """
     torch.manual_seed(0)
     for x in data:
         loss = model(x); loss.backward(); opt.step()
     """,
    ),
    (
        "rank-conditional-step",
        """
     if dist.get_rank() == 0:
         dist.all_reduce(t)
     """,
        """
     if rank == 0:
         print(loss.item())
         torch.save(model.state_dict(), "m.pt")
     dist.all_reduce(t)
     if local_rank != 0:
         dist.barrier()
     download()
     if local_rank == 0:
         dist.barrier()
     if rank == src:
         dist.broadcast(payload, src=src)
     else:
         dist.broadcast(buffer, src=src)
     """,
    ),
    (
        "rank-conditional-step",
        """
     if is_main_process:
         loss.backward()
         optimizer.step()
     """,
        """
     loss.backward()
     optimizer.step()
     if is_main_process:
         scheduler.step()
     """,
    ),
    ("dataparallel-used", "m = nn.DataParallel(model)\n", "m = nn.parallel.DistributedDataParallel(model)\n"),
    (
        "sampler-set-epoch-missing",
        """
     from torch.utils.data.distributed import DistributedSampler
     s = DistributedSampler(ds)
     """,
        """
     from torch.utils.data.distributed import DistributedSampler
     s = DistributedSampler(ds)
     val = DistributedSampler(ds_val, shuffle=False)
     for epoch in range(3):
         s.set_epoch(epoch)
     """,
    ),
    (
        "optimizer-before-fsdp",
        """
     from torch.distributed.fsdp import fully_shard
     def main():
         model = Net()
         opt = torch.optim.AdamW(model.parameters())
         fully_shard(model)
     """,
        """
     from torch.distributed.fsdp import fully_shard
     def main():
         model = Net()
         fully_shard(model)
         opt = torch.optim.AdamW(model.parameters())
     """,
    ),
    (
        "unsafe-torch-load",
        "s = torch.load(p, weights_only=False)\n",
        "s = torch.load(p)\nt = torch.load(p, weights_only=True)\n",
    ),
    (
        "whole-model-save",
        """
     net = nn.Linear(2, 2).to("cpu")
     torch.save(net, "m.pt")
     """,
        """
     net = nn.Linear(2, 2)
     torch.save(net.state_dict(), "m.pt")
     torch.save({"model": net.state_dict(), "step": 3}, "ckpt.pt")
     """,
    ),
]


@pytest.mark.parametrize(("rule", "bad", "good"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_static_rule_fires_on_bug_and_not_on_fix(rule: str, bad: str, good: str) -> None:
    assert rule in rules_in(bad)
    assert rule not in rules_in(good)


def test_static_findings_carry_location_fix_and_source_line() -> None:
    code = "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = [nn.Linear(1, 1)]\n"
    (f,) = [x for x in analyze_source(HEADER + code, "model.py") if x.rule == "module-in-plain-container"]
    assert f.location is not None and f.location.file == "model.py" and f.location.line == 7
    assert f.source == "static" and "ModuleList" in f.fix
    assert any("self.l = [nn.Linear(1, 1)]" in e for e in f.evidence)
    assert f.severity == RULES["module-in-plain-container"].severity


def test_syntax_error_file_gives_no_findings() -> None:
    assert analyze_source("def broken(:\n", "bad.py") == []


def test_crashing_static_rule_becomes_its_internal_error_and_others_still_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchscalpel.doctor import catalogue
    from torchscalpel.doctor.rules.checkpoint_static import WholeModelSaveStatic

    class Boom(static_mod.StaticRule):
        info = WholeModelSaveStatic.info

        def check(self, ctx):
            raise ValueError("kaboom")

    monkeypatch.setattr(catalogue, "STATIC_RULES", (Boom, *catalogue.STATIC_RULES))
    found = analyze_source(HEADER + "m = nn.DataParallel(model)\n", "t.py")
    crashed = [f for f in found if f.rule == "whole-model-save"]
    assert len(crashed) == 1 and "internal error" in crashed[0].message and "kaboom" in crashed[0].message
    assert crashed[0].severity == Severity.INFO
    assert "dataparallel-used" in [f.rule for f in found]


def test_registry_has_every_contract_slug_once() -> None:
    contract = """module-in-plain-container tensor-attribute-not-registered module-created-in-forward param-not-in-optimizer
    frozen-param-in-optimizer grad-not-zeroed loss-graph-retained eval-in-train-mode eval-without-no-grad
    train-loader-not-shuffled nan-loss loss-diverging grad-norm-explosion vanishing-gradients cannot-overfit-batch
    clip-before-unscale scaler-skipped-steps dataloader-bound host-device-copy-bound empty-cache-in-loop
    cudnn-benchmark-dynamic-shapes compile-graph-breaks compile-recompiles ddp-batchnorm-not-synced
    ddp-no-distributed-sampler sampler-set-epoch-missing ddp-find-unused-parameters rank-conditional-step
    dataparallel-used optimizer-before-fsdp unsafe-torch-load whole-model-save state-dict-prefix-mismatch
    unseeded-run""".split()  # noqa: SIM905 - reads as the issue text
    # issue 21: hand-written updates, a loss that cannot vary; issue 18: DDP device_ids against LOCAL_RANK
    # issue 27: the script's own failure is the first finding
    added = ["manual-parameter-update", "loss-constant", "ddp-device-ids-not-local-rank", "script-failed"]
    assert sorted(contract + added) == sorted(RULES)


def test_rank_findings_orders_by_severity() -> None:
    found = analyze_source(
        HEADER + "torch.save(model, 'm.pt')\nfor i in x:\n    if rank == 0:\n        dist.barrier()\n", "t.py"
    )
    ranked = rank_findings(found)
    assert [f.severity for f in ranked] == sorted((f.severity for f in ranked), reverse=True)
    assert ranked[0].rule == "rank-conditional-step"
