"""``scalpel launch``'s terminal: the ranks' table (step, collective, compute and data times), the straggler
and scaling verdicts, then (``--doctor``) the findings across and per rank, and where each record is. Reads a
:class:`~torchscalpel.distributed.launch_result.LaunchResult`; never measures."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from torchscalpel.distributed.launch_result import LaunchResult
from torchscalpel.distributed.rankmerge import STEP_TIME_MEANS
from torchscalpel.distributed.scaling import format_verdicts


def table(merged: dict[str, Any]) -> str:
    """The merged ranks as plain text: a row per rank, what the times mean (once), the verdicts, the findings
    with the ranks that raised them."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        "rank  status     steps  step ms  collective ms  compute ms  data ms"
    ]  # what they mean: once, below
    for row in merged["ranks"]:
        lines.append(
            f"{row['rank']:>4}  {row['status']:<9} {row['steps']:>6}  {ms(row['step_ms']):>7}  "
            f"{ms(row['collective_ms']):>13}  {ms(row['compute_ms']):>10}  {ms(row['data_ms']):>7}"
        )
    if merged["ranks"]:
        lines.append(STEP_TIME_MEANS)
    verdict = merged.get("straggler_verdict")
    if verdict:
        lines.append(f"straggler: {verdict['sentence']}")
    lines.extend(format_verdicts(merged.get("verdicts") or []))
    for finding in merged.get("findings", []):
        ranks = ",".join(str(r) for r in finding["ranks"])
        lines.append(f"[{finding.get('severity', '?')}] {finding.get('message', '')} (ranks {ranks})")
    return "\n".join(lines)


def render(result: LaunchResult, console: Console | None = None) -> None:
    """Print what a launch with ``--profile`` / ``--doctor`` found (nothing for a plain launch: the ranks'
    own output was the run's)."""
    if result.no_record:
        print(f"scalpel launch: no rank wrote a run record under {result.out_dir}", flush=True)
        return
    merged = result.merged
    if merged is None:
        return
    out = result.out_dir
    if not result.doctor:
        print(table(merged))
    else:
        from torchscalpel.console import make_console
        from torchscalpel.report.doctor_terminal import render_rank_findings

        print(table({**merged, "findings": []}), flush=True)
        render_rank_findings(result.across, result.per_rank, console or make_console(), ranks=result.ranks)
    print(
        f"per-rank records: {out}/rank-*/run.json, merged: {out / 'launch.json'}, page: {out / 'launch.html'}"
    )
