"""What one ``scalpel launch`` ended with, as data for its terminal renderer
(:func:`torchscalpel.report.launch_terminal.render`): the exit code, the folder, and with ``--profile`` /
``--doctor`` the merged ranks and the findings across and per rank."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.findings import Finding


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """How a launch ended: the exit code for the shell, its folder, and (with a stage) the merged ranks."""

    exit_code: int
    out_dir: Path
    merged: dict[str, Any] | None = None
    """``OUT/launch.json``: per-rank rows, the straggler, the verdicts and the findings (None without a stage,
    or when no rank wrote a record and nothing was found)."""
    no_record: bool = False
    """A stage was asked for, but no rank wrote a run record and nothing was found across the ranks."""
    refused: str | None = None
    """Why no rank was started (``--plan-strict`` and nothing fits); None when the ranks ran."""
    doctor: bool = False
    """``--doctor``: the findings are shown across ranks, then per rank (:attr:`across`, :attr:`per_rank`)."""
    ranks: int = 0
    """The ranks launched (the records' count when ``--nproc`` is not a number)."""
    across: tuple[Finding, ...] = ()
    """What the launcher found by comparing the ranks (the hang watch's first)."""
    per_rank: tuple[Finding, ...] = ()
    """Each rank's own doctor findings, merged over the ranks."""
