"""``--tensorboard DIR``: per-step scalars through ``torch.utils.tensorboard.SummaryWriter`` and the
profiler window's trace where TensorBoard's profile plugin looks for it.

Layout (one run per torchscalpel run folder, named after it)::

    DIR/<run>/events.out.tfevents.*                      scalars (step/*, train/*, memory/*, summary/*)
    DIR/plugins/profile/<run>/<worker>.pt.trace.json.gz  the trace of the profiler window
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torchscalpel.record import RunRecord
from torchscalpel.tracking.scalars import run_scalars, step_scalars

TRACE_SUFFIX = ".pt.trace.json.gz"
"""What the profile plugin (and ``scalpel analyze`` on a logdir) recognises as a PyTorch trace."""


def trace_path(logdir: Path, run: str, worker: str) -> Path:
    """Where the plugin reads this run's trace for ``worker``."""
    return logdir / "plugins" / "profile" / run / f"{worker}{TRACE_SUFFIX}"


def write_tensorboard(
    record: RunRecord, run_dir: Path | None, logdir: Path, *, run: str, worker: str
) -> list[Path]:
    """Write the scalars and copy the trace; return the files written. ImportError when tensorboard is absent."""
    from torch.utils.tensorboard import SummaryWriter  # raises ImportError without the tensorboard package

    event_dir = logdir / run
    writer = SummaryWriter(log_dir=str(event_dir))
    try:
        for index, values in step_scalars(record):
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=index)
        last = record.steps[-1].index if record.steps else 0
        for tag, value in run_scalars(record).items():
            writer.add_scalar(tag, value, global_step=last)
        writer.add_text("run/command", " ".join(record.command) or record.name, global_step=0)
    finally:
        writer.close()
    written = sorted(event_dir.glob("events.out.tfevents.*"))
    trace = record.profiler_view().trace
    if trace and run_dir is not None and (run_dir / trace).is_file():
        dest = trace_path(logdir, run.split("/")[0], worker)  # a launch: every rank in one profile run
        dest.parent.mkdir(parents=True, exist_ok=True)
        source = run_dir / trace
        if source.suffix == ".gz":
            shutil.copyfile(source, dest)
        else:
            import gzip

            with source.open("rb") as src, gzip.open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
        written.append(dest)
    return written
