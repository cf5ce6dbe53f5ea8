"""run_script: the one way a target runs as ``__main__`` (session, ``scalpel run``, each launched rank).

Each :class:`ExecOptions` field has a test here that fails when the field is ignored, and each way a
script ends has the exit status ``python SCRIPT`` gives it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torchscalpel.distributed import rank_entry
from torchscalpel.runtime import collectives
from torchscalpel.runtime.script import ExecOptions, run_script
from torchscalpel.runtime.target import Target


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("pass\n", "complete", 0),
        ("raise SystemExit(0)\n", "complete", 0),
        ("import sys\nsys.exit()\n", "complete", 0),
        ("raise SystemExit(3)\n", "failed", 3),
        ("raise SystemExit('the data folder is empty')\n", "failed", 1),
        ("raise ValueError('bad batch')\n", "failed", 1),
        ("raise KeyboardInterrupt\n", "interrupted", 130),
    ],
)
def test_each_ending_gives_the_status_python_gives(tmp_path, capsys, body, status, code) -> None:
    outcome = run_script(Target(script=_script(tmp_path, body)))
    assert (outcome.status, outcome.exit_code) == (status, code)
    err = capsys.readouterr().err
    if "SystemExit('" in body:
        assert "the data folder is empty" in err  # python prints sys.exit's message to stderr
    if "ValueError" in body:
        assert outcome.error == "ValueError: bad batch"


def test_interrupt_raise_lets_ctrl_c_through(tmp_path) -> None:
    path = _script(tmp_path, "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        run_script(Target(script=path), ExecOptions(interrupt="raise"))


def test_an_unknown_interrupt_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="interrupt must be"):
        ExecOptions(interrupt="ignore")  # type: ignore[arg-type]


SEES = """
import json, sys
json.dump({"argv": sys.argv, "path0": sys.path[0]}, open(sys.argv[1], "w"))
"""


def test_the_script_sees_its_argv_and_folder_and_both_are_restored(tmp_path) -> None:
    path = _script(tmp_path, SEES)
    out = tmp_path / "seen.json"
    argv, sys_path = list(sys.argv), list(sys.path)
    outcome = run_script(Target(script=path, args=[str(out), "--lr", "1"]))
    assert outcome.exit_code == 0
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(path), str(out), "--lr", "1"], "path0": str(tmp_path.resolve())}
    assert sys.argv == argv and sys.path == sys_path


def test_restore_sys_false_leaves_the_scripts_argv_and_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = _script(tmp_path, "pass\n")
    run_script(Target(script=path, args=["x"]), ExecOptions(restore_sys=False))
    assert sys.argv == [str(path), "x"] and sys.path[0] == str(tmp_path.resolve())


def test_a_failing_script_restores_too(tmp_path) -> None:
    argv, sys_path = list(sys.argv), list(sys.path)
    run_script(Target(script=_script(tmp_path, "raise RuntimeError('x')\n")))
    assert sys.argv == argv and sys.path == sys_path


class _Stop(BaseException):
    pass


def test_passthrough_exceptions_reach_the_caller_after_the_restore(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "_Stop", _Stop)
    path = _script(tmp_path, f"import {__name__} as t\nraise t._Stop()\n")
    argv, sys_path = list(sys.argv), list(sys.path)
    with pytest.raises(_Stop):
        run_script(Target(script=path), ExecOptions(passthrough=(_Stop,)))
    assert sys.argv == argv and sys.path == sys_path
    # Without it the same exception is the script's failure (python would print it and exit 1).
    assert run_script(Target(script=path)).exit_code == 1


def test_before_runs_first_inside_the_guard(tmp_path, capsys) -> None:
    calls: list[str] = []
    path = _script(tmp_path, "import sys\nprint('script ran', file=sys.stderr)\n")
    assert run_script(Target(script=path), before=lambda: calls.append("before")).exit_code == 0
    assert calls == ["before"] and "script ran" in capsys.readouterr().err

    def broken() -> None:
        raise RuntimeError("a set-up hook failed")

    outcome = run_script(Target(script=path), before=broken)
    assert outcome.status == "failed" and outcome.error == "RuntimeError: a set-up hook failed"
    assert "script ran" not in capsys.readouterr().err


def test_a_module_runs_with_its_package_importable(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nraise SystemExit(int(sys.argv[1]))\n")
    monkeypatch.chdir(tmp_path)
    assert run_script(Target(module="proj.train", args=["4"])).exit_code == 4


RAISES = """
def inner():
    raise ValueError("bad batch")

inner()
"""


def test_the_traceback_is_the_scripts_own(tmp_path, capsys) -> None:
    run_script(Target(script=_script(tmp_path, RAISES)))
    err = capsys.readouterr().err
    files = [line.split('"')[1] for line in err.splitlines() if line.strip().startswith('File "')]
    assert files and set(files) == {str(tmp_path.resolve() / "train.py")}, err
    assert err.rstrip().endswith("ValueError: bad batch")


def test_a_rank_keeps_ctrl_c_and_marks_itself_finished(tmp_path, monkeypatch) -> None:
    finished: list[bool] = []
    monkeypatch.setattr(collectives, "mark_finished", lambda: finished.append(True))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert rank_entry.exec_target(["--", str(_script(tmp_path, "raise SystemExit(3)\n"))]) == 3
    with pytest.raises(KeyboardInterrupt):
        rank_entry.exec_target([str(_script(tmp_path, "raise KeyboardInterrupt\n", "stop.py"))])
    assert finished == [True, True]
    assert sys.argv == [str(tmp_path / "stop.py")]  # a rank's process ends with the script: nothing restored


def test_a_rank_runs_the_scalpel_program(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert rank_entry.run_program(["run", "--config", str(tmp_path / "missing.toml"), "--", "x.py"]) == 2
    assert rank_entry.run_program(["--version"]) == 0
