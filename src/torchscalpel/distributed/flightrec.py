"""The NCCL flight recorder in the hang diagnosis: turned on at launch, dumped by every rank on a hang.

Launcher side only (the rank side is :func:`torchscalpel.runtime.collectives.start_flight_dumper`):

- :func:`trace_env`: on CUDA, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (the recorder's ring, off at 0 by
  default) and ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (where torch's own dump-on-timeout writes), each
  only where the user has not set it;
- :func:`request_dumps` / :func:`collect_dumps`: a request file per rank, answered by the rank's
  dumper thread with ``rank-R.nccl-trace.pickle`` (``torch._C._distributed_c10d._dump_nccl_trace``),
  moved next to ``hang.json`` under ``nccl-trace/``. Each wait has its own deadline: a rank that does
  not answer (dead, GIL held, a CPU build without the recorder) is named, never waited on.

Not exercised on a GPU in this repository's tests (CPU only): the plumbing is unit-tested.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FILE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
DEFAULT_BUFFER = 2000  # entries; torch's docs suggest a few thousand
REQUEST = "rank-{rank}.nccl-request"
DUMP = "rank-{rank}.nccl-trace.pickle"
WAIT_S = 10.0


def trace_env(environ: Mapping[str, str], folder: Path, cuda: bool) -> dict[str, str]:
    """The variables to add for the ranks (none without CUDA; the user's own values are kept)."""
    if not cuda:
        return {}
    add = {}
    if BUFFER_ENV not in environ:
        add[BUFFER_ENV] = str(DEFAULT_BUFFER)
    if FILE_ENV not in environ:
        add[FILE_ENV] = str(folder / "nccl-timeout-dump-rank-")  # torch appends the rank
    return add


def request_dumps(folder: Path, ranks: Iterable[int]) -> None:
    """Ask each rank's dumper thread for its flight recorder."""
    for rank in ranks:
        try:
            (folder / REQUEST.format(rank=rank)).write_text("dump\n")
        except OSError:
            pass  # the watch folder went away: collect_dumps reports every rank as unanswered


def collect_dumps(folder: Path, report_dir: Path, ranks: Iterable[int], wait_s: float = WAIT_S) -> dict[int, str]:
    """Per rank: the saved dump's path, or why there is none. Waits at most ``wait_s`` in all."""
    pending, out = set(ranks), {}
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            src = folder / DUMP.format(rank=rank)
            if src.exists():
                dest = report_dir / "nccl-trace" / f"nccl_trace_rank_{rank}"  # fr_trace reads <prefix>_<rank>
                dest.parent.mkdir(parents=True, exist_ok=True)
                src.replace(dest)
                out[rank] = str(dest)
                pending.discard(rank)
        if pending:
            time.sleep(0.1)
    for rank in pending:
        out[rank] = f"no dump within {wait_s:g} s (the rank is dead, holds the GIL, or has no NCCL flight recorder)"
    for rank in out:
        (folder / REQUEST.format(rank=rank)).unlink(missing_ok=True)
    return dict(sorted(out.items()))
