"""``scalpel fix``: the edits tune, doctor and memory runs ask for, made on the user's own files, as one diff.

:func:`run` reads the records, plans the edits (:mod:`torchscalpel.fix.locate`, :mod:`torchscalpel.fix.memory_plan`), checks that every file
is the one the run measured (its sha256 in the record's provenance) and lies in the user's tree (decided
from where fix runs, :mod:`torchscalpel.fix.files`), makes the edits on the text
(:mod:`torchscalpel.fix.edits`), and returns the diff. Each record is checked before anything is planned
from it (:mod:`torchscalpel.fix.record_values`): a record is data, never code. ``--apply`` writes every
file only after every edit succeeded (temporary files first, then one rename each);
``--verify`` re-runs the patched copy (:mod:`torchscalpel.fix.verify`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fix.diff import patch_text
from torchscalpel.fix.files import encode_source, read_source, user_tree
from torchscalpel.fix.measured import MARK_FILE, check_file, checked_script, recorded_hash, sha256
from torchscalpel.fix.options import FixOptions
from torchscalpel.fix.record_values import RecordValueError, check_record
from torchscalpel.record import RunRecord, load_record
from torchscalpel.sections import DoctorSection, TuneSection


@dataclass(slots=True)
class Item:
    """One planned change and what became of it."""

    label: str
    source: str
    status: str
    """``patched``, ``already`` (the code already does it) or ``not patched``."""
    where: str = ""
    reason: str = ""
    snippet: str = ""
    rule: str = ""


@dataclass(slots=True)
class FixResult:
    """What :func:`run` made: the diff, each item's fate, the files' contents before and after."""

    patch: str
    items: list[Item]
    root: Path | None
    """The user's tree (:func:`torchscalpel.fix.files.user_tree`): every changed file lies under it."""
    changes: dict[Path, tuple[str, str]] = field(default_factory=dict)
    records: list[tuple[Path, RunRecord]] = field(default_factory=list)
    applied: bool = False
    verification: Any = None
    encodings: dict[Path, str] = field(default_factory=dict)
    """Each read file's declared encoding (PEP 263): what its patched text is written back in."""

    def new_bytes(self, path: Path) -> bytes:
        """The patched file's bytes, in the encoding the file declares."""
        return encode_source(path, self.changes[path][1], self.encodings.get(path, "utf-8"))


def _require_libcst() -> None:
    try:
        import libcst  # noqa: F401
    except ImportError:
        raise UsageError(
            "scalpel fix edits your code with libcst, which is not installed; run: pip install 'torchscalpel[fix]'."
        ) from None


def _record_dir(path: Path) -> Path:
    return path.parent if path.is_file() else path


def load_checked(path: Path) -> RunRecord:
    """The record at ``path`` (a run folder or its run.json), every value fix reads checked
    (:func:`torchscalpel.fix.record_values.check_record`); refused in one sentence naming the field."""
    record = load_record(path)
    try:
        check_record(record)
    except RecordValueError as exc:
        source = path / "run.json" if path.is_dir() else path
        raise UsageError(
            f"{source}: {exc}; scalpel fix reads a record as data and refuses one it cannot check "
            "(nothing was run or written)."
        ) from None
    return record


def _line_map(run_dir: Path, path: Path, recorded: str | None) -> Any:
    """The line map of this fix's own earlier patch of ``path`` (:mod:`torchscalpel.fix.linemap`),
    when the file is that patch's result of the very code the run measured; None otherwise."""
    try:
        data = json.loads((run_dir / MARK_FILE).read_text(encoding="utf-8"))
        entry = data["files"][str(path)]
        if (
            entry["before"] == recorded
            and entry["after"] == sha256(path)
            and entry["before"] != entry["after"]
        ):
            return [int(n) for n in entry["lines"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        pass
    return None


def _text(record: RunRecord, run_dir: Path, file: Path, root: Path, script: Path | None) -> str | None:
    """``file``'s text when fix may edit it (None otherwise: its item then says why)."""
    if script is None or check_file(record, run_dir, file, root, script):
        return None
    return read_source(file.resolve())[0]


def _header(records: list[tuple[Path, RunRecord]], items: list[Item]) -> list[str]:
    lines = ["scalpel fix: the change measured by the runs below, as an edit of your code."]
    for run_dir, record in records:
        lines.extend(run_lines(run_dir, record, items))
    for item in items:
        if item.status == "not patched":
            lines.append(f"not patched: {item.label}: {item.reason}")
    return lines


def run_lines(run_dir: Path, record: RunRecord, items: list[Item]) -> list[str]:
    """What the patch came from in one run: the run (its folder, name, torch, machine), the figures it
    measured for what was patched (tune's speedup, the findings fixed, the memory crossing and the rung's
    plan peak), and the command that reproduces it. The patch's header and the fix page both show these."""
    from torchscalpel.fix.memory_plan import header_lines as memory_header
    from torchscalpel.tune.speedup import speedup_of

    env = record.environment or {}
    gpus = env.get("gpus") or []
    cpu = env.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}  # shown only: a record of any shape reads
    machine = (
        ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus)
        if isinstance(gpus, list) and gpus
        else f"CPU {cpu.get('model', '?')}, {cpu.get('usable_cores', '?')} cores"
    )
    lines = [f"run: {run_dir} ({record.name}, torch {env.get('torch', '?')}, {machine})"]
    tune = record.section(TuneSection)
    if tune is not None and tune.winner:
        lines.append(f"measured: {speedup_of(tune.winner).sentence()}")
    doctor = record.section(DoctorSection)
    if doctor is not None:
        fixed = sorted({i.rule for i in items if i.source == "doctor" and i.status == "patched"})
        if fixed:
            lines.append(f"findings fixed: {', '.join(fixed)}")
    lines.extend(
        memory_header(record, {i.rule for i in items if i.source == "memory" and i.status == "patched"})
    )
    if record.command:
        lines.append(f"reproduce: {' '.join(record.command)}")
    return lines


def plan_and_edit(options: FixOptions) -> FixResult:
    """Read the records and make every edit on the text; touch no file."""
    from torchscalpel.fix.doctor_plan import doctor_plan
    from torchscalpel.fix.edits import apply_edit
    from torchscalpel.fix.linemap import LineMap, remap
    from torchscalpel.fix.locate import tune_plan
    from torchscalpel.fix.memory_plan import first_placed, has_memory, memory_plan
    from torchscalpel.fix.planned import script_file
    from torchscalpel.fix.profile_plan import attention_plan

    root = user_tree(options.cwd or Path.cwd())
    records = [(_record_dir(r), load_checked(r)) for r in options.run_dirs]
    items: list[Item] = []
    texts: dict[Path, str] = {}
    originals: dict[Path, str] = {}
    encodings: dict[Path, str] = {}
    line_maps: dict[Path, LineMap | None] = {}

    def edit_all(planned: list[Any], record: RunRecord, run_dir: Path, script: Path | None) -> list[Item]:
        """Make each planned edit on the current texts, in order; each item says what became of it."""
        made: list[Item] = []
        for p in planned:
            item = Item(p.label, p.source, "not patched", reason=p.reason, snippet=p.snippet, rule=p.rule)
            made.append(item)
            if p.done:
                item.status = "already"
                continue
            if p.edit is None or p.file is None:
                continue
            if script is None:
                item.reason = "the record does not say which script it ran"
                continue
            why = check_file(record, run_dir, p.file, root, script)
            if why:
                item.reason = why
                continue
            path = p.file.resolve()
            if path not in texts:
                originals[path], encodings[path] = read_source(path)
                texts[path] = originals[path]
                line_maps[path] = _line_map(run_dir, path, recorded_hash(record, path, script))
            ops = line_maps[path]
            edit = remap(p.edit, ops) if ops else p.edit
            new, outcome = apply_edit(texts[path], edit)
            item.where = f"{path.name}:{p.edit.line}" if p.edit.line else path.name
            if outcome.status == "refused":
                item.reason = outcome.reason
            else:
                texts[path] = new
                # Done by an earlier edit of this run (a companion: whole-model-save's readers) is
                # patched by this patch, not something the code already did.
                done_here = outcome.status == "already" and texts[path] != originals[path]
                if done_here and apply_edit(originals[path], edit)[1].status != "applied":
                    done_here = False
                item.status = "patched" if outcome.status == "applied" or done_here else "already"
        return made

    for run_dir, record in records:
        if (
            record.section(TuneSection) is None
            and record.section(DoctorSection) is None
            and not has_memory(record)
            and not attention_plan(record)
        ):
            raise UsageError(
                f"{run_dir} holds no tune, doctor or memory results; scalpel fix reads 'scalpel tune', "
                "'scalpel doctor' and 'scalpel memory' runs (and 'scalpel profile' runs that found unfused attention)."
            )
        script = script_file(record)
        planned = tune_plan(record) + doctor_plan(record) + attention_plan(record)
        # memory: the ladder's first fitting rung whose edit the file takes, tried on its current text
        planned += first_placed(
            memory_plan(record), functools.partial(_text, record, run_dir, root=root, script=script)
        )
        # Edits lower in a file first, so that each recorded line still means the same line.
        planned.sort(key=lambda p: (str(p.file), -(p.edit.line if p.edit else 0)))
        state = (dict(texts), dict(originals), dict(encodings), dict(line_maps))
        done = edit_all(planned, record, run_dir, script)
        refused = [i for i in done if i.source == "tune" and i.status == "not patched"]
        if refused and any(i.source == "tune" and i.status == "patched" for i in done):
            # A part of tune's winner that its file did not take (a line that no longer holds what the run
            # saw, a file without its recorded hash) leaves the rest another configuration than the one
            # measured: the winner is patched whole or not at all. Its parts are undone and each says why.
            texts.clear()
            texts.update(state[0])
            originals.clear()
            originals.update(state[1])
            encodings.clear()
            encodings.update(state[2])
            line_maps.clear()
            line_maps.update(state[3])
            done = edit_all([p for p in planned if p.source != "tune"], record, run_dir, script)
            why = "; ".join(f"{i.label}: {i.reason}" for i in refused)
            for p in planned:
                if p.source == "tune":
                    reason = next((i.reason for i in refused if i.label == p.label), "")
                    done.append(
                        Item(
                            p.label,
                            "tune",
                            "not patched",
                            reason=reason
                            or f"a part of tune's winner could not be placed ({why}), and fix patches no part "
                            "of a winner alone",
                            snippet=p.snippet,
                            rule=p.rule,
                        )
                    )
        items += done
    changes = {p: (originals[p], texts[p]) for p in texts if texts[p] != originals[p]}
    result = FixResult(
        patch="", items=items, root=root, changes=changes, records=records, encodings=encodings
    )
    for path in changes:
        result.new_bytes(path)  # an edit its file's encoding cannot hold is refused before any output
    result.patch = render_patch(result)
    return result


def render_patch(result: FixResult, extra: list[str] | None = None) -> str:
    """The patch text: the header (plus ``extra`` lines, the verification) and the diffs."""
    if not result.changes or result.root is None:
        return ""
    return patch_text(
        [*_header(result.records, result.items), *(extra or [])],
        result.changes,
        result.root,
        result.encodings,
    )


def write_patch(path: Path, patch: str) -> None:
    """Write the patch text as bytes: each file's hunks in that file's own encoding (see
    :func:`torchscalpel.fix.diff.patch_text`), as ``git diff`` writes them."""
    from torchscalpel.fileio import atomic_write_text

    atomic_write_text(path, patch, errors="surrogateescape")


def _dirty(root: Path) -> bool:
    """True when git knows uncommitted changes to tracked files under ``root``."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def write_all(result: FixResult) -> None:
    """Write every changed file in its own encoding, all or none: each to a temporary file beside it
    first, then the renames."""
    staged: list[tuple[str, Path]] = []
    data = {path: result.new_bytes(path) for path in result.changes}
    try:
        for path, after in data.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".scalpel-fix", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(after)
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            staged.append((tmp, path))
    except OSError as exc:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise ScalpelError(f"could not write the patched files ({exc}); nothing was changed.") from None
    for tmp, path in staged:
        os.replace(tmp, path)


def mark_result(result: FixResult) -> None:
    """Record, in every run folder (best effort: a read-only folder is fine), each file's before/after
    hash and where each of its lines went (what a later ``scalpel fix`` reads), and the fix itself: the
    diff, each planned change's fate, what each run measured, whether the files were written and the
    verification's lines (:class:`torchscalpel.fix.measured.FixMark`, what the fix page draws)."""
    from datetime import datetime, timezone

    from torchscalpel.fix.linemap import line_map

    files = {
        str(p): {
            "before": hashlib.sha256(encode_source(p, b, result.encodings.get(p, "utf-8"))).hexdigest(),
            "after": hashlib.sha256(result.new_bytes(p)).hexdigest(),
            "lines": line_map(b, a),
        }
        for p, (b, a) in result.changes.items()
    }
    check = result.verification
    mark = {
        "files": files,
        "made": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "patch": result.patch,
        "items": [
            {"label": i.label, "source": i.source, "status": i.status, "where": i.where, "reason": i.reason}
            for i in result.items
        ],
        "runs": [
            {"folder": str(run_dir), "lines": run_lines(run_dir, record, result.items)}
            for run_dir, record in result.records
        ],
        "applied": result.applied,
        "verification": None if check is None else {"ok": bool(check.ok), "lines": list(check.lines())},
    }
    for run_dir, _ in result.records:
        try:
            (run_dir / MARK_FILE).write_text(json.dumps(mark, indent=1), encoding="utf-8")
        except OSError:
            pass


def run(options: FixOptions) -> FixResult:
    """Plan, edit, and then (as asked) write the patch file, apply, verify."""
    _require_libcst()
    result = plan_and_edit(options)
    if options.verify and result.changes:
        checked_script(result.records, result.root)  # refused before anything is written or run
    if result.changes:
        mark_result(result)
    if options.apply and result.changes and not options.force:
        assert result.root is not None
        if _dirty(result.root):  # asked before the verification's minutes, not after
            raise UsageError(
                f"the git tree at {result.root} has uncommitted changes; commit them first, or pass --force to apply anyway."
            )
    if options.verify and result.changes:
        from torchscalpel.fix.verify import verify

        result.verification = verify(result, options)
        # The reviewer reads the re-measurement beside tune's figure, in the patch itself.
        lines = [line for line in result.verification.lines() if not line.startswith("copies in")]
        result.patch = render_patch(result, [f"verify: {line}" for line in lines])
    if options.patch is not None:
        write_patch(options.patch, result.patch)
    if options.apply and result.changes:
        write_all(result)
        result.applied = True
    if result.changes and (result.applied or result.verification is not None):
        mark_result(result)  # again: what was written and what the verification measured
    return result
