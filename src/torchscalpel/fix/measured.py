"""Whether a file is the code a run measured: its sha256 against the record's provenance (or this fix's
own earlier patch of that code, from the ``fix.json`` mark in the run folder), under the user's tree,
not an installed package's file. :mod:`torchscalpel.fix.stage` asks before it edits a file;
:mod:`torchscalpel.fix.verify` asks before it runs the script (:func:`checked_script`), so a record can
make ``--verify`` run nothing but the script the run measured.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.errors import UsageError
from torchscalpel.fix.files import inside
from torchscalpel.record import RunRecord
from torchscalpel.runtime.userframes import is_user_file

MARK_FILE = "fix.json"
"""Written in each run folder: the sha256 of each file before and after the patch, so that a later
``scalpel fix`` on the patched file knows it as this patch's result (and gives no diff) rather than
refusing it as a changed script."""


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded_hash(record: RunRecord, file: Path, script: Path) -> str | None:
    """The sha256 the run recorded for ``file`` (the script or a local module), None when it has none.
    Module paths are relative to the folder the run hashed them under (its git root, else the
    script's folder): read from the record only to match a hash, never to choose a file."""
    code = (record.provenance or {}).get("code") or {}
    if file.resolve() == script.resolve():
        return (code.get("script") or {}).get("sha256")
    recorded = ((record.provenance or {}).get("git") or {}).get("root")
    root = Path(recorded).resolve() if recorded else script.parent.resolve()
    rel = file.resolve().relative_to(root).as_posix() if file.resolve().is_relative_to(root) else None
    for entry in (code.get("modules") or {}).values():
        if entry.get("path") == rel:
            return entry.get("sha256")
    return None


def patched_hashes(run_dir: Path) -> set[str]:
    """The sha256 of each file this fix patched, from the mark in ``run_dir`` (none when unreadable)."""
    try:
        data = json.loads((run_dir / MARK_FILE).read_text(encoding="utf-8"))
        return {str(v["after"]) for v in data.get("files", {}).values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def check_file(record: RunRecord, run_dir: Path, file: Path, root: Path, script: Path) -> str:
    """Why ``file`` may not be edited ("" when it may); a file outside the tree or a changed script
    raises (refused in one sentence)."""
    inside(root, file)
    if not is_user_file(str(file)):
        return f"{file} is an installed package's file, not your code"
    if not file.is_file():
        raise UsageError(f"{file} no longer exists; fix edits the files the run measured.")
    want = recorded_hash(record, file, script)
    if want is None:
        return f"the run recorded no hash of {file.name}, so fix cannot tell it is the code it measured"
    have = sha256(file)
    if have != want and have not in patched_hashes(run_dir):
        raise UsageError(
            f"{file} changed since the run in {run_dir} measured it (its sha256 differs from the record's "
            "provenance); re-run that stage on the current code, then scalpel fix."
        )
    return ""


def checked_script(records: list[tuple[Path, RunRecord]], root: Path | None) -> tuple[RunRecord, Path]:
    """The script ``--verify`` runs, and its record: the script the first record that names one ran,
    under the user's tree and the file the run measured (or this fix's patch of it); refused in one
    sentence otherwise, so a record can make ``--verify`` run nothing but that script. ``records`` are
    the run folders and their records, ``root`` the user's tree."""
    # planned.py builds on libcst, which `scalpel fix` checks for (and names its extra) before this runs
    from torchscalpel.fix.planned import script_file

    found = next(((d, r, s) for d, r in records if (s := script_file(r)) is not None), None)
    if found is None or root is None:
        raise UsageError(
            "--verify needs the script the run measured, and the record does not say which it ran."
        )
    run_dir, record, script = found
    path = inside(root, script)
    if path.name.startswith("-"):  # it would reach python as an option, not a file
        raise UsageError(f"{script} is not a script name --verify can run; rename it, then re-run the stage.")
    why = check_file(record, run_dir, path, root, path)
    if why:
        raise UsageError(f"--verify runs only the script the run in {run_dir} measured, and {why}.")
    return record, path


@dataclass(frozen=True, slots=True)
class MarkItem:
    """One planned change as ``fix.json`` keeps it."""

    label: str
    source: str
    """``tune``, ``doctor``, ``memory`` or ``profile``: the stage whose run asked for it."""
    status: str
    """``patched``, ``already`` or ``not patched``."""
    where: str
    reason: str


@dataclass(frozen=True, slots=True)
class MarkRun:
    """A run the patch came from: its folder and what it measured (the patch header's lines)."""

    folder: str
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FixMark:
    """What ``fix.json`` says about the patch ``scalpel fix`` made from a run folder: the diff, where each
    planned change went, the runs and figures it came from, whether it was written and whether (and how)
    it was verified. Read by :func:`read_mark`; the fix page (``report/fix_sections``) draws it."""

    made: str
    patch: str
    items: tuple[MarkItem, ...]
    runs: tuple[MarkRun, ...]
    applied: bool
    verified: bool | None
    """True or False after ``--verify``; None when the patch was not verified."""
    verification: tuple[str, ...]
    """The verification's lines (its figures), empty when it was not run."""


MARK_TEXT_LIMIT = 4_000_000
"""Most characters of text ``fix.json`` may hold for the page (a diff of every file fix edits fits many
times over); a larger one is not drawn."""


def _strings(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return None
    return tuple(value)


def read_mark(run_dir: Path) -> FixMark | None:
    """The fix record in ``run_dir`` (``fix.json``), every field checked against its type; None when
    there is none, or when it is not one ``scalpel fix`` wrote (a file is data: a wrong shape is not
    drawn). A mark written before this record existed (``files`` only) is None too."""
    try:
        path = run_dir / MARK_FILE
        if path.stat().st_size > MARK_TEXT_LIMIT:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    patch, made, applied = data.get("patch"), data.get("made"), data.get("applied")
    raw_items, raw_runs, check = data.get("items"), data.get("runs"), data.get("verification")
    if not (
        isinstance(patch, str)
        and isinstance(made, str)
        and isinstance(applied, bool)
        and isinstance(raw_items, list)
        and isinstance(raw_runs, list)
        and (check is None or isinstance(check, dict))
    ):
        return None
    items = []
    for entry in raw_items:
        fields = [entry.get(k) if isinstance(entry, dict) else None for k in MarkItem.__slots__]
        texts = [f for f in fields if isinstance(f, str)]
        if len(texts) != len(fields):
            return None
        items.append(MarkItem(*texts))
    runs = []
    for entry in raw_runs:
        folder = entry.get("folder") if isinstance(entry, dict) else None
        lines = _strings(entry.get("lines")) if isinstance(entry, dict) else None
        if not isinstance(folder, str) or lines is None:
            return None
        runs.append(MarkRun(folder, lines))
    verified: bool | None = None
    verification: tuple[str, ...] = ()
    if check is not None:
        ok, lines = check.get("ok"), _strings(check.get("lines"))
        if not isinstance(ok, bool) or lines is None:
            return None
        verified, verification = ok, lines
    return FixMark(made, patch, tuple(items), tuple(runs), applied, verified, verification)
