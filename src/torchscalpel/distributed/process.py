"""Process-group setup and teardown from torchrun's environment, seeding, rank-aware logging.

``setup()`` reads what torchrun (or ``scalpel launch``, Slurm/Kubernetes through torchrun) put in
the environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and
``TORCHELASTIC_RESTART_COUNT``. A plain ``python train.py`` (no such variables) gets a one-rank
group on an in-memory store, so the same script runs unchanged on one process.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from torchscalpel.errors import UsageError

LOGGER_NAME = "torchscalpel.distributed"
_STATE: dict[str, DistContext] = {}


@dataclass(frozen=True, slots=True)
class DistContext:
    """What ``setup()`` decided: ranks, device and backend, seed."""

    rank: int
    """Global rank of this process."""
    world_size: int
    """Number of processes in the group."""
    local_rank: int
    """Rank on this node; picks the CUDA device."""
    device: torch.device
    """``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``."""
    backend: str
    """``nccl`` on CUDA, ``gloo`` on CPU."""
    seed: int
    """Base seed; this rank's generators were seeded with ``seed + rank``."""
    attempt: int
    """torchrun restart count (0 on the first attempt)."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one that writes shared files and logs at INFO."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(
            f"Environment variable {name}={value!r} is not an integer; unset it or fix the launcher."
        ) from None


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _make_store(rank: int, world_size: int, attempt: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store for this attempt.

    Under torchrun the agent already serves a TCPStore at MASTER_ADDR:MASTER_PORT. Restarted
    workers that re-use its keys fail to connect (gloo reads stale addresses of the dead attempt),
    so every attempt works under its own ``attemptN/`` prefix. Without torchrun's agent (e.g. an
    srun task per rank with MASTER_ADDR set) rank 0 hosts the store itself.
    """
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT", 29500)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    is_master = (not agent_store) and rank == 0
    base = dist.TCPStore(addr, port, world_size, is_master=is_master, timeout=timeout, wait_for_workers=False)
    return dist.PrefixStore(f"attempt{attempt}/", base)


def setup(
    *,
    seed: int = 0,
    backend: str | None = None,
    timeout_s: float = 600.0,
    log_all_ranks: bool = False,
    log_level: int = logging.INFO,
) -> DistContext:
    """Initialise the process group from torchrun's environment and return a :class:`DistContext`.

    Picks ``nccl`` when CUDA is available (binding ``cuda:LOCAL_RANK``) and ``gloo`` otherwise,
    seeds Python, NumPy and torch with ``seed + rank`` (distinct streams per rank, reproducible
    runs; :func:`torchscalpel.distributed.wrap` copies rank 0's initial weights to every rank, so models
    built after ``setup()`` still start identical), and installs rank-prefixed logging (rank 0 at
    ``log_level``, other ranks at WARNING unless ``log_all_ranks``). Calling it twice returns the
    first context.
    """
    if "ctx" in _STATE and dist.is_initialized():
        return _STATE["ctx"]
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"RANK={rank} is outside WORLD_SIZE={world_size}; check the launcher's environment.")
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices are visible; "
                "lower --nproc-per-node."
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    chosen = backend or ("nccl" if use_cuda else "gloo")
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            store: dist.Store = dist.HashStore()  # one process: nothing to rendezvous with, no port opened
        else:
            store = _make_store(rank, world_size, attempt, timeout)
        dist.init_process_group(
            chosen,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if chosen == "nccl" else None,  # None is torch's default: no eager init
        )
    seed_everything(seed + rank)
    ctx = DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        backend=chosen,
        seed=seed,
        attempt=attempt,
    )
    _STATE["ctx"] = ctx
    _install_logging(ctx, log_all_ranks=log_all_ranks, level=log_level)
    return ctx


def context() -> DistContext:
    """The context of the last ``setup()``; raises a clear error before it."""
    if "ctx" not in _STATE or not dist.is_initialized():
        raise UsageError(
            "torchscalpel.distributed.setup() has not run in this process; call it before wrap/loader/Checkpointer."
        )
    return _STATE["ctx"]


def collective_device() -> torch.device:
    """Where small flag tensors for collectives must live: the current CUDA device under nccl, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def teardown() -> None:
    """Wait for every rank, then destroy the process group (safe to call twice)."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
    _STATE.pop("ctx", None)
    for handler in list(logging.getLogger().handlers):
        if getattr(handler, "_torchscalpel", False):
            handler.flush()


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def _install_logging(ctx: DistContext, *, log_all_ranks: bool, level: int) -> None:
    """One stderr handler on the root logger, ``[rank R] LEVEL name: message`` (once per process)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if getattr(handler, "_torchscalpel", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._torchscalpel = True  # type: ignore[attr-defined]
    handler.addFilter(_RankFilter(ctx.rank))
    # Under ``scalpel launch`` every output line already starts with "[rank R] ".
    prefix = "" if os.environ.get("TORCHSCALPEL_LAUNCH") == "1" else "[rank %(rank)s] "
    handler.setFormatter(logging.Formatter(prefix + "%(levelname)s %(name)s: %(message)s"))
    # Why: N ranks printing the same INFO line N times buries the one line that differs.
    handler.setLevel(level if (ctx.is_main or log_all_ranks) else logging.WARNING)
    root.addHandler(handler)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)
        # torch's own INFO chatter (store keys, rendezvous) would follow the root level down.
        torch_logger = logging.getLogger("torch")
        if torch_logger.level == logging.NOTSET:
            torch_logger.setLevel(logging.WARNING)


def get_logger(name: str = LOGGER_NAME) -> logging.Logger:
    """A logger whose lines carry the rank once ``setup()`` ran."""
    return logging.getLogger(name)
