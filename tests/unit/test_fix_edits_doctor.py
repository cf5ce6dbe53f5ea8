"""scalpel fix's edits for doctor findings, on source strings in the styles real scripts use: each lands
at the finding's line (read from the source here, not counted by hand), keeps comments and layout, gives
no diff a second time, and refuses code that is not what the rule saw; and the plan that maps a doctor
record's findings to those edits."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.doctor_plan import DOCTOR_RULES, doctor_plan
from torchscalpel.fix.editors.doctor import EDITORS, KINDS
from torchscalpel.fix.edits import EDIT_KINDS, apply_edit
from torchscalpel.record import new_run_record


def line_of(src: str, text: str) -> int:
    """The 1-based line of the one line of ``src`` that contains ``text``."""
    hits = [i for i, line in enumerate(src.splitlines(), 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def edit(src: str, kind: str, at: str, **kwargs: object) -> tuple[str, str, str]:
    """Apply ``kind`` at the line holding ``at``; also apply it again to the result (same line)."""
    e = Edit(kind=kind, line=line_of(src, at), kwargs=tuple(kwargs.items()))
    new, outcome = apply_edit(src, e)
    again, second = apply_edit(new, e)
    assert again == new
    return new, outcome.status + (f": {outcome.reason}" if outcome.reason else ""), second.status


DDP = """import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train(model, opt, epochs):
    ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(ds, shuffle=True)  # rank and world from the process group
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    for epoch in range(epochs):
        # one pass over this rank's shard
        for step, (xb, yb) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
"""

WANT_DDP = DDP.replace(
    "        # one pass over this rank's shard\n",
    "        # one pass over this rank's shard\n        sampler.set_epoch(epoch)\n",
)


def test_kinds_are_registered_with_the_edit_dispatch() -> None:
    assert set(KINDS) == set(EDITORS) and set(KINDS) <= set(EDIT_KINDS)


def test_set_epoch_from_the_loader_loop_or_the_sampler_line() -> None:
    new, status, again = edit(DDP, "set_epoch", "in enumerate(loader)")  # runtime: the loop iterating it
    assert (new, status, again) == (WANT_DDP, "applied", "already")
    new, status, again = edit(DDP, "set_epoch", "= DistributedSampler(")  # static: the sampler's line
    assert (new, status, again) == (WANT_DDP, "applied", "already")


def test_set_epoch_on_a_sampler_built_inside_the_dataloader_call() -> None:
    src = (
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "loader = DataLoader(\n    ds,\n    batch_size=8,\n    sampler=DistributedSampler(ds),\n)\n"
        "for ep in range(3):\n    for xb in loader:\n        step(xb)\n"
    )
    new, status, _ = edit(src, "set_epoch", "for xb in loader")
    assert status == "applied"
    assert "for ep in range(3):\n    loader.sampler.set_epoch(ep)\n    for xb in loader:\n" in new


def test_set_epoch_refuses_what_it_cannot_name() -> None:
    # a while loop has no epoch variable to pass
    src = DDP.replace("for epoch in range(epochs):", "while True:")
    _, status, _ = edit(src, "set_epoch", "in enumerate(loader)")
    assert status.startswith("refused") and "not inside a for loop over the epochs" in status
    # the loader comes in as an argument: which sampler it holds is not in this code
    src = "def fit(loader, epochs):\n    for epoch in range(epochs):\n        for b in loader:\n            step(b)\n"
    new, status, _ = edit(src, "set_epoch", "for b in loader")
    assert new == src and status.startswith("refused") and "not built once by a DataLoader" in status
    # the line is neither the loop nor the sampler
    _, status, _ = edit(DDP, "set_epoch", "loss.backward()")
    assert status.startswith("refused")


NANOGPT = '''import torch

eval_iters = 2


def estimate_loss():
    """Mean loss over a few batches of each split."""
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out
'''


def test_no_grad_decorates_an_evaluation_function_that_never_trains() -> None:
    new, status, again = edit(NANOGPT, "no_grad", "logits, loss = model(X, Y)", train_line=40)
    assert (status, again) == ("applied", "already")
    assert new == NANOGPT.replace("\n\ndef estimate_loss", "\n\n@torch.no_grad()\ndef estimate_loss")


def test_no_grad_in_train_mode_adds_eval_and_restores_train() -> None:
    src = NANOGPT.replace("    model.eval()\n", "").replace("    model.train()\n", "")
    new, status, again = edit(src, "no_grad", "logits, loss = model(X, Y)", eval_mode=True)
    assert (status, again) == ("applied", "already")
    assert '    """Mean loss over a few batches of each split."""\n    model.eval()\n    out = {}\n' in new
    assert "    model.train()\n    return out\n" in new and "@torch.no_grad()\ndef estimate_loss" in new


LOOP = """import torch
from torch import nn

for epoch in range(2):
    model.train()
    for x, y in train_batches:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    # validation
    for x, y in val_batches:
        val_loss = nn.functional.cross_entropy(model(x), y).item()  # per batch
    if epoch % 2 == 0:
        sample = model(x[:1])
"""


def test_no_grad_wraps_the_evaluation_loop_never_the_training_one() -> None:
    train = line_of(LOOP, "        loss = nn.functional.cross_entropy(model(x), y)")
    new, status, again = edit(LOOP, "no_grad", "val_loss =", train_line=train, eval_mode=True)
    assert (status, again) == ("applied", "already")
    assert new == LOOP.replace(
        "    # validation\n    for x, y in val_batches:\n        val_loss = nn.functional.cross_entropy(model(x), y).item()  # per batch\n",
        "    # validation\n    model.eval()\n    with torch.no_grad():\n        for x, y in val_batches:\n"
        "            val_loss = nn.functional.cross_entropy(model(x), y).item()  # per batch\n    model.train()\n",
    )
    # a forward inside the training loop's block: the statement alone
    new, status, _ = edit(LOOP, "no_grad", "sample = model", train_line=train)
    assert status == "applied"
    assert "    if epoch % 2 == 0:\n        with torch.no_grad():\n            sample = model(x[:1])\n" in new


def test_no_grad_refuses_the_training_forward_line_and_a_file_without_import_torch() -> None:
    train = line_of(LOOP, "        loss = nn.functional.cross_entropy(model(x), y)")
    new, status, _ = edit(
        LOOP, "no_grad", "        loss = nn.functional.cross_entropy(model(x), y)", train_line=train
    )
    assert new == LOOP and status.startswith("refused") and "training forward" in status
    src = LOOP.replace("import torch\n", "")
    _, status, _ = edit(src, "no_grad", "val_loss =", train_line=train)
    assert status.startswith("refused") and "import torch" in status


EVAL_IN_TRAIN = """import torch

for epoch in range(2):
    train_one_epoch(model, opt)
    # evaluate
    with torch.no_grad():
        acc = sum((model(xb).argmax(1) == yb).sum().item() for xb, yb in val) / n
    print("val acc", acc)
"""


def test_eval_mode_around_the_no_grad_block() -> None:
    new, status, again = edit(EVAL_IN_TRAIN, "eval_mode", "acc = sum(")
    assert (status, again) == ("applied", "already")
    assert new == EVAL_IN_TRAIN.replace(
        "    # evaluate\n    with torch.no_grad():\n",
        "    # evaluate\n    model.eval()\n    with torch.no_grad():\n",
    ).replace("    print(", "    model.train()\n    print(")


def test_eval_mode_in_a_no_grad_function_and_refused_without_a_no_grad_here() -> None:
    src = "import torch\n\n\n@torch.no_grad()\ndef evaluate(net, batch):\n    out = net(batch)\n    return out.mean()\n"
    new, status, again = edit(src, "eval_mode", "out = net(batch)")
    assert (status, again) == ("applied", "already")
    assert (
        "def evaluate(net, batch):\n    net.eval()\n    out = net(batch)\n    net.train()\n    return out.mean()\n"
        in new
    )
    src = "def evaluate(net, batch):\n    return net(batch).mean()\n"  # the caller's no_grad is not here
    new, status, _ = edit(src, "eval_mode", "return net(batch)")
    assert new == src and status.startswith("refused") and "no torch.no_grad()" in status


def test_a_summed_loss_becomes_a_float_or_a_detached_tensor() -> None:
    src = (
        "total_loss = 0\nfor x, y in batches:\n    loss = loss_fn(model(x), y)\n    loss.backward()  # grads\n"
        "    opt.step()\n    total_loss += loss  # running sum\nprint(float(total_loss))\n"
    )
    new, status, again = edit(src, "detach_kept", "loss.backward()")
    assert (status, again) == ("applied", "already")
    assert new == src.replace("total_loss += loss  #", "total_loss += loss.item()  #")
    # the file reads the sum as a tensor afterwards: it stays one, without the graph
    used = src.replace("print(float(total_loss))", "print(total_loss.item())")
    new, _, _ = edit(used, "detach_kept", "loss.backward()")
    assert "    total_loss += loss.detach()  # running sum\n" in new


def test_a_loss_kept_in_a_list_by_a_trainer_method_with_a_scaled_backward() -> None:
    src = (
        "class Trainer:\n    def train_step(self, batch, i):\n        loss = self.criterion(self.model(batch[0]), batch[1])\n"
        "        (loss / self.accum_steps).backward()\n        self.metrics['train/loss'].append(loss)\n"
    )
    new, status, again = edit(src, "detach_kept", "(loss / self.accum_steps).backward()")
    assert (status, again) == ("applied", "already")
    assert new == src.replace(".append(loss)", ".append(loss.detach())")


def test_detach_kept_refuses_a_kept_expression_it_does_not_know() -> None:
    src = "for x in xs:\n    loss = f(x)\n    loss.backward()\n    history.append(loss * 2)\n"
    new, status, _ = edit(src, "detach_kept", "loss.backward()")
    assert new == src and status.startswith("refused") and "keeps the loss" in status


AMP = """import torch

for x, y in batches:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    if max_norm:
        # clip
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""


def test_unscale_before_the_clip_names_the_scaler_and_optimizer_of_the_step() -> None:
    new, status, again = edit(AMP, "unscale_before_clip", "clip_grad_norm_")
    assert (status, again) == ("applied", "already")
    assert new == AMP.replace("        # clip\n", "        # clip\n        scaler.unscale_(optimizer)\n")
    src = AMP.replace("    scaler.step(optimizer)\n", "    optimizer.step()\n")  # no scaler step to name them
    new, status, _ = edit(src, "unscale_before_clip", "clip_grad_norm_")
    assert new == src and status.startswith("refused")


def test_seed_after_the_imports_once_and_refused_without_import_torch() -> None:
    src = '"""Train."""\nimport torch\nfrom torch import nn\n\nmodel = nn.Linear(2, 2)\n'
    e = Edit(kind="global_call", code="torch.manual_seed(0)\n")
    new, outcome = apply_edit(src, e)
    assert outcome.status == "applied"
    assert new == src.replace("from torch import nn\n", "from torch import nn\ntorch.manual_seed(0)\n")
    assert apply_edit(new, e)[1].status == "already"
    assert apply_edit("from torch import nn\nm = nn.Linear(2, 2)\n", e)[1].status == "refused"


def test_doctor_plan_reads_the_mode_from_the_evidence_and_the_training_forward_from_the_sites() -> None:
    record = new_run_record("doctor", status="complete")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    record.sections["sites"] = {"forward": {"file": "/p/train.py", "line": 14}}
    record.findings = [
        {
            "rule": "eval-without-no-grad",
            "location": {"file": "/p/train.py", "line": 19},
            "evidence": ["8 forward pass(es) whose graph was freed unused: 8 call(s) of Net in train mode"],
        },
        {"rule": "sampler-set-epoch-missing", "location": {"file": "/p/train.py", "line": 17}},
        {"rule": "unseeded-run", "location": {"file": "/p/engine.py", "line": 30}},
        {"rule": "clip-before-unscale", "location": None},
        {"rule": "nan-loss", "location": {"file": "/p/train.py", "line": 3}},
    ]
    items = {p.rule: p for p in doctor_plan(record)}
    assert set(items) <= set(DOCTOR_RULES) and "nan-loss" not in items
    no_grad = items["eval-without-no-grad"].edit
    assert no_grad is not None and (no_grad.kind, no_grad.line) == ("no_grad", 19)
    assert dict(no_grad.kwargs) == {"train_line": 14, "eval_mode": True}
    assert items["sampler-set-epoch-missing"].edit == Edit(kind="set_epoch", line=17)
    seed = items["unseeded-run"]  # into the script the run started (found by the sites), not the module
    assert seed.edit is not None and seed.edit.kind == "global_call" and str(seed.file) == "/p/train.py"
    assert items["clip-before-unscale"].edit is None and items["clip-before-unscale"].reason


def test_shuffle_on_the_loader_the_loop_iterates_or_on_its_distributed_sampler() -> None:
    src = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(ds, batch_size=32)  # sorted by label\nfor epoch in range(2):\n"
        "    for xb, yb in loader:\n        step(xb, yb)\n"
    )
    new, status, again = edit(src, "shuffle", "for xb, yb in loader")
    assert (status, again) == ("applied", "already")
    assert new == src.replace("batch_size=32)", "batch_size=32, shuffle=True)")
    dist = src.replace("batch_size=32)", "batch_size=32, sampler=sampler)").replace(
        "loader = ", "sampler = DistributedSampler(ds, shuffle=False)\nloader = "
    )
    new, status, _ = edit(dist, "shuffle", "for xb, yb in loader")
    assert status == "applied" and "DistributedSampler(ds, shuffle=True)" in new and "sampler=sampler)" in new
    custom = src.replace("batch_size=32)", "batch_sampler=buckets)")
    new, status, _ = edit(custom, "shuffle", "for xb, yb in loader")
    assert new == custom and status.startswith("refused") and "batch_sampler" in status


MODEL = """import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d, n):
        self.d = d  # width
        self.blocks = [nn.Linear(d, d) for _ in range(n)]  # the hidden layers
        self.heads = {"cls": nn.Linear(d, 2)}
        self.mean = torch.zeros(d)
        super().__init__()

    def forward(self, x):
        return x - self.mean
"""


def test_model_constructor_fixes_keep_each_line_and_comment() -> None:
    new, status, again = edit(MODEL, "module_container", "self.blocks =")
    assert (status, again) == ("applied", "already")
    assert (
        "        self.blocks = nn.ModuleList([nn.Linear(d, d) for _ in range(n)])  # the hidden layers\n"
        in new
    )
    new, status, _ = edit(MODEL, "module_container", "self.heads =")
    assert status == "applied" and '        self.heads = nn.ModuleDict({"cls": nn.Linear(d, 2)})\n' in new
    new, status, again = edit(MODEL, "register_buffer", "self.mean =")
    assert (status, again) == ("applied", "already")
    assert '        self.register_buffer("mean", torch.zeros(d))\n' in new
    new, status, again = edit(MODEL, "super_init_first", "self.blocks =")
    assert (status, again) == ("applied", "already")
    assert new == MODEL.replace("        super().__init__()\n", "").replace(
        "        self.d = d  # width\n", "        super().__init__()\n        self.d = d  # width\n"
    )


def test_model_constructor_fixes_refuse_what_is_not_theirs() -> None:
    _, status, _ = edit(MODEL, "module_container", "self.mean =")  # a tensor, not a container
    assert status.startswith("refused")
    _, status, _ = edit(MODEL, "register_buffer", "return x - self.mean")  # not an assignment
    assert status.startswith("refused")
    computed = MODEL.replace("super().__init__()", "super().__init__(self.d)")  # reads what came before
    new, status, _ = edit(computed, "super_init_first", "self.blocks =")
    assert new == computed and status.startswith("refused") and "by hand" in status
    # no call at all: added, for a direct nn.Module subclass only
    none = MODEL.replace("        super().__init__()\n", "")
    new, status, _ = edit(none, "super_init_first", "self.blocks =")
    assert (
        status == "applied"
        and "    def __init__(self, d, n):\n        super().__init__()\n        self.d = d" in new
    )
    other = none.replace("class MLP(nn.Module):", "class MLP(Base):")
    _, status, _ = edit(other, "super_init_first", "self.blocks =")
    assert status.startswith("refused") and "not a direct nn.Module subclass" in status


def test_empty_cache_and_cudnn_off_are_deleted_with_their_comments_kept() -> None:
    src = (
        "import torch\n\ntorch.backends.cudnn.enabled = False\n# the model\nmodel = build()\n"
        "for x in xs:\n    step(x)\n    # free memory\n    torch.cuda.empty_cache()\n    log(x)\n"
        "for y in ys:\n    torch.cuda.empty_cache()\n"
    )
    e = Edit(kind="delete_statement", line=line_of(src, "    # free memory") + 1, callee="empty_cache")
    new, outcome = apply_edit(src, e)
    assert outcome.status == "applied"
    assert "    step(x)\n    # free memory\n    log(x)\n" in new
    # the same line again: it now holds log(x), but another empty_cache() is left in the file
    assert apply_edit(new, e)[1].status == "refused"
    last = Edit(kind="delete_statement", line=line_of(new, "torch.cuda.empty_cache()"), callee="empty_cache")
    emptied, outcome = apply_edit(new, last)
    assert outcome.status == "applied" and emptied.endswith("for y in ys:\n    pass\n")
    assert apply_edit(emptied, last)[1].status == "already"  # none left anywhere: done
    off = Edit(kind="delete_statement", line=3, callee="cudnn.enabled")
    new, outcome = apply_edit(src, off)
    assert outcome.status == "applied" and new.startswith("import torch\n\n# the model\nmodel = build()\n")
    wrong = Edit(kind="delete_statement", line=line_of(src, "model = build()"), callee="cudnn.enabled")
    assert apply_edit(src, wrong)[1].status == "refused"


def test_super_init_goes_after_the_docstring_of_an_init_that_holds_nothing_else() -> None:
    src = 'from torch import nn\n\n\nclass Empty(nn.Module):\n    def __init__(self):\n        """Nothing yet."""\n'
    new, status, again = edit(src, "super_init_first", "def __init__")
    assert (status, again) == ("applied", "already")
    assert new.endswith('        """Nothing yet."""\n        super().__init__()\n')
