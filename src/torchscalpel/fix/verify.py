"""``scalpel fix --verify``: the patch applied to a copy of the script's folder and re-run.

- The patched script runs once under plain ``python`` (no scalpel hooks): it must exit 0.
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
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.sections import DoctorSection, TuneSection

if TYPE_CHECKING:
    from torchscalpel.fix.judge import Judgement
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.fix.stage import FixResult
    from torchscalpel.tune.speedup import Speedup

RUN_TIMEOUT_S = 600
"""A re-run is stopped after this long: a real training script may run for hours under plain python."""
TIMED_OUT = 124
IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", "scalpel-runs", "*.pyc", ".venv", "venv", "node_modules"
)
"""Not copied with the script's folder: history, caches, runs and environments (large, not the code)."""


@dataclass(slots=True)
class Verification:
    """What the re-run showed."""

    notes: list[str] = field(default_factory=list)
    plain_rc: int | None = None
    """Exit code of the patched script under plain python (None: not run)."""
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
        if self.plain_rc == TIMED_OUT:
            out.append(
                f"plain python: the patched script was still running after {RUN_TIMEOUT_S} s, without failing (stopped there)"
            )
        elif self.plain_rc is not None:
            out.append(f"plain python: the patched script exited {self.plain_rc}")
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


def _run(cmd: list[str], cwd: Path, log: Path) -> int:
    with log.open("w", encoding="utf-8") as out:
        try:
            return subprocess.run(
                cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return TIMED_OUT


def _scalpel(
    verb: str, extra: list[str], script: str, args: list[str], cwd: Path, out: Path
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torchscalpel", verb, *extra, "--out", str(out), "--", script, *args]
    _run(cmd, cwd, out.with_suffix(".log"))
    try:
        return dict(json.loads((out / "run.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def verify(result: FixResult, options: FixOptions) -> Verification:
    """Re-run the patched copy as the module doc says; never touches the user's files."""
    from torchscalpel.fix.stage import checked_script

    v = Verification()
    # The script the run measured, under the user's tree: a record names nothing else to run.
    record, script = checked_script(result)
    folder = script.parent
    if any(not p.is_relative_to(folder) for p in result.changes):
        v.notes.append(f"not verified: the patch edits files outside {folder}")
        return v
    args = [str(a) for a in (record.target or {}).get("args") or []]
    work = Path(tempfile.mkdtemp(prefix="scalpel-fix-verify-"))
    original, patched = work / "original", work / "patched"
    shutil.copytree(folder, original, ignore=IGNORED)
    shutil.copytree(folder, patched, ignore=IGNORED)
    for path in result.changes:
        (patched / path.relative_to(folder)).write_bytes(result.new_bytes(path))
    v.notes.append(f"copies in {work}")
    v.plain_rc = _run([sys.executable, script.name, *args], patched, work / "plain.log")
    ok = v.plain_rc in (0, TIMED_OUT)  # still running after the limit: it did not fail
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
            for f in _scalpel("doctor", [], script.name, args, patched, work / "doctor").get("findings", [])
        }
        v.findings_gone = sorted(fixed - after_rules)
        v.findings_left = sorted(fixed & after_rules)
        v.findings_new = sorted(after_rules - before)
        ok = ok and not v.findings_left and not v.findings_new
    if any(i.source == "memory" for i in patched_items):
        from torchscalpel.fix.verify_memory import verify_memory

        run = next(r for _, r in result.records if r.sections.get("memory"))
        verdict = verify_memory(run, script, patched, work)
        v.notes.append(verdict.line)
        ok = ok and verdict.fits
    if any(i.source == "tune" for i in patched_items):
        from torchscalpel.fix.verify_tune import verify_tune

        tune = next((r.section(TuneSection) for _, r in result.records if r.section(TuneSection)), None)
        v.speedup, v.tune_speedup, v.judgement, notes = verify_tune(
            tune.winner if tune is not None else None,
            script.name,
            args,
            original,
            patched,
            work,
            options.pairs,
            options.steps,
            RUN_TIMEOUT_S,
        )
        v.notes += notes
        ok = ok and v.judgement.ok
    v.ok = ok
    return v
