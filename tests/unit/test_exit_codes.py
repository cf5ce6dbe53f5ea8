"""README's exit-code table is the contract (issue 30, item 12): for every command of ``cli.main.COMMANDS``,
every bad command line of the kinds below exits with the documented code (2: "a bad flag, path or value
... one sentence on stderr, nothing run") with exactly one line on stderr and no traceback.

The cases are built from the parser itself, so a flag added later is covered: an unknown flag, each
value-taking flag without its value, each numeric, duration or size flag with a bad value, each ``--json``
given a folder; then per command a missing file and a file where a folder is expected (or the reverse).
Everything runs in-process and must fail before any process starts (tests/unit's guard enforces it).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from torchscalpel.cli.main import COMMANDS, build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
NUMERIC_TYPES = {"int", "float", "duration", "_sizes"}
BAD_VALUE = {"int": "x", "float": "x", "duration": "10 parsecs", "_sizes": "10M"}
MORE_BAD = {
    "int": ("99999999999999999999999",),
    "float": ("nan", "inf", "-1"),
    "duration": ("nan", "-5s"),
    "_sizes": ("-1GB",),
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _takes_script(sub: argparse.ArgumentParser) -> bool:
    return any(a.nargs == argparse.REMAINDER for a in sub._actions)


# The path a command's positional names, wrong in two ways: missing, and of the other kind.
PATH_CASES: dict[str, list[tuple[str, ...]]] = {
    "compare": [("compare", "{D}/missing", "{D}/missing2"), ("compare", "{F}", "{F}")],
    "analyze": [("analyze", "{D}/missing.json"), ("analyze", "{D}")],
    "serve": [("serve", "{D}/missing"), ("serve", "{F}")],
    "report": [("report", "{D}/missing"), ("report", "{D}")],
    "export": [
        ("export", "--model", "{D}/missing.py:f", "--example", "float32[1,8]"),
        ("export", "--model", "{D}:f", "--example", "float32[1,8]"),
    ],
}


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    cases: list[tuple[str, tuple[str, ...]]] = []
    for command, sub in _subparsers().items():
        tail: tuple[str, ...] = ("--", "{S}") if _takes_script(sub) else ()
        cases.append(("unknown flag", (command, "--no-such-flag", *tail)))
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue
            flag = max(action.option_strings, key=len)
            if action.nargs in (None, 1):
                cases.append(("missing value", (command, flag)))
            kind = getattr(action.type, "__name__", "")
            if kind in NUMERIC_TYPES:
                cases.append((f"bad {kind}", (command, flag, BAD_VALUE[kind], *tail)))
                for bad in MORE_BAD[kind]:
                    cases.append((f"bad {kind}", (command, f"{flag}={bad}", *tail)))
            if flag == "--json":
                cases.append(("--json a folder", (command, flag, "{D}", *tail)))
        if _takes_script(sub):
            cases.append(("missing script", (command, "--", "{D}/missing.py")))
            cases.append(("script a folder", (command, "--", "{D}")))
        for case in PATH_CASES.get(command, []):
            cases.append(("path", case))
    return cases


CASES = _cases()


def test_every_command_is_covered() -> None:
    assert {c[1][0] for c in CASES} == set(COMMANDS)


def test_the_readme_documents_exit_2_for_usage_errors() -> None:
    table = README.read_text(encoding="utf-8")
    assert re.search(r"^\| 2 \| a usage error: a bad flag, path or value", table, re.M), (
        "README's table changed"
    )


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("exit-codes")
    script = root / "train.py"
    script.write_text("raise SystemExit('the script must never run in a validation test')\n")
    afile = root / "file.json"
    afile.write_text('{"traceEvents": []}')
    folder = root / "folder"
    folder.mkdir()
    return {"{S}": str(script), "{F}": str(afile), "{D}": str(folder)}


@pytest.mark.parametrize("case", CASES, ids=[f"{kind}: {' '.join(argv)}" for kind, argv in CASES])
def test_bad_command_line_exits_2_with_one_line(
    case: tuple[str, tuple[str, ...]],
    places: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # default run folders land here, never in the checkout
    argv = list(case[1])
    for key, value in places.items():
        argv = [a.replace(key, value) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, f"exit {code}: {err}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert not (tmp_path / "scalpel-runs").exists(), "work started (a run folder was made) before the refusal"
