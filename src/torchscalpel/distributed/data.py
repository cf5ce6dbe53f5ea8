"""``loader(dataset, batch_size)``: a DataLoader over a DistributedSampler that resumes exactly.

Three things make a resumed run see the same batches, in the same order, with the same random
augmentations as an uninterrupted one:

1. the sampler's order depends only on ``(seed, epoch)`` and the epoch advances by itself when an
   epoch is exhausted (no forgotten ``sampler.set_epoch``);
2. the position inside the epoch is saved (batches handed out) and a resumed epoch starts at the
   first sample not yet seen, without reading the skipped ones;
3. every sample is fetched under random generators seeded from ``(seed, epoch, index)``, so an
   augmentation does not depend on which worker fetched it or on what was fetched before; the
   caller's own generators are left untouched (important with ``num_workers=0``, where fetching
   runs in the training process and would otherwise shift dropout masks).
"""

from __future__ import annotations

import hashlib
import random
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from torchscalpel.distributed.process import seed_everything
from torchscalpel.errors import UsageError


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers, the same in every process (``hash()`` of str is not)."""
    digest = hashlib.blake2b(b",".join(str(int(v)).encode() for v in values), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _SeededSamples(Dataset):
    """Fetch ``dataset[i]`` under generators seeded from (seed, epoch, i); restore them after."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        sample_seed = mix_seed(self.seed, self.epoch, index)
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            seed_everything(sample_seed)
            try:
                return self.dataset[index]
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


class _WorkerInit:
    """Worker start: ignore SIGTERM, then the caller's ``worker_init_fn``.

    Why: launchers (torchrun, Slurm, Kubernetes) send SIGTERM to the whole process group. A
    loader worker that died of it would make the training process fail at its next batch instead
    of saving a checkpoint; workers still exit with their parent.
    """

    def __init__(self, user_fn: Any = None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class _ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch after its first ``start`` samples."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


class ResumableLoader:
    """Iterable over batches; each ``iter()`` continues where the last one stopped.

    Exhausting an iterator ends the epoch: the next ``iter()`` starts epoch ``epoch + 1``. Breaking
    out of a loop keeps the position, so ``state_dict()`` after any step records exactly which
    batches this rank has consumed. Pass it to :class:`torchscalpel.distributed.Checkpointer`.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        num_replicas: int,
        rank: int,
        **loader_kwargs: Any,
    ) -> None:
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.batches_done = 0
        self._seeded = _SeededSamples(dataset, seed)
        self.sampler = _ResumableSampler(
            self._seeded,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        # Why a private generator: DataLoader draws the workers' base seed from the global torch
        # generator at every iter(); a resumed run creates its iterator mid-epoch, so drawing from the
        # global stream would shift every random number after it (dropout included).
        self._generator = torch.Generator()
        loader_kwargs["worker_init_fn"] = _WorkerInit(loader_kwargs.get("worker_init_fn"))
        self.loader = DataLoader(
            self._seeded,
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=drop_last,
            generator=self._generator,
            **loader_kwargs,
        )
        self.drop_last = drop_last

    def __len__(self) -> int:
        """Batches in a full epoch on this rank."""
        n = self.sampler.num_samples
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if self.batches_done >= len(self):  # the last loop broke out right after the final batch
            self.epoch += 1
            self.batches_done = 0
        self.sampler.set_epoch(self.epoch)
        self._seeded.epoch = self.epoch  # workers receive a copy of the dataset at iter() time
        self.sampler.start = self.batches_done * self.batch_size
        self._generator.manual_seed(mix_seed(self.seed, self.epoch, self.batches_done, -1))
        for batch in self.loader:
            self.batches_done += 1
            yield batch
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, int]:
        """Position: epoch and batches consumed in it (plain ints)."""
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_replicas": self.sampler.num_replicas,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position (the next ``iter()`` starts at the first unseen batch)."""
        if int(state["seed"]) != self.seed or int(state["batch_size"]) != self.batch_size:
            raise UsageError(
                f"The checkpoint's loader used seed={state['seed']} batch_size={state['batch_size']}, this one "
                f"seed={self.seed} batch_size={self.batch_size}; use the same values to resume exactly."
            )
        if int(state["num_replicas"]) != self.sampler.num_replicas:
            # Different world size: sample order per rank changes, so restart the epoch boundary
            # at the same fraction of the epoch (no sample repeats more than once in this epoch).
            done = int(state["batches_done"]) * int(state["num_replicas"]) // self.sampler.num_replicas
        else:
            done = int(state["batches_done"])
        self.epoch = int(state["epoch"])
        self.batches_done = done


def loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int | None = None,
    drop_last: bool = True,
    num_workers: int = 0,
    **loader_kwargs: Any,
) -> ResumableLoader:
    """A per-rank loader over ``dataset`` with ``batch_size`` samples per rank per step.

    ``seed`` defaults to the one given to ``setup()``; it must be the same on every rank (the
    sampler partitions one shuffled order). Extra keyword arguments go to ``DataLoader``
    (``collate_fn``, ``pin_memory``, ``persistent_workers`` ...).
    """
    from torchscalpel.distributed.process import context

    ctx = context()
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be at least 1.")
    if loader_kwargs.get("persistent_workers"):
        # Persistent workers keep the dataset copy of the first epoch, so per-sample seeds would
        # repeat every epoch.
        raise UsageError(
            "loader() does not support persistent_workers=True; drop it (workers restart each epoch)."
        )
    for key in ("sampler", "batch_sampler", "shuffle", "generator"):
        if key in loader_kwargs:
            raise UsageError(f"loader() sets {key} itself; drop the {key}= argument.")
    return ResumableLoader(
        dataset,
        batch_size,
        shuffle=shuffle,
        seed=ctx.seed if seed is None else seed,
        drop_last=drop_last,
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        num_workers=num_workers,
        **loader_kwargs,
    )
