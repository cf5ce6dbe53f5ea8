"""``scalpel doctor`` on scripts that fail: the failure is the first finding (``script-failed``), with the
exception, the script's own line and the fix where known; the exit code is the script's own; no
"No findings", no "next: scalpel tune", and no torchscalpel frame in what the user reads.

Scripts in the styles that showed it: pytorch/examples word_language_model (whole-model save, reloaded
under torch 2.6+'s ``weights_only=True`` default), the DDP tutorial's ``multigpu_torchrun.py`` run
without a launcher, and scripts that never reach a step (a syntax error, an import of NVIDIA apex).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from helpers import cli_env, run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env() -> dict[str, str]:
    env = cli_env()
    for name in LAUNCHER_VARS:  # run as 'python SCRIPT' is: no launcher
        env.pop(name, None)
    return env


def _python(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _doctor(
    tmp_path: Path, script: Path, *args: str, flags: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "findings.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchscalpel",
            "doctor",
            "--no-report",
            "--out",
            str(tmp_path / "run"),
            "--json",
            str(out),
            *flags,
            "--",
            str(script),
            *args,
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def _line_of(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def _no_next_tune(proc: subprocess.CompletedProcess[str]) -> None:
    assert "No findings" not in proc.stdout and "scalpel tune" not in proc.stdout, proc.stdout
    assert "next: fix the failure above, then run the doctor again" in proc.stdout, proc.stdout


def _no_scalpel_frames(stderr: str) -> None:
    frames = [line for line in stderr.splitlines() if line.lstrip().startswith('File "')]
    assert not [f for f in frames if "torchscalpel" in f or "runpy" in f], stderr


def test_weights_only_load_crash_is_the_first_finding_with_the_allowlist_fix(tmp_path: Path) -> None:
    script = FIXTURES / "script_failed_weights_only_load.py"
    plain = _python(script, cwd=tmp_path)
    proc, data = _doctor(tmp_path, script)
    assert plain.returncode == 1 and "UnpicklingError" in plain.stderr
    assert proc.returncode == plain.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = data["findings"][0]
    assert first["rule"] == "script-failed" and first["severity"] == "error", data["findings"]
    assert "UnpicklingError" in first["message"] and "__main__.RNNModel" in first["message"]
    assert "after 30 step(s)" in first["message"]
    assert first["location"]["file"] == str(script) and first["location"]["line"] == _line_of(
        script, "model = torch.load(f)"
    )
    assert "torch.serialization.add_safe_globals([RNNModel])" in first["fix"]
    assert "model = torch.load(f, weights_only=False)" in first["fix"] and "trust" in first["fix"]
    assert data["status"] == "failed" and data["counts"]["error"] >= 1
    _no_next_tune(proc)
    _no_scalpel_frames(proc.stderr)


def test_ddp_script_without_a_launcher_gets_the_launch_command_with_its_own_arguments(tmp_path: Path) -> None:
    script = FIXTURES / "script_failed_no_launcher.py"
    args = ("50", "10", "--batch_size", "32", "--snapshot_path", "my run/snapshot.pt")
    plain = _python(script, *args, cwd=tmp_path)
    proc, data = _doctor(tmp_path, script, *args)
    assert plain.returncode == 1 and "RANK expected" in plain.stderr
    assert proc.returncode == plain.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    (failed,) = [f for f in data["findings"] if f["rule"] == "script-failed"]
    assert failed is data["findings"][0] or data["findings"][0]["rule"] == "script-failed"
    assert failed["message"].startswith("The script raised ValueError before its first step")
    assert failed["location"]["line"] == _line_of(script, 'init_process_group(backend="gloo")')
    command = shlex.join([str(script), *args])  # the arguments verbatim, the one with a space quoted
    assert "'my run/snapshot.pt'" in command
    for launcher in (
        f"scalpel launch --nproc N -- {command}",
        f"torchrun --nproc-per-node N {command}",
        f"scalpel doctor --nproc N -- {command}",
    ):
        assert launcher in failed["fix"], failed["fix"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert f"scalpel doctor --nproc N -- {command}" in record["sections"]["doctor"]["hint"]
    _no_next_tune(proc)


def test_script_exit_code_wins_over_fail_on(tmp_path: Path) -> None:
    # The same tutorial script without its positional arguments: argparse exits 2 before any step.
    script = FIXTURES / "script_failed_no_launcher.py"
    plain = _python(script, cwd=tmp_path)
    proc, data = _doctor(tmp_path, script, flags=("--fail-on", "error"))
    assert plain.returncode == 2 and proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    first = data["findings"][0]
    assert first["rule"] == "script-failed"
    assert first["message"] == "The script exited with code 2 before its first step."
    assert first["location"]["line"] == _line_of(script, "args = parser.parse_args()")
    assert "the following arguments are required" in proc.stderr
    _no_next_tune(proc)


SYNTAX_ERROR_TRAIN = """\
import torch
from torch import nn

model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,))).backward()
    optimizer.step()
"""

APEX_TRAIN = """\
import torch
from torch import nn
from apex import amp

model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
"""


def test_failures_before_the_first_step_are_one_sentence_without_scalpel_frames(tmp_path: Path) -> None:
    for name, source, kind, line in (
        ("train_typo.py", SYNTAX_ERROR_TRAIN, "SyntaxError", 6),
        ("train_apex.py", APEX_TRAIN, "ModuleNotFoundError", 3),
    ):
        script = tmp_path / name
        script.write_text(source)
        plain = _python(script, cwd=tmp_path)
        proc, data = _doctor(tmp_path, script)
        assert proc.returncode == plain.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        # The traceback the user reads is python's own, line for line: no torchscalpel or runpy frame.
        assert proc.stderr == plain.stderr, (proc.stderr, plain.stderr)
        _no_scalpel_frames(proc.stderr)
        (failed,) = data["findings"]
        assert failed["rule"] == "script-failed" and failed["severity"] == "error"
        assert failed["message"].startswith(f"The script raised {kind} before its first step: ")
        assert failed["message"].count(". ") <= 1 and "\n" not in failed["message"], failed["message"]
        assert failed["location"] == {"file": str(script), "line": line, "column": None}
        if kind == "ModuleNotFoundError":
            assert "No module named 'apex'" in failed["message"] and "pip install" in failed["fix"]
        _no_next_tune(proc)
        assert os.path.exists(tmp_path / "run" / "run.json")


def _failed(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """``scalpel doctor`` (no launcher) on the fixture ``name``: its ``script-failed`` finding, which comes first."""
    script = FIXTURES / name
    proc, data = _doctor(tmp_path, script)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = data["findings"][0]
    assert first["rule"] == "script-failed" and first["severity"] == "error", data["findings"]
    assert first["location"]["file"] == str(script)
    _no_next_tune(proc)
    return script, first


def test_device_mismatch_names_both_devices_the_models_and_the_inputs_to_move(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_device_mismatch.py")
    assert "an operation got tensors on two devices, cpu and meta" in f["message"]
    assert "model's device (meta)" in f["message"]
    assert f["location"]["line"] == _line_of(script, "logits = model(x)")
    assert "the model's parameters are on meta" in f["evidence"]
    assert "the tensors this line passes, x: the one on cpu is among them" in f["evidence"]
    assert f["fix"].startswith("# device: the script's own variable, where the model is (meta)")
    assert "x = x.to(device)" in f["fix"]


def test_backward_on_a_non_scalar_names_the_shape_and_the_reduction(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_backward_non_scalar.py")
    assert "backward() was called on loss, a tensor of shape [32], not a scalar" in f["message"]
    assert f["location"]["line"] == _line_of(script, "    loss.backward()")
    assert "loss has shape [32]" in f["evidence"]
    assert (
        "loss.mean().backward()" in f["fix"] and "loss.backward(gradient=torch.ones_like(loss))" in f["fix"]
    )


def test_grad_of_a_non_leaf_names_the_tensor_and_retain_grad(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_non_leaf_grad.py")
    assert "normed.grad is None: normed is not a leaf tensor" in f["message"]
    assert f["location"]["line"] == _line_of(script, "saliency = normed.grad.abs()")
    assert f["fix"].startswith("normed.retain_grad()")


def test_backward_through_a_freed_graph_says_to_detach_the_carried_state(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_backward_twice_rnn.py")
    assert "backward went through a graph a second time" in f["message"] and "hidden state" in f["message"]
    assert "after 1 step(s)" in f["message"] or "after 2 step(s)" in f["message"]
    assert f["location"]["line"] == _line_of(script, "    loss.backward()")
    assert "hidden = hidden.detach()" in f["fix"] and "loss.backward(retain_graph=True)" in f["fix"]


def test_cuda_checkpoint_on_a_cpu_machine_gets_map_location_at_the_users_load(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_cuda_checkpoint_on_cpu.py")
    assert "the checkpoint holds CUDA tensors and this machine has no CUDA" in f["message"]
    assert f["location"]["line"] == _line_of(script, "model.load_state_dict(torch.load(ckpt_path))")
    assert 'model.load_state_dict(torch.load(ckpt_path, map_location="cpu"))' in f["fix"]


def test_get_rank_before_init_without_a_launcher_names_the_line_and_the_launcher(tmp_path: Path) -> None:
    script, f = _failed(tmp_path, "script_failed_get_rank_before_init.py")
    line = _line_of(script, "rank = dist.get_rank()")
    assert "a torch.distributed call ran before init_process_group" in f["message"]
    assert f"script_failed_get_rank_before_init.py:{line}: rank = dist.get_rank()" in f["message"]
    assert f["location"]["line"] == line
    assert "RANK/WORLD_SIZE are unset: no launcher" in f["evidence"]
    assert f["fix"].startswith("dist.init_process_group(") and "scalpel launch --nproc N --" in f["fix"]


def test_get_rank_before_init_under_a_launcher_does_not_ask_for_a_launcher(tmp_path: Path) -> None:
    script = FIXTURES / "script_failed_get_rank_before_init.py"
    out = tmp_path / "findings.json"
    launcher = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    launcher |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}
    proc = run_cli(
        "doctor",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(out),
        "--",
        str(script),
        cwd=tmp_path,
        **launcher,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (f,) = [f for f in json.loads(out.read_text())["findings"] if f["rule"] == "script-failed"]
    assert "a torch.distributed call ran before init_process_group" in f["message"]
    assert "launcher" not in f["message"] and "scalpel launch" not in f["fix"] and "torchrun" not in f["fix"]
    assert any("the launcher is there, the init call is missing or late" in e for e in f["evidence"])
