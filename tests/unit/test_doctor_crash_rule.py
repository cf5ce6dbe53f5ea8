"""The script-failed rule on its own: what it keeps of an exception, and the fixes it names (no script run)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch import nn

from torchscalpel.doctor.rules.rt_run import (
    Crash,
    ScriptFailed,
    _device_pair,
    _load_call,
    crash_of,
    launcher_commands,
)
from torchscalpel.findings import Finding, Location
from torchscalpel.record import RunRecord


class Vocab:
    """A user class pickled into a checkpoint (torch's weights-only unpickler refuses it)."""

    def __init__(self) -> None:
        self.itos = ["<pad>", "a", "b"]


def _raise_from_user_file(tmp_path: Path, source: str) -> BaseException:
    script = tmp_path / "train.py"
    script.write_text(source)
    try:
        exec(compile(script.read_text(), str(script), "exec"), {"__name__": "__main__"})
    except BaseException as exc:  # whatever the user code raised
        return exc
    raise AssertionError("the user code did not raise")


def test_a_real_weights_only_refusal_gives_the_allowlist_and_the_trusted_load_of_the_same_line(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ck.pt"
    torch.save({"vocab": Vocab()}, ckpt)
    exc = _raise_from_user_file(
        tmp_path, f"import torch\nstate = torch.load({str(ckpt)!r}, map_location='cpu')\n"
    )
    crash = crash_of(exc)
    assert crash.type_name == "UnpicklingError" and crash.location is not None and crash.location.line == 2
    rule = ScriptFailed()
    rule.crash = crash
    (f,) = rule.findings(RunRecord(status="failed", error="UnpicklingError: Weights only load failed."))
    name = f"{__name__}.Vocab"
    assert name in f.message and "weights_only=True is its default since torch 2.6" in f.message
    assert f"torch.serialization.add_safe_globals([{name}])" in f.fix
    assert f"torch.load({str(ckpt)!r}, map_location='cpu', weights_only=False)" in f.fix
    assert str(f.severity) == "error" and f.evidence[0].startswith("at ")


def test_load_call_edits_only_a_call_that_does_not_say_weights_only() -> None:
    assert _load_call("m = torch.load(f)") == ("m = torch.load(f", ")")
    assert _load_call("m = torch.load(f, weights_only=True)") is None
    assert _load_call("model = torch.load(") is None  # a call spread over lines: the generic fix


def test_launcher_commands_keep_the_arguments_shell_quoted() -> None:
    text = launcher_commands("train.py", ["--name", "my run", "--lr=3e-4"])
    assert "scalpel launch --nproc N -- train.py --name 'my run' --lr=3e-4" in text
    assert "torchrun --nproc-per-node N train.py --name 'my run' --lr=3e-4" in text


def test_without_the_exception_the_record_error_still_makes_a_finding() -> None:
    (f,) = ScriptFailed().findings(
        RunRecord(status="failed", error="RuntimeError: boom", target={"inprocess": "nb:3"})
    )
    assert f.message == "The block raised RuntimeError before its first step: boom." and f.location is None
    assert list(ScriptFailed().findings(RunRecord(status="stopped"))) == []


def _finding(crash: Crash, record: RunRecord | None = None, **state: object) -> Finding:
    """The one ``script-failed`` finding of ``crash`` (``state``: what the rule read at the failure)."""
    rule = ScriptFailed()
    rule.crash = crash
    for name, value in state.items():
        setattr(rule, name, value)
    (f,) = rule.findings(record or RunRecord(status="failed", error=f"{crash.type_name}: {crash.message}"))
    return f


# torch's CUDA wordings (torch >= 2.5 and before), as raised by the CUDA kernels' device check
CUDA_DEVICE_NEW = (
    "Expected all tensors to be on the same device, but got mat1 is on cpu, different from other tensors "
    "on cuda:0 (when checking argument in method wrapper_CUDA_addmm)"
)
CUDA_DEVICE_OLD = (
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
    "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)"
)


def test_device_pair_reads_every_wording_of_the_device_check() -> None:
    try:
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to("meta")(torch.randn(2, 4))
    except RuntimeError as exc:
        real = str(exc)  # this torch's own text for the same check, raised here without a GPU
    else:
        raise AssertionError("a meta model on a CPU batch did not raise")
    assert _device_pair(real) == ("", "meta", "cpu")
    assert _device_pair(CUDA_DEVICE_NEW) == ("mat1", "cpu", "cuda:0")
    assert _device_pair(CUDA_DEVICE_OLD) == ("mat1", "cuda:0", "cpu")
    assert _device_pair("Expected all tensors to be of the same dtype") is None


def test_device_mismatch_on_cuda_moves_the_lines_inputs_to_the_models_device() -> None:
    crash = Crash(
        "RuntimeError", CUDA_DEVICE_NEW, Location(file="train.py", line=9), "out = model(x, mask=m)"
    )
    f = _finding(crash, model_devices=["cuda:0"])
    assert "tensors on two devices, cpu and cuda:0" in f.message and "model's device (cuda:0)" in f.message
    assert "the op got tensors on cpu and cuda:0 (argument mat1)" in f.evidence
    assert "the model's parameters are on cuda:0" in f.evidence
    assert "x = x.to(device)\nm = m.to(device)" in f.fix and "torch.device('cuda:0')" in f.fix


def test_non_scalar_backward_is_read_from_torchs_own_error() -> None:
    loss = nn.MSELoss(reduction="none")(torch.randn(8, 3, requires_grad=True), torch.randn(8, 3))
    try:
        loss.backward()
    except RuntimeError as exc:
        crash = Crash("RuntimeError", str(exc), Location(file="train.py", line=5), "per_item.backward()")
    f = _finding(crash, shape=tuple(loss.shape))
    assert "backward() was called on per_item, a tensor of shape [8, 3], not a scalar" in f.message
    assert "per_item.mean().backward()" in f.fix and "per_item.backward(gradient=" in f.fix


def test_grad_of_a_non_leaf_is_matched_on_the_error_that_follows_the_warning() -> None:
    x = torch.randn(3, requires_grad=True)
    hidden = x * 2
    hidden.sum().backward()
    with pytest.warns(UserWarning, match="not a leaf Tensor is being accessed"):
        grad = hidden.grad
    for expr in (lambda: grad.norm(), lambda: grad * 2):  # type: ignore[union-attr, operator]
        try:
            expr()
        except (AttributeError, TypeError) as exc:
            crash = Crash(
                type(exc).__name__, str(exc), Location(file="t.py", line=4), "n = hidden.grad.norm()"
            )
        f = _finding(crash, grad_is_leaf=False)
        assert f.message.startswith(f"The script raised {crash.type_name} before its first step: hidden.grad")
        assert "hidden.retain_grad()" in f.fix
        # a leaf's None .grad (frozen, unused, no backward yet) is not what retain_grad fixes
        assert "retain_grad" not in _finding(crash, grad_is_leaf=True).fix
    # a None that is not a .grad is not explained
    other = _finding(Crash("AttributeError", "'NoneType' object has no attribute 'x'", None, "y = cfg.x"))
    assert "retain_grad" not in other.message and not other.fix


def test_backward_through_a_freed_graph_is_read_from_torchs_own_error() -> None:
    w = torch.randn(3, requires_grad=True)
    loss = (w.exp() * 2).sum()
    loss.backward()
    try:
        loss.backward()
    except RuntimeError as exc:
        crash = Crash("RuntimeError", str(exc), Location(file="t.py", line=7), "total.backward()")
    f = _finding(crash)
    assert "backward went through a graph a second time" in f.message
    assert "total.backward(retain_graph=True)" in f.fix and "hidden = hidden.detach()" in f.fix


def test_cuda_checkpoint_on_cpu_is_read_from_torchs_own_error() -> None:
    try:
        torch.serialization.default_restore_location(torch.UntypedStorage(4), "cuda:0")
    except RuntimeError as exc:
        message = str(exc)
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: torch restores the storage instead of raising")
    crash = Crash("RuntimeError", message, Location(file="t.py", line=3), "sd = torch.load(args.ckpt)")
    f = _finding(crash)
    assert "holds CUDA tensors and this machine has no CUDA" in f.message
    assert f.fix.startswith('sd = torch.load(args.ckpt, map_location="cpu")')
    # the call already passes map_location (a CUDA string): the generic line
    crash.source_line = 'sd = torch.load(p, map_location="cuda")'
    assert _finding(crash).fix.startswith('torch.load(path, map_location="cpu")')


def test_default_group_not_initialized_asks_for_a_launcher_only_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        torch.distributed.get_rank()
    except ValueError as exc:
        message = str(exc)
    crash = Crash("ValueError", message, Location(file="train.py", line=6), "rank = dist.get_rank()")
    record = RunRecord(
        status="failed", error=f"ValueError: {message}", target={"script": "train.py", "args": []}
    )
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    bare = _finding(crash, record)
    assert "before init_process_group (train.py:6: rank = dist.get_rank())" in bare.message
    assert "scalpel launch --nproc N -- train.py" in bare.fix
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    launched = _finding(crash, record)
    assert "launcher" not in launched.message and "torchrun" not in launched.fix
    assert launched.fix.startswith("dist.init_process_group(")


def test_the_failing_frame_tells_a_non_leaf_from_a_leaf(tmp_path: Path) -> None:
    source = (
        "import torch\n"
        "w = torch.randn(3, requires_grad=True)\n"
        "frozen = torch.randn(3, requires_grad=True)\n"
        "h = w * 2\n"
        "h.sum().backward()\n"
        "print({}.grad.abs())\n"
    )
    for name, leaf in (("h", False), ("frozen", True)):
        with pytest.warns() if not leaf else contextlib.nullcontext():
            exc = _raise_from_user_file(tmp_path, source.format(name))
        rule = ScriptFailed()
        rule.on_script_error(exc)
        assert rule.grad_is_leaf is leaf
        (f,) = rule.findings(RunRecord(status="failed", error="AttributeError: x"))
        assert ("retain_grad" in f.fix) is (not leaf), f


def _compiled_crash(tmp_path: Path, body: str, call: str) -> Finding:
    """Run ``body`` then ``call`` from a user file under torch.compile (backend eager: no C++ compiler needed)."""
    exc = _raise_from_user_file(tmp_path, "import torch\n" + body + call)
    rule = ScriptFailed()
    rule.crash = crash_of(exc)
    (f,) = rule.findings(RunRecord(status="failed", error=f"{type(exc).__name__}: x"))
    return f


def test_untraceable_code_under_fullgraph_names_the_function_and_disables_it_there(tmp_path: Path) -> None:
    f = _compiled_crash(
        tmp_path,
        "def log_and_scale(x):\n    print('step')\n    return x * 2\n",
        "torch.compile(log_and_scale, fullgraph=True, backend='eager')(torch.ones(2))\n",
    )
    assert "torch.compile(fullgraph=True) met code it cannot trace at " in f.message
    assert (
        "train.py:3 (print('step'))" in f.message
        and "mark log_and_scale() with torch.compiler.disable" in f.message
    )
    assert f.fix.startswith("@torch.compiler.disable   # on log_and_scale()")
    assert any(e.endswith("train.py:3: print('step')") for e in f.evidence)


def test_a_branch_on_a_tensors_value_gets_torch_where(tmp_path: Path) -> None:
    f = _compiled_crash(
        tmp_path,
        "def step(x):\n    if x.sum().item() > 0:\n        return x + 1\n    return x\n",
        "torch.compile(step, fullgraph=True, backend='eager')(torch.ones(2))\n",
    )
    assert "a Python branch on a tensor's value" in f.message and "torch.where" in f.fix


def test_a_shape_error_met_while_tracing_is_the_scripts_own_and_runs_eagerly_to_show_it(
    tmp_path: Path,
) -> None:
    f = _compiled_crash(
        tmp_path,
        "def proj(x):\n    return torch.mm(x, torch.ones(3, 5))\n",
        "torch.compile(proj, backend='eager')(torch.ones(2, 2))\n",
    )
    assert "fails while torch.compile traces it with fake tensors" in f.message
    assert 'set_stance("force_eager")' in f.fix
    assert any("same reduction dim" in e for e in f.evidence)  # torch's own words about the shapes are kept


def test_the_recompile_limit_gets_dynamic_shapes_and_drop_last(tmp_path: Path) -> None:
    body = (
        "torch._dynamo.config.fail_on_recompile_limit_hit = True\n"
        "torch._dynamo.config.recompile_limit = 2\n"
        "def scale(x, n):\n    return x * n\n"
        "fn = torch.compile(scale, backend='eager', dynamic=False)\n"
    )
    try:
        f = _compiled_crash(tmp_path, body, "for i in range(5):\n    fn(torch.ones(i + 1), i)\n")
    finally:
        torch._dynamo.config.fail_on_recompile_limit_hit = False
        torch._dynamo.config.recompile_limit = 8
        torch._dynamo.reset()
    assert "recompiled more times than torch._dynamo.config.recompile_limit" in f.message
    assert "dynamic=True" in f.fix and "drop_last=True" in f.fix


def test_a_backend_without_a_cxx_compiler_asks_for_one() -> None:
    rule = ScriptFailed()
    rule.crash = Crash(
        "BackendCompilerFailed",
        "backend='inductor' raised:\nInvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx",
    )
    (f,) = rule.findings(RunRecord(status="failed", error="BackendCompilerFailed: x"))
    assert "needs a working C++ compiler" in f.message and "g++" in f.fix
    other = ScriptFailed()
    other.crash = Crash("BackendCompilerFailed", "backend='inductor' raised:\nAssertionError: lowering")
    (g,) = other.findings(RunRecord(status="failed", error="BackendCompilerFailed: x"))
    assert 'backend="aot_eager"' in g.message and "suppress_errors" in g.fix
