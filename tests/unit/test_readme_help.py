"""The README's ``scalpel --help`` block is the real help (issue 31: it had lost memory and compare), and the
epilog's workflow order names every step command."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    "command", ["tune", "doctor", "memory"]
)  # profile alone profiles the bundled example
def test_a_missing_script_is_named_with_the_command_the_user_typed(command: str, capsys) -> None:
    from torchscalpel.cli.main import main

    assert main([command]) == 2
    err = capsys.readouterr().err
    assert f"e.g. 'scalpel {command} -- train.py" in err and "Traceback" not in err
