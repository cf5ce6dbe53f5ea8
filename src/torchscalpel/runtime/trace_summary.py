"""The profiler window's trace summarised into the record (``sections["trace"]``), by the shared trace
module: the profile stage and doctor's copy rule both read it."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.record import RunRecord
from torchscalpel.sections import TraceSection


def add_trace_summary(record: RunRecord, out_dir: Path) -> None:
    """Op-level summary of the profiler window's trace, from the shared trace module."""
    trace_name = record.profiler_view().trace
    if not trace_name:
        return
    record.artifacts["trace"] = trace_name
    from torchscalpel.trace import analyze_traces

    try:
        result = analyze_traces([out_dir / trace_name]).to_dict()
    except Exception as exc:  # a trace we cannot read must not cost the user the run record
        record.notes.append(f"trace summary failed: {exc}")
        return
    record.sections[TraceSection.KEY] = result  # read through record.op_summary_view(); kept once
    from torchscalpel.runtime.summary import uncounted_ops

    uncounted = uncounted_ops(record)  # the ops the FLOPs leave out, named beside them
    if uncounted and record.summary:
        record.summary["flops_uncounted"] = uncounted
    lines = record.profiler.get("op_lines")
    if isinstance(lines, dict) and lines.get("ops"):
        # The op-line pass kept its heaviest ops; the record keeps the lines of the top ops only.
        top = {op.get("name") for op in result.get("top_ops", [])}
        lines["ops"] = [o for o in lines["ops"] if o.get("name") in top]
