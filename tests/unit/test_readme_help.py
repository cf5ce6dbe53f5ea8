"""The README's ``scalpel --help`` block is the real help (issue 31: it had lost memory and compare), and the
epilog's workflow order names every step command."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from torchscalpel.cli.main import COMMANDS, build_parser, workflow_order

README = Path(__file__).resolve().parents[2] / "README.md"


def _help(columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    return out.getvalue()


def test_the_readme_help_block_is_the_real_help_at_100_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"```console\n\$ scalpel --help\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block, "README.md has no '$ scalpel --help' block"
    assert block.group(1).rstrip() == _help(100, monkeypatch).rstrip(), (
        "README's help block differs from `COLUMNS=100 scalpel --help`: paste the real output"
    )


def test_the_workflow_order_names_every_step_command() -> None:
    order = workflow_order()
    for command in COMMANDS:
        if command not in ("run", "report", "demo"):
            assert re.search(rf"\b{command}\b", order), (command, order)
    assert order.startswith("env, profile, doctor, memory, tune (then run)")


SCRIPT_COMMANDS = {
    "doctor": [],
    "memory": [],
    "tune": [],
    "run": ["--config", "scalpel.toml"],
    "lr": [],
    "batch": ["--sizes", "8,16"],
    "plan": [],
    "launch": ["--nproc", "2"],
}
"""Every command that runs a script, with the options it needs besides the script (profile alone profiles the
bundled example)."""


def test_every_command_that_runs_a_script_is_in_the_list() -> None:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    takes_a_script = {name for name, p in verbs.items() if any(a.dest == "target" for a in p._actions)}
    assert takes_a_script - {"profile"} | {"launch"} == set(SCRIPT_COMMANDS)


@pytest.mark.parametrize("command", sorted(SCRIPT_COMMANDS))
def test_a_missing_script_is_named_with_the_command_the_user_typed(
    command: str, capsys, tmp_path, monkeypatch
) -> None:
    # 'scalpel tune' said "e.g. 'scalpel profile -- train.py'"; 'scalpel plan' named no command at all, and
    # 'scalpel batch --sizes 8,16' gave an example without --sizes, which fails as written
    from torchscalpel.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "scalpel.toml").write_text('version = "1.0"\n[tune]\n')
    flags = SCRIPT_COMMANDS[command]
    assert main([command, *flags]) == 2
    err = capsys.readouterr().err
    example = " ".join(["scalpel", command, *flags]) if command == "batch" else f"scalpel {command}"
    assert f"e.g. '{example} " in err and "-- train.py" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
