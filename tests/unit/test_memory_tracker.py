"""The allocation tracker, growth, ladder and snapshot reader: what they measure and refuse."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from torchscalpel.errors import UsageError
from torchscalpel.memory.growth import find_growth
from torchscalpel.memory.ladder import build_ladder
from torchscalpel.memory.snapshot import explain, load_snapshot
from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.runtime.limit_block import enforced
from torchscalpel.runtime.memory_limit import MemoryLimitExceeded


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))


def test_categories_add_up_and_activations_are_owned_by_modules() -> None:
    model, x = _net(), torch.randn(128, 64)
    tr = AllocationTracker()
    tr.start()
    try:
        tr.name_modules(model)
        tr.adopt(model.parameters(), "parameters")
        out = model(x)
        saved, modules = tr.by_category["activations"], dict(tr.by_module)
        out.sum().backward()
        tr.adopt((p.grad for p in model.parameters()), "gradients")
    finally:
        tr.stop()
    params = sum(p.numel() * 4 for p in model.parameters())
    assert tr.by_category["parameters"] == params
    assert tr.by_category["gradients"] == params
    # tanh saves its output, linear its input: 128 x 256 floats each at least
    assert saved >= 2 * 128 * 256 * 4
    # the first module to save a tensor owns it: Linear 0 its input, the Tanh modules their outputs (which
    # the next Linear saves too); Sequential children are named by their class and parent, not a bare index
    assert set(modules) == {"Sequential.0 (Linear)", "Sequential.1 (Tanh)", "Sequential.3 (Tanh)"}
    assert sum(tr.peak_copy["by_category"].values()) == tr.peak_copy["total"]
    assert tr.peak >= tr.peak_copy["total"] >= tr.peak * 0.99
    # the largest live site is this test file
    assert max(tr.peak_copy["by_site"], key=tr.peak_copy["by_site"].get).startswith(__file__)


def test_frees_are_subtracted() -> None:
    tr = AllocationTracker()
    tr.start()
    try:
        a = torch.empty(1000)
        live = tr.total
        del a
    finally:
        tr.stop()
    assert live == 4000 and tr.total == 0 and tr.peak == 4000


def test_peak_agrees_with_the_cpu_allocator() -> None:
    from plan_measure import profiled_memory

    model, x = _net(), torch.randn(512, 64)

    def step() -> None:
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    step()
    tr = AllocationTracker()
    tr.start()
    try:
        tr.adopt(model.parameters(), "parameters")
        base = tr.total
        tr.peak = tr.total
        reading = profiled_memory(step)
    finally:
        tr.stop()
    assert abs((tr.peak - base) - reading.peak) <= 0.10 * reading.peak


def test_limit_raises_once_with_what_was_live() -> None:
    with pytest.raises(MemoryLimitExceeded, match="memory limit"), enforced(10_000) as tr:
        keep = [torch.empty(1000) for _ in range(5)]
        assert keep
    assert tr.oom is not None and tr.oom["total"] > 10_000 and tr.oom["request_bytes"] == 4000
    assert tr.oom["site"].startswith(__file__)
    assert "(step" not in tr.oom_sentence()  # a bare limit has no step timeline to name


def _samples(per_step: int, kept: int = 0) -> list[dict[str, object]]:
    return [
        {
            "step": i,
            "warmup": i == 0,
            "live": 1000 + per_step * i,
            "peak": 5000 + per_step * i,
            "sites": {"train.py:9": per_step * i, "model.py:3": 700},
            "kept_activations": kept * i,
            "losses_kept": 0,
        }
        for i in range(8)
    ]


def test_growth_names_the_site_and_the_steps_left() -> None:
    g = find_growth(_samples(10_000, kept=9000), capacity=1_000_000)
    assert g["per_step"] == 10_000
    assert [r["site"] for r in g["sites"]] == ["train.py:9"]
    assert g["steps_left"] == (1_000_000 - (5000 + 70_000)) // 10_000
    assert g["kept"]["activations"] == 63_000
    assert find_growth(_samples(0), capacity=10**6)["per_step"] == 0


def test_ladder_numbers_come_from_the_plan() -> None:
    plan = {"peak": 100, "checkpointed_peak": 40, "blocks": 8, "batch": 32, "max_batch": 16, "bf16_peak": 70}
    ladder = build_ladder(
        measured_peak=100,
        limit=50,
        plan=plan,
        cause="activations",
        breakdown={"activations": 80},
        phase="forward",
        growth=None,
        fragmentation=None,
    )
    by_kind = {r["kind"]: r for r in ladder}
    assert ladder[0]["kind"] == "checkpoint-blocks" and by_kind["checkpoint-blocks"]["saves"] == 60
    assert by_kind["checkpoint-blocks"]["fits"] and by_kind["checkpoint-blocks"]["config"] == {
        "checkpointing": "blocks"
    }
    assert by_kind["micro-batches"]["config"] == {"microbatches": 4}  # 16 * 0.75 -> 12 -> K=3 -> 4 divides 32
    assert by_kind["bf16"]["saves"] == 30 and by_kind["bf16"]["fits"] is False


def test_set_to_none_rung_only_for_gradients_left_from_the_last_step() -> None:
    args = dict(
        measured_peak=100,
        limit=50,
        plan=None,
        cause="activations",
        breakdown={"activations": 60, "gradients": 30},
        phase="forward",
        growth=None,
        fragmentation=None,
    )
    assert "set-to-none" in {r["kind"] for r in build_ladder(**args)}
    # under gradient accumulation the gradients in a later micro-batch's forward are the ones being summed
    assert "set-to-none" not in {r["kind"] for r in build_ladder(**args, accumulating=True)}


def test_kept_graph_rung_saves_what_the_growing_site_holds_beyond_one_step() -> None:
    # a logged loss keeps its graph: the kept activations are only part of what the site holds (inputs, outputs)
    growth = find_growth(_samples(10_000, kept=1000), capacity=100_000)
    ladder = build_ladder(
        measured_peak=90_000,
        limit=40_000,
        plan=None,
        cause="growth",
        breakdown={},
        phase="forward",
        growth=growth,
        fragmentation=None,
    )
    rung = next(r for r in ladder if r["kind"] == "detach-kept")
    assert rung["saves"] == 70_000 - 10_000  # train.py:9 holds 7 steps' worth at the end, one step stays
    assert rung["fits"] is True  # 90_000 - 60_000 <= 40_000


def test_growth_survives_a_partial_last_sample() -> None:
    # a limit crossed mid-step ends the samples on one without per-site figures
    samples = _samples(10_000, kept=1000)
    samples[-1] = {**samples[-1], "sites": {}, "kept_activations": 0}
    g = find_growth(samples, capacity=100_000)
    assert g["sites"][0]["live"] == 60_000 and g["kept"]["activations"] == 6000


def _snapshot(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data))
    return path


def test_snapshot_reader_explains_plain_data(tmp_path: Path) -> None:
    frames = [
        {"filename": "/x/site-packages/torch/nn/linear.py", "line": 1, "name": "f"},
        {"filename": "/home/u/train.py", "line": 42, "name": "step"},
    ]
    data = {
        "segments": [
            {
                "total_size": 4096,
                "blocks": [
                    {"size": 1024, "state": "active_allocated", "frames": frames},
                    {"size": 3072, "state": "inactive", "frames": []},
                ],
            }
        ],
        "device_traces": [[{"action": "oom", "size": 8192, "frames": frames}]],
    }
    r = explain(load_snapshot(_snapshot(tmp_path, data)))
    assert r["reserved"] == 4096 and r["allocated"] == 1024 and r["largest_free"] == 3072
    assert r["sites"] == [{"name": "/home/u/train.py:42", "bytes": 1024}]
    assert r["ooms"][0]["bytes"] == 8192 and r["expandable_segments_advised"]


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_snapshot_reader_refuses_anything_but_plain_data(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="refuses") as err:
        load_snapshot(_snapshot(tmp_path, {"segments": [Evil()]}))
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="not a PyTorch memory snapshot"):
        load_snapshot(_snapshot(tmp_path, [1, 2, 3]))
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"\x80\x04not really")
    with pytest.raises(UsageError, match="not a PyTorch memory snapshot"):
        load_snapshot(junk)


def test_modules_roll_up_to_their_block() -> None:
    from torchscalpel.memory.analysis import by_block

    assert by_block({"blocks.0.attn": 3, "blocks.0.mlp.1": 2, "blocks.1.attn": 4, "head": 1, "": 5}) == {
        "blocks.0": 5,
        "blocks.1": 4,
        "head": 1,
        "": 5,
    }
    # display names: the class an indexed name carries labels its block
    assert by_block(
        {
            "blocks.0 (Block)": 1,
            "blocks.0.attn": 3,
            "blocks.0.mlp.1 (GELU)": 2,
            "blocks.1.attn": 4,
            "Sequential.2 (Linear)": 7,
        }
    ) == {"blocks.0 (Block)": 6, "blocks.1": 4, "Sequential.2 (Linear)": 7}
    assert by_block({"blocks.1.attn": 4}, {"blocks.1": "blocks.1 (Block)"}) == {"blocks.1 (Block)": 4}


def test_indexed_modules_are_named_by_class_and_parent() -> None:
    from torchscalpel.runtime.module_names import display_name, split_display_name

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.head = nn.Linear(4, 2)

    tr = AllocationTracker()
    net = Net()
    tr.name_modules(net)
    assert tr.module_names[net.layers[0]] == "layers.0 (Linear)"
    assert tr.module_names[net.layers] == "layers" and tr.module_names[net.head] == "head"
    assert tr.module_names[net] == "Net" and tr.index_labels == {
        "layers.0": "layers.0 (Linear)",
        "layers.1": "layers.1 (ReLU)",
    }
    assert display_name("3", nn.Linear(1, 1), "Sequential") == "Sequential.3 (Linear)"
    assert split_display_name("layers.0 (Linear)") == ("layers.0", "Linear")
    assert split_display_name("head") == ("head", None)


def test_alias_returning_ops_are_skipped_and_new_storages_counted() -> None:
    from torchscalpel.runtime.alias_ops import returns_alias as _returns_alias

    assert _returns_alias(torch.ops.aten.add_.Tensor) and _returns_alias(torch.ops.aten.view.default)
    assert _returns_alias(torch.ops.aten.add.out)
    assert not _returns_alias(torch.ops.aten.add.Tensor) and not _returns_alias(torch.ops.aten.mm.default)
    a = torch.ones(1000)  # allocated before the tracker: an in-place op on it is not a new allocation
    tr = AllocationTracker()
    tr.start()
    try:
        a.mul_(2)
        a.add_(1)
        b = a.view(10, 100)
        assert tr.allocations == 0 and tr.total == 0  # in-place and view ops allocate nothing
        c = a * 2
        assert tr.allocations == 1 and tr.total == 4000
    finally:
        tr.stop()
    del b, c


def test_dispatch_is_not_wrapped_and_dynamo_never_enters_the_tracker(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    import torch._dynamo

    from torchscalpel.runtime import alloc_tracker

    # The tracker sets dynamo's force_eager stance, under which dynamo looks at no frame at all; this test is
    # about the C-level marks that keep dynamo out of the tracker's code when the stance is not there (an older
    # torch, or a script that sets its own stance), so it runs without the stance.
    monkeypatch.setattr(alloc_tracker, "force_eager", lambda: None)

    # torch's per-call dynamo-disable wrapper is replaced by a C-level skip of the tracker's code
    assert not hasattr(AllocationTracker.__torch_dispatch__, "__wrapped__")

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return (y.cos() + 1).sum()

    compiled = torch.compile(f, backend="eager")
    x = torch.randn(100, requires_grad=True)
    torch._logging.set_logs(dynamo=logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG):
            tr = AllocationTracker()
            tr.start()
            try:
                compiled(x).backward()
            finally:
                tr.stop()
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    assert tr.allocations > 0 and x.grad is not None
    frames = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert any("skipping: f " in m for m in frames)  # dynamo did look at the user's frame
    assert not [m for m in frames if "alloc_tracker" in m]  # and never at the tracker's


def test_an_op_on_a_thread_without_python_callers_is_still_counted() -> None:
    # CUDA runs backward ops on autograd's device threads, where the dispatch mode is the whole Python stack
    import _thread
    import threading

    done = threading.Event()
    result: list[object] = []
    tr = AllocationTracker()

    def site() -> None:
        try:
            result.append(tr._site())
        except Exception as exc:  # the test reports whatever escaped
            result.append(exc)
        finally:
            done.set()

    _thread.start_new_thread(site, ())
    assert done.wait(10)
    assert result == ["(no Python caller)"]


def test_the_peak_copy_is_the_picture_at_the_highest_total() -> None:
    tr = AllocationTracker()
    tr.start()
    try:
        a = torch.empty(1000)
        b = torch.empty(2000)  # the high: 12,000 bytes, made by this allocation
        del a  # the copy is taken here, before the free is subtracted
        c = torch.empty(100)
        del b, c
    finally:
        tr.stop()
    copy = tr.peak_copy
    assert tr.peak == 12_000 and copy["total"] == 12_000 and copy["by_category"]["temporaries"] == 12_000
    assert copy["op"] == "aten.empty.memory_format" and sum(copy["by_site"].values()) == 12_000
    tr2 = AllocationTracker()
    tr2.start()
    try:
        keep = torch.empty(500)  # a high never followed by a free: read through the property
    finally:
        tr2.stop()
    assert tr2.peak_copy["total"] == 2000 and keep.numel() == 500


def test_the_report_names_a_higher_peak_before_training() -> None:
    from torchscalpel.record import RunRecord
    from torchscalpel.report.memory_sections import build

    section = {
        "peak": {"total": 1000, "by_category": {"parameters": 1000}, "modules": [], "sites": []},
        "before_training": {"total": 5000, "site": "/home/u/train.py:9"},
    }
    html = "".join(s.body for s in build(RunRecord(sections={"memory": section})))
    assert "Before training the live total was higher" in html and "/home/u/train.py:9" in html
    del section["before_training"]
    assert "Before training" not in "".join(s.body for s in build(RunRecord(sections={"memory": section})))


def test_a_notebook_cell_is_the_users_call_site() -> None:
    # runtime.userframes: a cell (<ipython-input-...>) is a person's code, exec'd <string> code is not
    cell = compile("big = torch.zeros(4096, 64)\n", "<ipython-input-3-5f2a>", "exec")
    generated = compile("small = torch.zeros(16, 64)\n", "<string>", "exec")
    tr = AllocationTracker()
    tr.start()
    try:
        scope: dict[str, object] = {"torch": torch}
        exec(cell, scope)
        exec(generated, scope)
    finally:
        tr.stop()
    sites = tr.by_site
    assert sites.get("<ipython-input-3-5f2a>:1") == 4096 * 64 * 4
    assert not any(s.startswith("<string>") for s in sites)
    assert any(
        s.startswith(__file__) for s in sites
    )  # the generated code's allocation is named by its caller
