"""The script-failed rule on its own: what it keeps of an exception, and the fixes it names (no script run)."""

from __future__ import annotations

from pathlib import Path

import torch

from torchscalpel.doctor.rules.rt_run import ScriptFailed, _load_call, crash_of, launcher_commands
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
