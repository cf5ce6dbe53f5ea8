"""``scalpel fix --verify``: the patch applied to a copy of the script's folder and re-run.

- The patched script runs under plain ``python`` (no scalpel hooks): it must exit 0. When that first
  start wrote files into its copy (a checkpoint, a vocabulary, a log: anything but caches), it starts a
  second time in the same copy and must exit 0 again: a script that resumes from what it saved runs a
  path on its next start that its first never ran. A start that fails prints the script's own last
  lines (its exception).
- Losses: the first steps' losses of the original and the patched copy, each from a fresh copy under
  plain python, through tune's numerics gate (:mod:`torchscalpel.fix.verify_losses`).
- Doctor edits: ``scalpel doctor`` on the patched copy; each fixed rule's finding must be gone and no
  rule may report that did not report before.
- Tune edits: the original and the patched copy are timed in turn under plain python, each in a
  fresh process (``--pairs`` interleaved pairs, :mod:`torchscalpel.fix.verify_tune`); the ratio is
  tune's own speedup definition over the pairs, judged against the ratio and spread tune confirmed
  (:mod:`torchscalpel.fix.judge`: below the spread's low end fails).
- Memory edits: ``scalpel memory`` on the patched copy with the original run's limit must not cross it
  (:mod:`torchscalpel.fix.verify_memory`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.console import Phase
from torchscalpel.fix.verify_tree import Tree
from torchscalpel.fix.verify_tune import WARMUP_STEPS
from torchscalpel.sections import DoctorSection, TuneSection
from torchscalpel.tune.verify import GATE_STEPS

if TYPE_CHECKING:
    from torchscalpel.fix.judge import Judgement
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.fix.stage import FixResult
    from torchscalpel.tune.speedup import Speedup

RUN_TIMEOUT_S = 600
"""A re-run is stopped after this long: a real training script may run for hours under plain python."""
TIMED_OUT = 124
ERROR_LINES = 8
"""At most this many of a failed start's last stderr lines are shown (its last frame and exception)."""
SHOWN_FILES = 3
"""Files named in the line that says why a second start was run (then ``and N more``)."""


@dataclass(slots=True)
class Start:
    """One plain-python start of the patched script."""

    rc: int
    error: list[str] = field(default_factory=list)
    """Its last stderr lines when it failed."""
    wrote: list[str] = field(default_factory=list)
    """Files it created or changed in the copy (relative paths)."""


@dataclass(slots=True)
class Verification:
    """What the re-run showed."""

    notes: list[str] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    """The patched script's plain-python starts: one, or two when the first wrote files."""
    losses: str = ""
    """The loss comparison's line (:mod:`torchscalpel.fix.verify_losses`)."""
    findings_gone: list[str] = field(default_factory=list)
    findings_left: list[str] = field(default_factory=list)
    findings_new: list[str] = field(default_factory=list)
    speedup: Speedup | None = None
    """Patched against original: interleaved fresh plain-python processes, whole steps (tune's definition)."""
    tune_speedup: Speedup | None = None
    """What tune confirmed, for comparison."""
    judgement: Judgement | None = None
    """The verdict on ``speedup`` against ``tune_speedup`` (:func:`torchscalpel.fix.judge.judge`)."""
    ok: bool = False

    def lines(self) -> list[str]:
        """The verdict, one fact a line."""
        out = list(self.notes)
        for k, start in enumerate(self.starts):
            out.extend(_start_lines(k, start, self.starts[0].wrote))
        if self.losses:
            out.append(self.losses)
        if self.findings_gone or self.findings_left or self.findings_new:
            out.append(
                f"doctor on the patched copy: gone {', '.join(self.findings_gone) or '-'}; "
                f"still there {', '.join(self.findings_left) or '-'}; new {', '.join(self.findings_new) or '-'}"
            )
        if self.speedup is not None:
            s = self.speedup
            out.append(
                f"patched vs original (plain python, whole step): {s.text()} "
                f"({s.baseline_ms:.2f} -> {s.candidate_ms:.2f} ms/step; {s.spread_text()})"
                if s.ratio is not None and s.baseline_ms and s.candidate_ms
                else "patched vs original: not measured: the plain-python runs timed no steps"
            )
            t = self.tune_speedup
            out.append(
                f"tune confirmed: {t.text()} ({t.spread_text()})"
                if t is not None and t.ratio is not None
                else "tune confirmed: not measured"
            )
            if self.judgement is not None:
                out.append(f"judged: {self.judgement.reason}")
        out.append("verified" if self.ok else "NOT verified")
        return out


def _start_lines(k: int, start: Start, wrote: list[str]) -> list[str]:
    """The lines of start ``k`` (0: the first)."""
    if k == 0:
        who = "plain python: the patched script"
    else:
        names = ", ".join(wrote[:SHOWN_FILES]) + (
            f" and {len(wrote) - SHOWN_FILES} more" if len(wrote) > SHOWN_FILES else ""
        )
        who = f"plain python, second start in the same copy (the first wrote {names}): the patched script"
    if start.rc == TIMED_OUT:
        return [f"{who} was still running after {RUN_TIMEOUT_S} s, without failing (stopped there)"]
    if start.rc == 0 or not start.error:
        return [f"{who} exited {start.rc}"]
    return [f"{who} exited {start.rc}; its last lines:", *(f"    {line}" for line in start.error)]


def _run(cmd: list[str], cwd: Path, log: Path, err: Path | None = None) -> int:
    """Run ``cmd`` in ``cwd``: its output into ``log`` (its stderr into ``err`` when given)."""
    with log.open("w", encoding="utf-8") as out:
        errors = err.open("w", encoding="utf-8") if err is not None else None
        try:
            return subprocess.run(
                cmd,
                cwd=cwd,
                stdout=out,
                stderr=errors if errors is not None else subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return TIMED_OUT
        finally:
            if errors is not None:
                errors.close()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_ERROR_CHARS = 240
"""A longer line of the script's error is cut there (torch's messages run to a paragraph a line)."""


def error_lines(stderr: str, folder: Path) -> list[str]:
    """A failed run's own error: the last frame of the script's own code in its last traceback (the
    line it failed at) and the exception's lines, else its last non-empty lines; paths in the copy
    shown relative to it."""
    text = _ANSI.sub("", stderr.replace(f"{folder}/", ""))
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback ")), default=-1)
    frames = [i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith('File "')]
    if start < 0 or not frames:
        return [_cut(line) for line in lines[-ERROR_LINES:]]
    own = [i for i in frames if not lines[i].lstrip().startswith('File "/')] or frames
    at = own[-1]
    code = [lines[at + 1]] if at + 1 < len(lines) and lines[at + 1].startswith("    ") else []
    last = frames[-1] + 1
    while last < len(lines) and lines[last].startswith(" "):
        last += 1  # the last frame's code and caret lines: the exception starts after them
    shown = [lines[at].strip(), *(c.strip() for c in code), *(e.strip() for e in lines[last:])]
    return [_cut(line) for line in shown[:ERROR_LINES]]


def _cut(line: str) -> str:
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def _start(tree: Tree, script: str, args: list[str], work: Path, k: int) -> Start:
    name = "plain" if k == 0 else f"plain-{k + 1}"
    err = work / f"{name}.stderr"
    label = "start of the patched copy" if k == 0 else "second start (the first wrote files)"
    with Phase("verify", f"{label}: python {script}") as phase:
        rc = _run([sys.executable, script, *args], tree.path, work / f"{name}.log", err)
        phase.outcome = "still running at the limit" if rc == TIMED_OUT else f"exit {rc}"
    error = (
        error_lines(err.read_text(encoding="utf-8", errors="replace"), tree.path)
        if rc not in (0, TIMED_OUT)
        else []
    )
    return Start(rc, error, tree.written())


def plain_starts(tree: Tree, script: str, args: list[str], work: Path) -> list[Start]:
    """The patched script under plain python: a second start in the same copy when the first one
    wrote files there (and did not fail), then the copy put back as made."""
    try:
        first = _start(tree, script, args, work, 0)
        if first.rc not in (0, TIMED_OUT) or not first.wrote:
            return [first]
        return [first, _start(tree, script, args, work, 1)]
    finally:
        tree.reset()


def _scalpel(
    verb: str, extra: list[str], script: str, args: list[str], cwd: Path, out: Path
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torchscalpel", verb, *extra, "--out", str(out), "--", script, *args]
    with Phase("verify", f"scalpel {verb} on the patched copy") as phase:
        rc = _run(cmd, cwd, out.with_suffix(".log"))
        phase.outcome = "still running at the limit" if rc == TIMED_OUT else f"exit {rc}"
    try:
        return dict(json.loads((out / "run.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def verify(result: FixResult, options: FixOptions) -> Verification:
    """Re-run the patched copy as the module doc says; never touches the user's files."""
    from torchscalpel.fix.measured import checked_script
    from torchscalpel.fix.verify_attention import verify_attention

    v = Verification()
    # The script the run measured, under the user's tree: a record names nothing else to run.
    record, script = checked_script(result.records, result.root)
    folder = script.parent
    if any(not p.is_relative_to(folder) for p in result.changes):
        v.notes.append(f"not verified: the patch edits files outside {folder}")
        return v
    args = [str(a) for a in (record.target or {}).get("args") or []]
    work = Path(tempfile.mkdtemp(prefix="scalpel-fix-verify-"))
    legacy = _legacy_checkpoints(result, folder)
    original = Tree.copy(folder, work / "original", leave_out=legacy)
    # The patched files' bytes in the encoding each declares (PEP 263), as --apply would write them.
    overrides = {path.relative_to(folder).as_posix(): result.new_bytes(path) for path in result.changes}
    patched = Tree.copy(folder, work / "patched", overrides, leave_out=legacy)
    v.notes.append(f"copies in {work}")
    if legacy:
        v.notes.append(
            f"left out of the copies: {', '.join(legacy)}: written before the patch, a pickled module, the "
            "format the patch changes (the patched script saves and loads state_dicts); convert each once, "
            "as you trust it: torch.save(torch.load(p, weights_only=False).state_dict(), p), or delete it"
        )
    v.starts = plain_starts(patched, script.name, args, work)
    ok = all(s.rc in (0, TIMED_OUT) for s in v.starts)  # still running after the limit: it did not fail
    ok = verify_attention(result.changes, folder, script.name, args, original.path, work, v.notes) and ok
    patched_items = [i for i in result.items if i.status == "patched"]
    fixed = {i.rule for i in patched_items if i.source == "doctor"}
    if fixed:
        before = {
            str(f.get("rule"))
            for _, r in result.records
            if r.section(DoctorSection) is not None
            for f in r.findings
        }
        after_rules = {
            str(f.get("rule"))
            for f in _scalpel("doctor", [], script.name, args, patched.path, work / "doctor").get(
                "findings", []
            )
        }
        patched.reset()
        v.findings_gone = sorted(fixed - after_rules)
        v.findings_left = sorted(fixed & after_rules)
        v.findings_new = sorted(after_rules - before)
        ok = ok and not v.findings_left and not v.findings_new
    if any(i.source == "memory" for i in patched_items):
        from torchscalpel.fix.verify_memory import verify_memory

        run = next(r for _, r in result.records if r.sections.get("memory"))
        with Phase("verify", "scalpel memory under the limit, on the patched copy"):
            verdict = verify_memory(run, script, patched.path, work)
        patched.reset()
        v.notes.append(verdict.line)
        ok = ok and verdict.fits
    ok = _compare(v, result, options, tune_record(result), script.name, args, original, patched, work) and ok
    v.ok = ok
    return v


CHECKPOINT_RULES = ("whole-model-save",)
"""Patched doctor rules that change what a checkpoint holds (a module becomes its state_dict; an
``unsafe-torch-load`` fix that converts its writer marks this rule patched too)."""


def _legacy_checkpoints(result: FixResult, folder: Path) -> list[str]:
    """The checkpoints in ``folder`` in the format the patch changes (see
    :func:`torchscalpel.fix.verify_tree.pickled_checkpoints`); none when the patch changes no format."""
    from torchscalpel.fix.verify_tree import pickled_checkpoints

    if not any(i.status == "patched" and i.rule in CHECKPOINT_RULES for i in result.items):
        return []
    return pickled_checkpoints(folder)


def tune_record(result: FixResult) -> TuneSection | None:
    """The tune section of the first record that has one."""
    return next((r.section(TuneSection) for _, r in result.records if r.section(TuneSection)), None)


def _compare(
    v: Verification,
    result: FixResult,
    options: FixOptions,
    tune: TuneSection | None,
    script: str,
    args: list[str],
    original: Tree,
    patched: Tree,
    work: Path,
) -> bool:
    """Tune's step timing (tune edits) and the loss comparison (every patch), into ``v``; True when
    both pass."""
    from torchscalpel.fix.verify_losses import expectation, judge_losses
    from torchscalpel.fix.verify_tune import plain_run, verify_tune

    expect = expectation(result)
    ok = True
    if any(i.source == "tune" and i.status == "patched" for i in result.items):
        v.speedup, v.tune_speedup, v.judgement, notes, (runs_b, runs_c) = verify_tune(
            tune.winner if tune is not None else None,
            script,
            args,
            original,
            patched,
            work,
            options.pairs,
            options.steps,
            RUN_TIMEOUT_S,
        )
        v.notes += notes
        ok = v.judgement.ok
        base, cand = runs_b[0].losses, runs_c[0].losses
        second = runs_b[1].losses if len(runs_b) > 1 else None
    elif expect.numerics is not None:
        # Enough steps for the gate's window: the timer's warm-up steps count among them.
        steps = max(1, GATE_STEPS - WARMUP_STEPS)
        with Phase("verify", f"losses of the original, {steps} steps"):
            base = plain_run(
                original, script, args, work / "losses-original.json", steps, RUN_TIMEOUT_S
            ).losses
        with Phase("verify", f"losses of the patched copy, {steps} steps"):
            cand = plain_run(patched, script, args, work / "losses-patched.json", steps, RUN_TIMEOUT_S).losses
        second = None
    else:
        base = cand = []
        second = None

    def again() -> list[float | None]:
        steps = max(1, GATE_STEPS - WARMUP_STEPS)
        with Phase("verify", "losses of the original again (its own noise)"):
            return plain_run(
                original, script, args, work / "losses-original-2.json", steps, RUN_TIMEOUT_S
            ).losses

    verdict = judge_losses(expect, base, cand, again, second)
    v.losses = verdict.line
    return ok and verdict.ok
