"""docs/ARCHITECTURE.md's stage table is the code's: one row per ``scalpel`` verb, every name in it defined
where it says, every options class of the code in it, and each verb's CLI building its options through
``from_args``. Names are resolved from the sources (no import: serve's FastAPI need not be installed)."""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

from torchscalpel.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "torchscalpel"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _rows() -> dict[str, list[str]]:
    block = (
        DOC.read_text(encoding="utf-8")
        .split("<!-- stages:start -->", 1)[1]
        .split("<!-- stages:end -->", 1)[0]
    )
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| verb")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {c[0]: c[1:] for c in cells}


@cache
def _names_in(path: Path) -> frozenset[str]:
    """The names a module binds at its top level (definitions, assignments and imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(reference: str) -> bool:
    """``doctor.options.DoctorOptions``, ``report/html.write_report``, ``cli/env.py`` or ``report/launch_page``:
    the longest module prefix is a source file and the rest a name it binds at its top level."""
    parts = reference.removesuffix(".py").replace("/", ".").split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _names_in(path))
    return False


def _references(cell: str) -> list[str]:
    return [r for r in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[a-z_]+([./][a-z_A-Z]+)+(\.py)?", r)]


def _options_classes_in_code() -> set[str]:
    """``module.Class`` of every class that derives from StageOptions (the run window's own excepted)."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "StageOptions" for b in node.bases
            ):
                module = ".".join(path.relative_to(SRC).with_suffix("").parts)
                found.add(f"{module}.{node.name}")
    return found - {"runtime.window.StepWindow"}


def test_one_row_per_verb() -> None:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(_rows()) == sorted(verbs)


def test_every_name_in_the_table_is_defined_where_it_says() -> None:
    missing = [
        (verb, ref)
        for verb, cells in _rows().items()
        for cell in cells
        for ref in _references(cell)
        if not _resolves(ref)
    ]
    assert not missing, missing
    assert not _resolves("doctor.options.NoSuchOptions") and not _resolves(
        "report/nope.build"
    )  # the check bites


def test_every_options_class_is_in_the_table_and_its_cli_builds_it_with_from_args() -> None:
    named = {verb: _references(cells[0]) for verb, cells in _rows().items()}
    listed = {ref for refs in named.values() for ref in refs}
    in_code = _options_classes_in_code()
    assert in_code and in_code <= listed, sorted(in_code - listed)
    for verb, refs in named.items():
        for ref in refs:
            if ref in in_code:
                cli = (SRC / "cli" / f"{verb}.py").read_text(encoding="utf-8")
                assert f"{ref.rsplit('.', 1)[1]}.from_args(" in cli, (verb, ref)


def _stage_runs() -> dict[str, str]:
    """``verb -> module`` of every ``stages.<module>.run`` the run column names."""
    found = {}
    for verb, cells in _rows().items():
        for ref in _references(cells[1]):
            match = re.fullmatch(r"stages\.([a-z_]+)\.run", ref)
            if match:
                found[verb] = match.group(1)
    return found


def _run_shape(path: Path) -> str | None:
    """Why ``path`` does not have exactly one top-level ``run(options, *, progress=None)`` (None when it does)."""
    runs = [
        n
        for n in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "run"
    ]
    if len(runs) != 1:
        return f"{len(runs)} top-level run functions"
    args = runs[0].args
    if [a.arg for a in args.posonlyargs + args.args] != ["options"] or args.vararg or args.kwarg:
        return "run takes something besides options by position"
    if [a.arg for a in args.kwonlyargs] != ["progress"] or args.kw_defaults[0] is None:
        return "run's keywords are not (progress=...)"
    return None


def test_every_script_running_verb_has_one_stage_run_of_one_shape() -> None:
    runs = _stage_runs()
    assert {"profile", "doctor", "memory", "tune", "lr", "batch", "fix", "demo"} <= set(runs), runs
    problems = {verb: _run_shape(SRC / "stages" / f"{module}.py") for verb, module in runs.items()}
    assert not {v: p for v, p in problems.items() if p}, problems


def test_the_run_shape_check_bites(tmp_path: Path) -> None:
    for text in (
        "def run(options, *, progress=None): ...\ndef run(options, *, progress=None): ...\n",
        "def run(target, options, *, progress=None): ...\n",
        "def run(options, *, write_report=True): ...\n",
        "def run_lr(options, *, progress=None): ...\n",
    ):
        (tmp_path / "x.py").write_text(text)
        assert _run_shape(tmp_path / "x.py") is not None, text
    (tmp_path / "x.py").write_text("def run(options, *, progress=None): ...\n")
    assert _run_shape(tmp_path / "x.py") is None


_CLI_OWNS_NOTHING = re.compile(
    r"raise UsageError\(|default_run_dir\(|resolve_target\(|steps_arg\(|parse_size\("
)
"""What a verb's CLI module must not do once its stage has a ``run``: refuse a flag in its own words, name
the run folder, resolve the target, parse the window or a size (its options class's ``from_args`` does)."""


def test_the_cli_of_a_verb_with_a_stage_only_builds_options_and_calls_the_stage() -> None:
    offences = {}
    for verb, module in _stage_runs().items():
        text = (SRC / "cli" / f"{verb}.py").read_text(encoding="utf-8")
        found = _CLI_OWNS_NOTHING.findall(text)
        if found or f"stages import {module} as stage" not in text:
            offences[verb] = found or "does not call its stage"
    assert not offences, offences
    assert _CLI_OWNS_NOTHING.search('    raise UsageError("--x must be ...")')  # the check bites


def test_one_name_per_renderer_kind() -> None:
    """Every terminal renderer the table names is ``report/<verb>_terminal.render`` and every HTML sections builder
    ``report/<stage>_sections.build``; so is every such module in the code (no second spelling hides there)."""
    terminal, sections = [], []
    for cells in _rows().values():
        terminal += [r for r in _references(cells[2]) if r.startswith("report/")]
        sections += [r for r in _references(cells[3]) if "_sections" in r]
    assert len(terminal) >= 10 and len(sections) >= 8
    wrong = [r for r in terminal if not re.fullmatch(r"report/[a-z]+_terminal\.render", r)]
    wrong += [r for r in sections if not re.fullmatch(r"report/[a-z]+_sections\.build", r)]
    assert not wrong, wrong
    for path in sorted((SRC / "report").glob("*_terminal.py")) + sorted(
        (SRC / "report").glob("*_sections.py")
    ):
        name = "render" if path.stem.endswith("_terminal") else "build"
        assert name in _names_in(path), f"{path.name} has no {name}()"


_PRINTS = re.compile(r"\bprint\(|sys\.std(out|err)|make_console\(|console\(\)")
"""What a stage must not do: print, or open a console of its own (its CLI renders its result)."""


def _prints_in(path: Path) -> list[str]:
    """The lines of ``path`` (comments and docstrings aside) that print or open a console."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func) + "("
            if _PRINTS.search(text) or _PRINTS.search(ast.unparse(node)):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_a_stage_prints_nothing_its_cli_renders_the_result(tmp_path: Path) -> None:
    # the demo is the exception by design: it is a walk-through whose printed stages are what it hands over
    offences = [
        line
        for verb, module in _stage_runs().items()
        if verb != "demo"
        for line in _prints_in(SRC / "stages" / f"{module}.py")
    ]
    assert not offences, offences
    (tmp_path / "x.py").write_text(
        "import sys\ndef run(options, *, progress=None):\n    print('done', file=sys.stderr)\n"
    )
    assert _prints_in(tmp_path / "x.py")  # the check bites
