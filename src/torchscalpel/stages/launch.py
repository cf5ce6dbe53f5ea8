"""The launch stage: the memory preflight (``--plan``), the resume notice, torchrun with the hang watch, then
(``--profile`` / ``--doctor``) the ranks' records merged, judged and rendered: ``OUT/launch.json``,
``OUT/launch.html``, ``OUT/traces/`` and the terminal table."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from torchscalpel.distributed.launch_result import LaunchResult
from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.fileio import atomic_write_text


def run(options: LaunchOptions, *, progress: Callable[[str], None] | None = None) -> LaunchResult:
    """Launch as ``options`` ask (``options.out`` is the folder; ``from_args`` names one). ``progress``
    receives the lines said before the ranks start (the preflight's, the resume notice); nothing is printed
    here: :func:`~torchscalpel.report.launch_terminal.render` draws what the ranks wrote."""
    from torchscalpel.distributed.launch import launch, watch_options

    if options.out is None:
        raise ValueError("the launch stage needs options.out")
    say = progress or (lambda line: None)
    out = options.out
    if options.plan:
        from torchscalpel.distributed.preflight import run_preflight

        preflight = run_preflight(options, out)
        for line in preflight.lines:
            say(line)
        if options.plan_strict and preflight.planned and not preflight.fits:
            return LaunchResult(1, out, refused="--plan-strict: no strategy fits, so no rank was started.")
    for line in _resume_lines(options):
        say(line)
    with _ranks_print_one_line(options.stage == "doctor"):
        code = launch(options, out_dir=out, watch=watch_options(options, out))
    if options.stage is None:
        return LaunchResult(code, out)
    report = report_ranks(out, doctor=options.stage == "doctor", nproc=options.nproc_per_node)
    return replace(report, exit_code=code)


def _resume_lines(options: LaunchOptions) -> list[str]:
    """The script will resume from a checkpoint folder here, or (--fresh) that folder was moved aside."""
    from torchscalpel.distributed.resume import announce, find_resumes, start_fresh

    cwd = Path.cwd()
    resumes = find_resumes(cwd, list(options.training_script_args))
    return list(start_fresh(resumes, cwd) if options.fresh else announce(resumes, cwd))


@contextlib.contextmanager
def _ranks_print_one_line(on: bool) -> Iterator[None]:
    """Under --doctor each rank prints a one-line summary; the launcher prints every finding once, after."""
    from torchscalpel.doctor.ranks import MERGED_RANKS_ENV

    previous = os.environ.get(MERGED_RANKS_ENV)
    if on:
        os.environ[MERGED_RANKS_ENV] = "1"  # torchrun's workers inherit it
    try:
        yield
    finally:
        if on:
            if previous is None:
                os.environ.pop(MERGED_RANKS_ENV, None)
            else:
                os.environ[MERGED_RANKS_ENV] = previous


def report_ranks(out: Path, *, doctor: bool = False, nproc: str = "") -> LaunchResult:
    """Merge the per-rank Run records and judge them (with --doctor: the findings across and per rank), save
    ``OUT/launch.json``, ``OUT/launch.html`` and ``OUT/traces/``. Returns what the terminal shows (exit code
    0: the caller sets the launch's); ``no_record`` when no rank wrote one and nothing was found."""
    from torchscalpel.distributed.hangwatch import watch_findings
    from torchscalpel.distributed.rankmerge import load_rank_records, merge
    from torchscalpel.distributed.rankrules import launch_history, rank_findings
    from torchscalpel.distributed.scaling import per_rank_batch, scaling_verdicts
    from torchscalpel.findings import without_launcher_repeats

    records = load_rank_records(out)
    entry, history = launch_history(out / "watch")  # before rank_findings adds this launch to the history
    first = watch_findings(out) + rank_findings(out / "watch")
    if not records and not first:
        return LaunchResult(0, out, no_record=True, doctor=doctor)
    merged = merge(records) if records else {"ranks": [], "straggler": None, "findings": []}
    merged["findings"] = first + without_launcher_repeats(first, merged["findings"])
    # the first DDP forward's batch (what the history keeps), else the samples each rank's steps counted
    samples = {r: [s.samples for s in rec.measured_steps if s.samples] for r, rec in records.items()}
    batch = (entry or {}).get("batch") or per_rank_batch(samples)
    merged["verdicts"] = scaling_verdicts(
        merged["ranks"],
        batch=batch,
        script=(entry or {}).get("script"),
        history=history,
        straggler=(merged.get("straggler") or {}).get("rank"),
    )
    atomic_write_text(out / "launch.json", json.dumps(merged, indent=1, default=str) + "\n")
    from torchscalpel.report.launch_page import write_launch_page

    # the launch's one page: verdict (hang, straggler) first, ranks side by side, findings by rank
    write_launch_page(json.loads(json.dumps(merged, default=str)), out / "launch.html", subtitle=str(out))
    from torchscalpel.trace.layout import write_rank_traces  # OUT/traces/: HTA's TraceAnalysis(trace_dir=...)

    write_rank_traces(out)
    ranks = int(nproc) if str(nproc).isdigit() else len(records)
    if not doctor:
        return LaunchResult(0, out, merged=merged, ranks=ranks)
    from torchscalpel.doctor.ranks import across_rank_findings, merge_rank_findings

    across = across_rank_findings(out)
    per_rank = without_launcher_repeats(across, merge_rank_findings(records))
    return LaunchResult(
        0, out, merged=merged, doctor=True, ranks=ranks, across=tuple(across), per_rank=tuple(per_rank)
    )
