"""Static doctor rules: each fires on its bug and stays silent on the correct variant."""

from __future__ import annotations

import textwrap

import pytest

from torchscalpel.doctor import static as static_mod
from torchscalpel.doctor.registry import RULES, rank_findings
from torchscalpel.doctor.static_scan import analyze_source
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
    (
        "super-init-missing",
        """
     class Net(nn.Module):
         def __init__(self):
             self.fc = nn.Linear(2, 2)
     """,
        """
     class Base(nn.Module):
         def __init__(self, d):
             self.d = d  # a plain value before the base __init__ is fine
             super(Base, self).__init__()
             self.fc = nn.Linear(d, d)
     class Net(Base):
         def __init__(self):
             Base.__init__(self, 2)
             self.head = nn.Linear(2, 1)
     class Head(nn.Linear):
         def __init__(self):
             nn.Linear.__init__(self, 2, 2)
     """,
    ),
    (
        "super-init-missing",
        """
     class Net(nn.Module):
         def __init__(self):
             self.w = nn.Parameter(torch.zeros(3))
             super().__init__()
     """,
        """
     class Net(nn.Module):
         def __init__(self):
             super().__init__()
             self.w = nn.Parameter(torch.zeros(3))
     """,
    ),
    (
        "cudnn-disabled",
        """
     from torch.backends import cudnn
     cudnn.enabled = False
     """,
        """
     torch.backends.cudnn.enabled = False  # around one section only
     y = rnn(x)
     torch.backends.cudnn.enabled = True
     with torch.backends.cudnn.flags(enabled=False):
         y = rnn(x)
     torch.backends.cudnn.deterministic = True
     torch.backends.cudnn.enabled = args.cudnn
     """,
    ),
    (
        "distributed-sampler-wrong-world",
        """
     from torch.utils.data.distributed import DistributedSampler
     WORLD = 4
     sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank)
     """,
        """
     from torch.utils.data.distributed import DistributedSampler
     import torch.multiprocessing as mp
     s1 = DistributedSampler(ds)
     s2 = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())
     s3 = DistributedSampler(ds, num_replicas=2, rank=rank)  # the file fixes the world size at 2
     mp.spawn(main, nprocs=2)
     world = int(os.environ["WORLD_SIZE"])
     s4 = DistributedSampler(ds, num_replicas=world, rank=rank)
     """,
    ),
    (
        "accumulated-loss-not-divided",
        """
     for i, (x, y) in enumerate(loader):
         loss = criterion(model(x), y)
         scaler.scale(loss).backward()
         if (i + 1) % accum_steps == 0:
             scaler.step(optimizer)
             scaler.update()
             optimizer.zero_grad()
     """,
        """
     for i, (x, y) in enumerate(loader):
         loss = criterion(model(x), y)
         loss = loss / accum_steps
         scaler.scale(loss).backward()
         if (i + 1) % accum_steps == 0:
             scaler.step(optimizer)
             scaler.update()
             optimizer.zero_grad()
     for i, (x, y) in enumerate(loader):
         (criterion(model(x), y) * (1 / k)).backward()
         if i % k == 0:
             opt.step()
     for i, (x, y) in enumerate(loader):
         with accelerator.accumulate(model):
             accelerator.backward(criterion(model(x), y))
         if (i + 1) % k == 0:
             optimizer.step()
     for i, (x, y) in enumerate(loader):
         criterion(model(x), y).backward()
         if (i + 1) % k == 0:
             for p in model.parameters():
                 p.grad /= k
             optimizer.step()
     for step in range(100):
         for micro_step in range(gradient_accumulation_steps):
             logits, loss = model(X, Y)
             loss = loss / gradient_accumulation_steps
             loss.backward()
         optimizer.step()
     for epoch in range(3):
         for x, y in loader:
             criterion(model(x), y).backward()
             optimizer.step()
             if epoch % 10 == 0:
                 print("logged")
     for i, (real, z) in enumerate(loader):
         d_loss = d_criterion(D(real), D(G(z)))
         d_loss.backward()
         opt_d.step()
         if i % n_critic == 0:
             g_loss = -D(G(z)).mean()
             g_loss.backward()
             opt_g.step()
     """,
    ),
    (
        "accumulated-loss-not-divided",
        """
     micro = 0
     while True:
         x, y = next(it)
         loss = criterion(model(x), y)
         loss.backward()
         micro += 1
         if micro == accum:
             optimizer.step()
             optimizer.zero_grad()
             micro = 0
     """,
        """
     micro = 0
     while True:
         x, y = next(it)
         loss = criterion(model(x), y) / accum
         loss.backward()
         micro += 1
         if micro == accum:
             optimizer.step()
             micro = 0
     """,
    ),
    (
        "accumulated-loss-not-divided",
        """
     for step in range(100):
         for micro_step in range(accum):
             loss = model(X, Y)
             loss = loss / accum
             (loss / accum).backward()
         optimizer.step()
     """,
        """
     for step in range(100):
         for micro_step in range(accum):
             loss = model(X, Y).sum() / num_tokens
             (loss / accum).backward()
         optimizer.step()
     """,
    ),
    (
        "ddp-accumulation-without-no-sync",
        """
     from torch.nn.parallel import DistributedDataParallel as DDP
     model = DDP(net)
     for i, (x, y) in enumerate(loader):
         (criterion(model(x), y) / k).backward()
         if (i + 1) % k == 0:
             opt.step()
     """,
        """
     from torch.nn.parallel import DistributedDataParallel as DDP
     model = DDP(net)
     for step in range(100):
         for micro_step in range(accum):
             model.require_backward_grad_sync = micro_step == accum - 1
             (model(X).sum() / accum).backward()
         optimizer.step()
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
    # issue 32: the pitfalls of the troubleshooting manuals
    added += [
        "super-init-missing",
        "softmax-before-cross-entropy",
        "loss-task-mismatch",
        "accumulated-loss-not-divided",
        "cudnn-disabled",
        "distributed-sampler-wrong-world",
        "ddp-accumulation-without-no-sync",
    ]
    # issue 40: FSDP1 as the tutorials write it
    added += [
        "clip-grad-on-fsdp-wrapper",
        "fsdp-fp16-plain-grad-scaler",
        "fsdp-low-precision-master-weights",
        "fsdp-cpu-offload",
    ]
    # issue 40: the data, the mode after an evaluation, the validation curve
    added += [
        "train-in-eval-mode",
        "input-not-finite",
        "input-unnormalised",
        "batch-constant",
        "label-out-of-range",
        "batch-one-class",
        "val-loss-overfitting",
        "val-loss-oscillating",
        "val-loss-plateau",
    ]
    added += ["no-lr-warmup", "other-phase-heavy"]  # issue 40: the baseline schedule, the "other" phase
    assert sorted(contract + added) == sorted(RULES)


def test_rank_findings_orders_by_severity() -> None:
    found = analyze_source(
        HEADER + "torch.save(model, 'm.pt')\nfor i in x:\n    if rank == 0:\n        dist.barrier()\n", "t.py"
    )
    ranked = rank_findings(found)
    assert [f.severity for f in ranked] == sorted((f.severity for f in ranked), reverse=True)
    assert ranked[0].rule == "rank-conditional-step"


@pytest.mark.parametrize(
    ("code", "saved"),
    [
        # the k-fold script of issue 40: the best fold's model in a list, saved by index at the end
        ("best = [None, 1e9]\nbest = [copy.deepcopy(model), 0.3]\ntorch.save(best[0], 'b.pt')\n", "best[0]"),
        ("best = {}\nbest['net'] = copy.deepcopy(model)\ntorch.save(best['net'], 'b.pt')\n", "best['net']"),
        ("kept = []\nkept.append(model.cpu())\ntorch.save(kept[-1], 'b.pt')\n", "kept[-1]"),
        ("self.best = (copy.deepcopy(self.model), 1)\ntorch.save(self.best[0], 'b.pt')\n", "self.best[0]"),
    ],
)
def test_whole_model_save_follows_a_module_kept_in_a_container(code: str, saved: str) -> None:
    found = [
        f for f in analyze_source(HEADER + "import copy\n" + code, "t.py") if f.rule == "whole-model-save"
    ]
    assert len(found) == 1 and f"torch.save of {saved} " in found[0].message
    assert f"torch.save({saved}.state_dict(), path)" in found[0].fix


@pytest.mark.parametrize(
    "code",
    [
        "best = [copy.deepcopy(model.state_dict()), 0.3]\ntorch.save(best[0], 'b.pt')\n",
        "best = {'net': {k: v.cpu() for k, v in model.state_dict().items()}}\ntorch.save(best['net'], 'b.pt')\n",
        "losses = []\nlosses.append(loss.item())\ntorch.save(losses[-1], 'l.pt')\n",
        "kept = [model]\ntorch.save(other[0], 'b.pt')\n",
    ],
)
def test_whole_model_save_is_quiet_on_state_dicts_in_containers(code: str) -> None:
    assert "whole-model-save" not in rules_in("import copy\n" + code)


TRANSFORMER = "layer = nn.TransformerEncoderLayer(64, 4, batch_first=True)\n"


@pytest.mark.parametrize(
    ("code", "idiom"),
    [
        ("opt = torch.optim.AdamW(layer.parameters(), lr=6e-4)\n", "SequentialLR("),
        ("LR = 3e-4\nopt = torch.optim.Adam(layer.parameters(), LR)\n", "SequentialLR("),
        ("opt = torch.optim.AdamW(layer.parameters())\n", "SequentialLR("),  # the default lr, 1e-3
        (
            "class L:\n    def configure_optimizers(self):\n"
            "        return torch.optim.AdamW(self.parameters(), lr=1e-3)\n",
            "estimated_stepping_batches",
        ),
        (
            "from transformers import TrainingArguments, AutoModelForCausalLM\n"
            "args = TrainingArguments(output_dir='o', learning_rate=5e-4)\n",
            "warmup_ratio=0.05",
        ),
    ],
)
def test_no_lr_warmup_names_the_baseline_schedule_in_the_scripts_idiom(code: str, idiom: str) -> None:
    found = [f for f in analyze_source(HEADER + TRANSFORMER + code, "t.py") if f.rule == "no-lr-warmup"]
    assert len(found) == 1 and idiom in found[0].fix and "cosine" in found[0].fix.lower()


@pytest.mark.parametrize(
    "code",
    [
        # a warm-up, however written
        TRANSFORMER + "opt = torch.optim.AdamW(layer.parameters(), lr=6e-4)\n"
        "sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))\n",
        TRANSFORMER + "opt = torch.optim.AdamW(layer.parameters(), lr=6e-4)\n"
        "for g in opt.param_groups:\n    g['lr'] = lr_at(step)\n",
        TRANSFORMER + "from transformers import TrainingArguments\n"
        "TrainingArguments(output_dir='o', learning_rate=5e-4, warmup_ratio=0.1)\n",
        # a fine-tuning rate, SGD, or no transformer
        TRANSFORMER + "opt = torch.optim.AdamW(layer.parameters(), lr=2e-5)\n",
        TRANSFORMER + "opt = torch.optim.SGD(layer.parameters(), lr=0.1)\n",
        "net = nn.Linear(4, 2)\nopt = torch.optim.AdamW(net.parameters(), lr=1e-3)\n",
    ],
)
def test_no_lr_warmup_is_quiet_with_a_warmup_or_without_a_transformer(code: str) -> None:
    assert "no-lr-warmup" not in rules_in(code)


def test_module_in_plain_container_leaves_modules_without_parameters_alone() -> None:
    quiet = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.acts = [nn.ReLU(), nn.GELU()]
            self.losses = {"ce": nn.CrossEntropyLoss()}
            self.drops = []
            self.drops.append(nn.Dropout(0.1))
    """
    assert "module-in-plain-container" not in rules_in(quiet)
    loud = quiet.replace("nn.GELU()", "nn.Linear(2, 2)")
    assert "module-in-plain-container" in rules_in(loud)


@pytest.mark.parametrize(
    ("code", "line"),
    [
        ("from transformers import TrainingArguments\nargs = TrainingArguments(output_dir='o')\n", 2),
        ("import transformers\n\nargs = transformers.TrainingArguments(\n    output_dir='o',\n)\n", 3),
        ("x = 1\n", None),  # none: the runtime finding keeps the line that ran the Trainer
        ("a = TrainingArguments(lr=1)\nb = TrainingArguments(lr=2)\n", None),  # two: which one is unknown
        ("def broken(:\n", None),
    ],
)
def test_the_runtime_warmup_finding_moves_to_the_one_training_arguments_call(tmp_path, code, line) -> None:
    from torchscalpel.doctor.rules.rt_schedule import training_arguments_at
    from torchscalpel.findings import Location

    path = tmp_path / "train.py"
    path.write_text(code)
    found = training_arguments_at(Location(file=str(path), line=9))
    assert (found.line if found is not None else None) == line
    assert training_arguments_at(Location(file=str(tmp_path / "missing.py"), line=1)) is None
