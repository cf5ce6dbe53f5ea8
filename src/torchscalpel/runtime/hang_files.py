"""The files a launched rank and the launcher's hang watch share in the run folder, one name each.

The rank side (:mod:`torchscalpel.runtime.collectives`, :mod:`~torchscalpel.runtime.rankfacts`) writes
them; the launcher side (:mod:`torchscalpel.distributed.hangwatch`, ``flightrec``, ``rankrules``) reads
them and writes the NCCL dump request. Both import the names from here, so the protocol is spelled once.
"""

from __future__ import annotations

from pathlib import Path

LOG_GLOB = "rank-*.log"
"""Every rank's collective log (a fixed-size memory-mapped ring, :class:`~torchscalpel.runtime.collectives.RankLog`)."""
FACTS_GLOB = "rank-*.facts.json"
"""Every rank's facts for the cross-rank checks (:mod:`torchscalpel.runtime.rankfacts`)."""


def log_path(folder: Path, rank: int) -> Path:
    """The rank's collective log."""
    return folder / f"rank-{rank}.log"


def stacks_path(folder: Path, rank: int) -> Path:
    """Where the rank's faulthandler writes every thread's stack on the watch's signal."""
    return folder / f"rank-{rank}.stacks.txt"


def facts_path(folder: Path, rank: int) -> Path:
    """The rank's facts (JSON, rewritten atomically)."""
    return folder / f"rank-{rank}.facts.json"


def nccl_request_path(folder: Path, rank: int) -> Path:
    """The launcher creates it to ask the rank for its NCCL flight-recorder dump."""
    return folder / f"rank-{rank}.nccl-request"


def nccl_dump_path(folder: Path, rank: int) -> Path:
    """The rank's answer: the flight recorder's pickle (read only by the restricted unpickler)."""
    return folder / f"rank-{rank}.nccl-trace.pickle"
