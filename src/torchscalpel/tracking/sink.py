"""Where a finished run goes besides its run folder: :class:`TrackingOptions` and :func:`write_tracking`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.record import RunRecord

EXTRA_HINT = "pip install 'torchscalpel[tracking]'"


@dataclass(kw_only=True, slots=True)
class TrackingOptions:
    """The trackers a command was asked to write to (``--tensorboard DIR``, ``--mlflow URI``)."""

    tensorboard: Path | None = None
    """TensorBoard log folder (the ``--logdir`` you give ``tensorboard``)."""
    mlflow: str | None = None
    """MLflow tracking URI or a folder (a local file store)."""

    def __post_init__(self) -> None:
        if self.tensorboard is not None and self.tensorboard.exists() and not self.tensorboard.is_dir():
            raise ValueError(f"--tensorboard {self.tensorboard} is a file; name a log folder")
        if self.mlflow is not None:
            why = mlflow_uri_problem(str(self.mlflow))
            if why is not None:
                raise ValueError(why)

    @property
    def any(self) -> bool:
        """True when some tracker was asked for."""
        return self.tensorboard is not None or self.mlflow is not None


MLFLOW_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
"""The tracking-URI schemes ``--mlflow`` takes (MLflow's REST server, file and database stores)."""


def mlflow_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is not a tracking URI or folder (one sentence, no full stop), or None.

    A text with a colon and no known scheme (``::bad::``, ``htp://x``) is a mistyped URI, not a folder
    name: taken as a folder it became a stray ``::bad::`` directory beside the run."""
    from urllib.parse import urlsplit

    text = uri.strip()
    if not text:
        return "--mlflow needs a tracking URI or a folder"
    hint = "give http(s)://HOST[:PORT], file:///ABS/PATH, sqlite:///FILE.db or a folder name without ':'"
    if ":" not in text:
        path = Path(text).expanduser()
        if path.exists() and not path.is_dir():
            return f"--mlflow {uri} is a file, not a folder for a file store; name a folder or a tracking URI"
        return None
    scheme = text.split(":", 1)[0].lower()
    if scheme not in MLFLOW_SCHEMES:
        return f"--mlflow {uri!r} is not a tracking URI or a folder; {hint}"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return f"--mlflow {uri!r} is not a valid URI; {hint}"
    if scheme in ("http", "https") and not parts.hostname:
        return f"--mlflow {uri!r} names no host; {hint}"
    return None


def names(run_dir: Path | None, record: RunRecord, run: str | None, worker: str | None) -> tuple[str, str]:
    """(run, worker) for the trackers: a rank of ``scalpel launch --profile`` (its folder ``OUT/rank-R``)
    is worker ``rankR`` of run ``OUT`` (so TensorBoard shows ``OUT/rankR``); else the run folder's name
    and this host's name, as torch's own ``tensorboard_trace_handler`` names workers."""
    rank = os.environ.get("RANK")
    if run_dir is not None and rank is not None and run_dir.name == f"rank-{rank}":
        return run or f"{run_dir.parent.name}/rank{rank}", worker or f"rank{rank}"
    import socket

    return run or (
        run_dir.name if run_dir is not None else record.name
    ), worker or socket.gethostname() or "worker0"


def write_tracking(
    record: RunRecord,
    run_dir: Path | None,
    options: TrackingOptions,
    *,
    run: str | None = None,
    worker: str | None = None,
) -> list[str]:
    """Write ``record`` to each tracker asked for; return one line per outcome (also printed to stderr).

    A tracker whose package is missing, or that fails, costs only its own output: the line says so
    and names the extra to install; nothing is raised.
    """
    lines: list[str] = []
    name, worker = names(run_dir, record, run, worker)
    if options.tensorboard is not None:
        try:
            from torchscalpel.tracking.tensorboard import write_tensorboard

            files = write_tensorboard(record, run_dir, options.tensorboard, run=name, worker=worker)
            lines.append(
                f"tensorboard: {len(files)} file(s) under {options.tensorboard} "
                f"(tensorboard --logdir {options.tensorboard})"
            )
        except ImportError:
            lines.append(
                f"tensorboard: not written, the tensorboard package is not installed ({EXTRA_HINT})."
            )
        except Exception as exc:  # a tracker must never cost the run its own results
            lines.append(f"tensorboard: not written ({type(exc).__name__}: {exc}).")
    if options.mlflow is not None:
        try:
            from torchscalpel.tracking.mlflow import write_mlflow

            run_id = write_mlflow(record, run_dir, options.mlflow, run=name)
            lines.append(f"mlflow: run {run_id} in {options.mlflow}")
        except ImportError:
            lines.append(f"mlflow: not written, the mlflow package is not installed ({EXTRA_HINT}).")
        except Exception as exc:
            lines.append(f"mlflow: not written ({type(exc).__name__}: {exc}).")
    for line in lines:
        print(f"scalpel: {line}", file=sys.stderr)
    return lines
