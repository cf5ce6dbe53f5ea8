"""``Checkpointer``: exact, crash-safe checkpoints over torch.distributed.checkpoint (DCP).

Layout of one checkpoint ``step-N/``:

- DCP files (``.metadata``, ``__R_0.distcp``): model and optimizer, sharded as they live in
  memory, so a different world size reshards on load;
- ``shared.json/.safetensors`` (rank 0): step, skipped steps, LR scheduler, GradScaler, world
  size, the caller's ``extra``;
- ``rank-R.json/.safetensors``: rank R's loader position and Python, NumPy, torch CPU and CUDA
  generator states;
- ``MANIFEST.json`` and ``COMMIT``, see :mod:`torchscalpel.distributed.manifest`.

Nothing is loaded with pickle: the manifest's hashes are checked before any file is parsed,
DCP's ``.metadata`` goes through a restricted unpickler (:mod:`torchscalpel.distributed.safedcp`),
byte items are read with ``torch.load(weights_only=True)`` and the small state is JSON plus
safetensors.
"""

from __future__ import annotations

import shutil
import signal
import weakref
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from torchscalpel.distributed import manifest
from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.distributed.process import collective_device, context, get_logger
from torchscalpel.distributed.safedcp import SafeFileSystemReader, WeightsOnlyLoadPlanner, read_metadata
from torchscalpel.distributed.statecodec import load_state, rng_restore, rng_snapshot, save_state

log = get_logger()
SIGTERM_EXIT_CODE = 143


def _sentence(exc: BaseException) -> str:
    """An error as the one sentence every rank raises (an OSError names its file)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc).rstrip(".")


class Checkpointer:
    """Save and resume everything a training run needs to continue bit-for-bit.

    Register what to save once; call :meth:`load` before training and :meth:`maybe_save` (or
    :meth:`save`) after optimizer steps. Every rank must make the same calls.

    ``keep``: committed checkpoints kept (older ones are deleted only after the new one
    verified). ``allow_partial``: resume even if the checkpoint lacks some registered state.
    ``async_save``: model/optimizer files are written in a background thread; the checkpoint
    commits at the next save, :meth:`wait` or exit. ``sigterm``: on SIGTERM every rank saves at
    its next :meth:`maybe_save` and the process exits with 143. ``sign_key``: a file of random bytes;
    each ``COMMIT`` then carries an HMAC-SHA256 of the manifest and :meth:`load` refuses a
    checkpoint whose signature is missing or wrong (tamper evidence, not only corruption).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        loader: Any = None,
        guard: Any = None,
        keep: int = 3,
        allow_partial: bool = False,
        async_save: bool = False,
        sigterm: bool = True,
        sign_key: str | Path | None = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep} must be at least 1 (the checkpoint being resumed from).")
        self.root = Path(directory)
        self._key = manifest.read_key(sign_key) if sign_key is not None else None
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.loader, self.guard = loader, guard
        self.keep, self.allow_partial, self.async_save = keep, allow_partial, async_save
        self.ctx = context()
        self.extra: dict[str, Any] = {}
        self._pending: tuple[Any, Path, int] | None = None
        self._stop_requested = False
        self._release_lock = self._lock_root()
        # Checkpoint collectives of an async save run in a background thread: they get their own
        # group so they never interleave with the training collectives on the default group.
        self._group = dist.new_group(backend="gloo") if async_save else None
        self._previous_sigterm: Any = None
        if sigterm:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True
        else:
            self._sigterm_installed = False

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            # Leaving on an error: another rank may be gone, so enter no collective (a pending async
            # save stays uncommitted, as after a crash); release what this process holds.
            self._pending = None
            self._release()

    def _release(self) -> None:
        """Release the writer lock and give SIGTERM back to the handler it had before."""
        self._release_lock()
        if self._sigterm_installed:
            self._sigterm_installed = False
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:  # not replaced by someone since
                    signal.signal(
                        signal.SIGTERM,
                        self._previous_sigterm if self._previous_sigterm is not None else signal.SIG_DFL,
                    )
            except ValueError:  # closed from a thread other than the main one: signals belong to it
                log.warning("checkpoint: closed outside the main thread; the SIGTERM handler stays installed")

    def _lock_root(self) -> Any:
        """Rank 0 takes the folder's writer lock for this Checkpointer's lifetime; every rank raises if
        another process holds it (so no rank waits in a collective for a refused rank 0)."""
        release = None
        refused: list[str | None] = [None]
        if self.ctx.is_main:
            try:
                release = manifest.lock_root(self.root)
            except CheckpointError as exc:
                refused[0] = str(exc)
            except OSError as exc:  # a read-only folder (resume or evaluate only): nothing to guard
                log.warning(
                    "checkpoint: cannot take the writer lock in %s (%s); saving there will fail",
                    self.root,
                    exc.strerror or exc,
                )
        if self.ctx.world_size > 1:
            dist.broadcast_object_list(refused, src=0)
        if refused[0] is not None:
            raise CheckpointError(refused[0])
        if release is None:
            return lambda: None
        weakref.finalize(self, release)
        return release

    def close(self) -> None:
        """Commit a pending save, release the folder's writer lock (also released at exit or kill) and
        restore the SIGTERM handler that was there before. ``with Checkpointer(...) as ckpt:`` calls it."""
        try:
            self.wait()
        finally:
            self._release()

    def _agree(self, error: str | None, what: str) -> None:
        """Every rank learns whether any rank failed at ``what`` and raises the same error.

        Why: a rank that raises alone leaves the others in the next barrier until torch's timeout
        (30 minutes); load() agrees the same way on its rank-0 checks."""
        errors = [error]
        if self.ctx.world_size > 1:
            gathered: list[Any] = [None] * self.ctx.world_size
            dist.all_gather_object(gathered, error)
            errors = gathered
        failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
        if failed:
            rank, message = failed[0]
            where = "" if self.ctx.world_size == 1 else f" (on rank {rank})"
            raise CheckpointError(f"Saving failed {what}{where}: {message}")

    # ---- state assembly -------------------------------------------------------------------
    def _dcp_state(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optim": optim_sd}
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(self.model)}

    def _shared_state(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {"step": step, "world_size": self.ctx.world_size, "extra": self.extra}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.guard is not None:
            state["guard"] = self.guard.state_dict()
        return state

    def _rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_snapshot(), "rank": self.ctx.rank}
        if self.loader is not None:
            state["loader"] = self.loader.state_dict()
        return state

    # ---- saving ---------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Write checkpoint ``step`` (collective: every rank calls it). Returns its final folder."""
        self.wait()
        final, tmp = manifest.step_dir(self.root, step), manifest.tmp_dir(self.root, step)
        error = None
        if self.ctx.is_main:
            try:
                self._prepare_step(final, tmp)
            except (CheckpointError, OSError) as exc:
                error = _sentence(exc)
        self._agree(error, f"before writing step {step}")  # also the barrier: tmp exists for everyone
        writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
        state = self._dcp_state()
        if self.async_save:
            future = dcp.async_save(state, storage_writer=writer, process_group=self._group)
        else:
            dcp.save(state, storage_writer=writer)
            future = None
        error = None
        try:
            save_state(self._rank_state(), tmp / f"rank-{self.ctx.rank}")
            if self.ctx.is_main:
                save_state(self._shared_state(step), tmp / "shared")
        except OSError as exc:
            error = _sentence(exc)
        self._agree(error, f"writing step {step}")
        self._pending = (future, tmp, step)
        if not self.async_save:
            self.wait()
        return final

    def wait(self) -> None:
        """Finish and commit a pending (async) save; then prune old checkpoints."""
        if self._pending is None:
            return
        future, tmp, step = self._pending
        self._pending = None
        if future is not None:
            future.result()
        dist.barrier()  # every rank's files are on disk
        error = None
        if self.ctx.is_main:
            try:
                self._commit(tmp, step)
            except (CheckpointError, OSError) as exc:
                error = _sentence(exc)
        self._agree(error, f"committing step {step}")  # nobody resumes or saves before the commit is visible

    def _prepare_step(self, final: Path, tmp: Path) -> None:
        if final.exists():
            problem = manifest.check(final, full=False)
            if problem is None:
                raise CheckpointError(f"{final} already exists; checkpoints are never overwritten.")
            self._move_aside(final, problem)
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a crashed save of the same step
        tmp.mkdir(parents=True)

    def _commit(self, tmp: Path, step: int) -> None:
        final = manifest.step_dir(self.root, step)
        manifest.commit(tmp, final, step, key=self._key)
        # The manifest's hashes were just computed from the fsynced files on disk; re-hashing
        # them again here would double the cost of every save for no new information. This
        # check confirms the committed folder is whole (marker, manifest, every file, sizes).
        problem = manifest.check(final, full=False)
        if problem is not None:
            raise CheckpointError(f"The checkpoint just written does not verify: {problem.message}.")
        for old in manifest.prune(self.root, self.keep):
            log.info("checkpoint: pruned %s", old.name)
        log.info("checkpoint: saved %s", final)

    def maybe_save(self, step: int, *, every: int) -> bool:
        """Save when ``step % every == 0``; after SIGTERM, save now and exit with 143 on every rank.

        The stop flag is agreed on with one tiny all-reduce, so ranks that received SIGTERM at
        different steps still save the same step together.
        """
        flag = torch.tensor([1 if self._stop_requested else 0], dtype=torch.int32, device=collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()):
            self.save(step)
            self.wait()
            log.warning(
                "checkpoint: SIGTERM received, saved step %d, exiting with %d", step, SIGTERM_EXIT_CODE
            )
            from torchscalpel.distributed.process import teardown

            teardown()
            raise SystemExit(SIGTERM_EXIT_CODE)
        if every > 0 and step % every == 0:
            self.save(step)
            return True
        return False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._stop_requested = True

    # ---- loading --------------------------------------------------------------------------
    def latest(self) -> Path | None:
        """The newest committed checkpoint (cheap check: presence and sizes).

        A newer ``step-N`` that fails the check (truncated, no manifest or commit marker) is named
        in a warning and, on rank 0, moved aside to ``step-N.broken-<time>`` so the run can save
        that step again instead of failing there on every relaunch.
        """
        found, broken = manifest.scan(self.root)
        for folder, problem in broken:
            if self.ctx.is_main:
                self._move_aside(folder, problem)
        return found

    def _move_aside(self, folder: Path, problem: manifest.Problem) -> None:
        aside = manifest.move_aside(folder)
        log.warning(
            "checkpoint: skipped %s: %s; moved it aside to %s", folder.name, problem.message, aside.name
        )

    def load(self, path: str | Path | None = None) -> int | None:
        """Restore the newest (or the given) checkpoint; return its step, or None if there is none.

        Rank 0 re-hashes every file first: a file whose bytes differ from the manifest is refused
        with :class:`CheckpointError`, never loaded.
        """
        chosen: list[Any] = [None]
        if self.ctx.is_main:
            folder = Path(path) if path is not None else self.latest()
            if folder is not None:
                problem = manifest.check(folder, full=True, key=self._key)
                if problem is not None:
                    chosen[0] = ("error", problem.message)
                else:
                    chosen[0] = ("ok", str(folder))
        dist.broadcast_object_list(chosen, src=0)
        if chosen[0] is None:
            return None
        status, value = chosen[0]
        if status == "error":
            raise CheckpointError(
                f"Refusing to load: {value}. Delete that folder to resume from an older one, or pass a path."
            )
        folder = Path(value)
        shared = load_state(folder / "shared")
        self._check_complete(shared, folder)
        read_metadata(folder / ".metadata")  # refused here in one sentence, before DCP wraps the error
        state = self._dcp_state()
        dcp.load(
            state,
            storage_reader=SafeFileSystemReader(str(folder)),
            planner=WeightsOnlyLoadPlanner(allow_partial_load=self.allow_partial),
        )
        if self.optimizer is not None:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        else:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.model, state["model"])
        if self.scheduler is not None and "scheduler" in shared:
            self.scheduler.load_state_dict(shared["scheduler"])
        if self.scaler is not None and "scaler" in shared:
            self.scaler.load_state_dict(shared["scaler"])
        if self.guard is not None and "guard" in shared:
            self.guard.load_state_dict(shared["guard"])
        self.extra = dict(shared.get("extra", {}))
        self._restore_rank_state(folder, int(shared["world_size"]), int(shared["step"]))
        log.info("checkpoint: resumed from %s (step %d)", folder, shared["step"])
        return int(shared["step"])

    def _check_complete(self, shared: dict[str, Any], folder: Path) -> None:
        if self.allow_partial:
            return
        for name, obj in (("scheduler", self.scheduler), ("scaler", self.scaler), ("guard", self.guard)):
            if obj is not None and name not in shared:
                raise CheckpointError(
                    f"{folder} holds no {name} state but a {name} was registered; pass allow_partial=True to "
                    f"resume with a fresh {name}."
                )
        if not (folder / ".metadata").exists():
            raise CheckpointError(f"{folder} has no DCP metadata; it is not a torchscalpel checkpoint.")

    def _restore_rank_state(self, folder: Path, saved_world: int, step: int) -> None:
        own = folder / f"rank-{self.ctx.rank}"
        if saved_world == self.ctx.world_size and own.with_suffix(".json").exists():
            state = load_state(own)
            rng_restore(state["rng"])
            if self.loader is not None:
                if "loader" not in state and not self.allow_partial:
                    raise CheckpointError(
                        f"{own}.json has no loader position; pass allow_partial=True to restart the epoch."
                    )
                if "loader" in state:
                    self.loader.load_state_dict(state["loader"])
            return
        # Resharded resume: generator streams cannot be split or merged, so each rank starts a
        # fresh deterministic stream; the loader keeps its place in the epoch.
        from torchscalpel.distributed.data import mix_seed
        from torchscalpel.distributed.process import seed_everything

        log.warning(
            "checkpoint: saved with %d ranks, resuming on %d; random streams are re-seeded",
            saved_world,
            self.ctx.world_size,
        )
        seed_everything(mix_seed(self.ctx.seed, step, self.ctx.rank))
        if self.loader is not None:
            rank0 = load_state(folder / "rank-0")
            if "loader" in rank0:
                self.loader.load_state_dict(rank0["loader"])
