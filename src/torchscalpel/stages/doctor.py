"""The doctor stage: one entry point, :func:`run`, for ``scalpel doctor`` in its three modes.

A script run: the diagnosis (:func:`torchscalpel.doctor.api.diagnose`), then run.json and report.html
(:func:`~torchscalpel.stages.saving.save_with_report`), the trackers, ``--patch``, the findings as JSON /
SARIF, and the next command to type. ``--static``: the static rules over files. ``--nproc``: every rank under
``scalpel launch --doctor``, findings merged. Nothing here prints: the CLI renders the :class:`DoctorResult`.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torchscalpel.doctor.options import DoctorOptions
from torchscalpel.errors import ScalpelError
from torchscalpel.findings import Finding
from torchscalpel.record import RunRecord
from torchscalpel.runtime.target import Target
from torchscalpel.stages.saving import save_with_report, track_run


@dataclass(frozen=True, kw_only=True, slots=True)
class NextStep:
    """The command to type next, with the sentence before it (and the words after it)."""

    lead: str
    command: str
    tail: str = ""


@dataclass(kw_only=True, slots=True)
class DoctorResult:
    """What one ``scalpel doctor`` did; the CLI renders it and turns it into the exit code."""

    mode: Literal["run", "static", "ranks"]
    findings: list[Finding]
    """Every finding, ranked (static and runtime merged; under ``--nproc`` the across-rank ones first)."""
    record: RunRecord | None = None
    """The script run's record (saved as ``out_dir/run.json``); None under ``--static`` and ``--nproc``."""
    out_dir: Path | None = None
    files: list[Path] = field(default_factory=list)
    """``--static``: the files read."""
    not_analysed: list[Any] = field(default_factory=list)
    """``--static``: the files that could not be read (a CI gate never passes them)."""
    across_ranks: list[Finding] = field(default_factory=list)
    """``--nproc``: findings about the ranks together (the launcher's)."""
    rank_records: dict[int, RunRecord] = field(default_factory=dict)
    """``--nproc``: each rank's record."""
    launcher_code: int = 0
    """``--nproc``: the launcher's exit code."""
    tracked: list[str] = field(default_factory=list)
    """One line per tracker written (``--tensorboard`` / ``--mlflow``)."""
    patch_lines: list[str] = field(default_factory=list)
    """``--patch``: what was written (or why not)."""
    next_step: NextStep | None = None
    """The command to type next (None for a rank of ``doctor --nproc``: the merged list speaks for it)."""
    merged_rank: bool = False
    """This process is one rank of ``doctor --nproc``: its findings are printed once, merged, by the launcher."""
    fail_on_reached: bool = False
    """A finding reached ``--fail-on``'s severity (or, under ``--static``, a file could not be read)."""

    @property
    def per_rank(self) -> list[Finding]:
        """``--nproc``: the findings of single ranks, merged (after :attr:`across_ranks` in :attr:`findings`)."""
        return self.findings[len(self.across_ranks) :]

    @property
    def exit_code(self) -> int:
        """The script's own failure first (CI sees it as python would), then ``--fail-on``, then the launcher's."""
        if self.record is not None and self.record.status == "failed" and self.record.exit_code:
            return int(self.record.exit_code)
        if self.fail_on_reached:
            return 1
        if self.record is not None:
            return int(self.record.exit_code or 0)
        return self.launcher_code


def run(options: DoctorOptions, *, progress: Callable[[Any], None] | None = None) -> DoctorResult:
    """Do what ``options`` ask (:attr:`DoctorOptions.mode`): a script run (its target in ``options.target``),
    the static rules over ``options.static_paths``, or ``options.nproc`` ranks. ``progress`` is called once per
    step of a script run."""
    if options.mode == "static":
        return _static(options)
    if options.target is None:
        raise ValueError("the doctor's run needs options.target (the script or module to run)")
    if options.mode == "ranks":
        return _ranks(options, options.target)
    return _script(options, options.target, progress)


def _reaches(findings: Sequence[Finding], options: DoctorOptions) -> bool:
    from torchscalpel.report.doctor_terminal import reaches

    return bool(reaches(list(findings), options.fail_on))


def _static(options: DoctorOptions) -> DoctorResult:
    from torchscalpel.doctor.registry import rank_findings
    from torchscalpel.doctor.static_scan import analyze_paths, iter_python_files

    files = list(iter_python_files(list(options.static_paths or ())))
    skipped: list[Any] = []
    findings = rank_findings(analyze_paths(files, not_analysed=skipped))
    _write_findings(
        options,
        findings,
        {"mode": "static", "files": [str(f) for f in files], "not_analysed": [s.to_dict() for s in skipped]},
        skipped,
    )
    return DoctorResult(
        mode="static",
        findings=findings,
        files=files,
        not_analysed=skipped,
        # A CI gate never passes code it could not read.
        fail_on_reached=_reaches(findings, options) or (options.fail_on is not None and bool(skipped)),
    )


def _ranks(options: DoctorOptions, target: Target) -> DoctorResult:
    from torchscalpel.doctor.ranks import across_rank_findings, merge_rank_findings, run_ranks
    from torchscalpel.findings import without_launcher_repeats

    out_dir, nproc = _out_dir(options, target), int(options.nproc or 1)
    assert target.script is not None  # DoctorOptions.from_args refuses -m under --nproc
    code, records = run_ranks(target.script, target.args, nproc=nproc, steps=options.steps, out=out_dir)
    if not records:
        raise ScalpelError(
            f"No rank wrote a run record under {out_dir}; see the rank logs in {out_dir / 'logs'}."
        )
    across = across_rank_findings(out_dir)
    per_rank = without_launcher_repeats(across, merge_rank_findings(records))
    findings = across + per_rank
    _write_findings(
        options,
        findings,
        {
            "mode": "ranks",
            "nproc": nproc,
            "ranks": sorted(records),
            "records": [str(out_dir / f"rank-{r}" / "run.json") for r in sorted(records)],
        },
    )
    return DoctorResult(
        mode="ranks",
        findings=findings,
        out_dir=out_dir,
        across_ranks=across,
        rank_records=records,
        launcher_code=code,
        fail_on_reached=_reaches(findings, options),
    )


def _script(options: DoctorOptions, target: Target, progress: Callable[[Any], None] | None) -> DoctorResult:
    from torchscalpel.doctor.api import diagnose
    from torchscalpel.doctor.ranks import MERGED_RANKS_ENV

    out_dir = _out_dir(options, target)
    options = options.replace(out_dir=out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record, findings = diagnose(target, options, command=list(options.command), progress=progress)
    save_with_report(record, out_dir, write_report=options.report)
    tracked = track_run(record, out_dir, tensorboard=options.tensorboard, mlflow=options.mlflow)
    patch_lines: list[str] = []
    if options.patch:
        from torchscalpel.fix.shortcut import write_run_patch

        patch_lines = list(write_run_patch(out_dir))
    merged_rank = os.environ.get(MERGED_RANKS_ENV) == "1"
    _write_findings(
        options,
        findings,
        {
            "mode": "run",
            "status": record.status,
            "steps": len(record.steps),
            "window": record.sections["doctor"].get("window"),
            "record": str(out_dir / "run.json"),
        },
    )
    return DoctorResult(
        mode="run",
        findings=findings,
        record=record,
        out_dir=out_dir,
        tracked=tracked,
        patch_lines=patch_lines,
        next_step=None if merged_rank else _next_step(target, record, findings),
        merged_rank=merged_rank,
        fail_on_reached=_reaches(findings, options),
    )


def _out_dir(options: DoctorOptions, target: Target) -> Path:
    from torchscalpel.fileio import default_run_dir

    return options.out_dir or default_run_dir(f"doctor-{target.name}", options.out_root)


def _next_step(target: Target, record: RunRecord, findings: Sequence[Finding]) -> NextStep:
    """Fix and run the doctor again after a failure (tuning a script that does not run measures nothing),
    else tune, once the findings are fixed. A failed run's launcher advice is its script-failed finding's fix."""
    target_argv = target.argv() if target.script else ["-m", *target.argv()]
    if record.status == "failed":
        again = shlex.join(["scalpel", "doctor", "--", *target_argv])
        return NextStep(lead="next: fix the failure above, then run the doctor again:", command=again)
    tune = shlex.join(["scalpel", "tune", "--", *target_argv])
    if findings:
        return NextStep(lead="next: apply the fix(es) above and run the doctor again, then", command=tune)
    return NextStep(lead="next:", command=tune, tail="(measured speedups)")


def _write_findings(
    options: DoctorOptions, findings: list[Finding], meta: dict[str, Any], not_analysed: Sequence[Any] = ()
) -> None:
    """``--json`` (every finding) and ``--sarif`` (the static ones), after run.json: a path that cannot be
    written costs nothing measured."""
    from torchscalpel.doctor.sarif import to_sarif
    from torchscalpel.fileio import write_output_text
    from torchscalpel.report.doctor_terminal import to_json
    from torchscalpel.version import __version__

    if options.json_path is not None:
        write_output_text(
            options.json_path,
            json.dumps(to_json(findings, **meta), indent=1, default=str) + "\n",
            flag="--json",
        )
    if options.sarif_path is not None:
        static = [f for f in findings if f.source == "static"]
        write_output_text(
            options.sarif_path,
            json.dumps(to_sarif(static, version=__version__, not_analysed=not_analysed), indent=1) + "\n",
            flag="--sarif",
        )
