"""Facts one rank records for the checks that need every rank: samplers, DDP syncs, random streams.

Installed with the collective log (:func:`torchscalpel.runtime.collectives.install`) and written to
``rank-R.facts.json`` beside it at steps 1, 2, 4, 8, ... 64 and at exit. The launcher compares the
ranks' files (:mod:`torchscalpel.distributed.rankrules`); nothing here talks to another rank, so a
check can never add a collective or wait on one.

- every ``DistributedSampler`` iterated: its ``num_replicas``/``rank`` and the job's world size/rank;
- every DDP forward with autograd on: whether it will all-reduce (``require_backward_grad_sync``,
  False inside ``no_sync()``), counted per optimizer step; the DDP's ``device_ids``, ``LOCAL_RANK``
  and gradient bytes;
- every ``torch.autograd.backward`` (``loss.backward()`` too): whether the root of the graph is a
  division or multiplication (``loss / accum_steps``, ``scaler.scale(loss)``), counted per optimizer
  step, and whether the step took a closure (LBFGS re-evaluates the loss; not accumulation);
- a process-group call (``get_rank``, ``get_world_size``, ``new_group``, ...; collectives the log
  already wraps are left to torch's own error) made directly by the user's
  code before ``init_process_group``: its function and file:line (library code that probes the
  group inside its own ``try`` is not recorded);
- the first DDP forward's batch size, the optimizer's lr and the script (for the global batch);
- after the second optimizer step: digests of the torch CPU, Python and NumPy generator states that
  changed over that step (the generators the training step draws from).

Cost: one attribute read per DDP forward and a counter per optimizer step; the file is rewritten
seven times per run.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import sys
import zlib
from pathlib import Path
from typing import Any

from torchscalpel.fileio import atomic_write_text
from torchscalpel.runtime.hang_files import facts_path
from torchscalpel.runtime.patching import replace_for_process
from torchscalpel.runtime.userframes import is_user_file

WRITE_AT_STEPS = frozenset({1, 2, 4, 8, 16, 32, 64})
MAX_STEPS_KEPT = 64


def rng_digests() -> dict[str, int]:
    """crc32 of each generator's state (equal digests: the same stream)."""
    import torch

    out = {
        "torch": zlib.crc32(torch.get_rng_state().numpy().tobytes()),
        "python": zlib.crc32(repr(random.getstate()).encode()),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = zlib.crc32(repr(np.random.get_state()[1][:16].tolist()).encode())
    return out


class RankFacts:
    """Collects this rank's facts and writes them (see the module doc)."""

    def __init__(self, folder: Path, rank: int, world: int, local_rank: int | None) -> None:
        self.path = facts_path(folder, rank)
        self.data: dict[str, Any] = {
            "rank": rank,
            "world": world,
            "local_rank": local_rank,
            "samplers": [],
            "ddp": [],
            "steps": [],
            "rng": None,
            "backward": [],
            "lr": None,
            "batch": None,
            "before_init": [],
        }
        self._seen: set[int] = set()
        self._synced = 0
        self._unsynced = 0
        self._step = 0
        self._rng_step1: dict[str, int] = {}
        self._backward_calls = 0
        self._backward_scaled = 0
        self._backward_root = ""

    def write(self) -> None:
        """Rewrite ``rank-R.facts.json`` (atomic: the launcher never reads half a file)."""
        try:
            atomic_write_text(self.path, json.dumps(self.data) + "\n")
        except OSError:
            pass  # the launch folder went away; nothing to report into

    def on_loader_iter(self) -> None:
        """A DataLoader iterator was made: it drew its base seed from torch's generator (once per epoch, not per
        step). Between steps 1 and 2 that draw starts the interval again, so a loader whose epochs are a
        single batch is not taken for a step that draws random numbers."""
        if self._step == 1:
            self._rng_step1 = rng_digests()

    def on_sampler(self, sampler: Any) -> None:
        """A DistributedSampler starts an epoch."""
        if id(sampler) in self._seen:
            return
        self._seen.add(id(sampler))
        import torch.distributed as dist

        live = dist.is_available() and dist.is_initialized()
        self.data["samplers"].append(
            {
                "num_replicas": int(sampler.num_replicas),
                "rank": int(sampler.rank),
                "world": dist.get_world_size() if live else self.data["world"],
                "actual_rank": dist.get_rank() if live else self.data["rank"],
                "site": _caller_site(),
            }
        )
        self.write()

    def on_ddp_forward(self, ddp: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        """A DDP forward: will its backward all-reduce? Its first tensor's batch size (once)."""
        import torch

        if not torch.is_grad_enabled():
            return
        if self.data["batch"] is None:
            first = next(
                (a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor) and a.dim()),
                None,
            )
            if first is not None:
                self.data["batch"] = int(first.shape[0])
        if ddp.require_backward_grad_sync:
            self._synced += 1
        else:
            self._unsynced += 1
        if id(ddp) not in self._seen:
            self._seen.add(id(ddp))
            grad_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
            self.data["ddp"].append(
                {
                    "device_ids": list(ddp.device_ids) if ddp.device_ids else None,
                    "grad_bytes": grad_bytes,
                    "site": _caller_site(),
                }
            )
            self.write()

    def on_backward(self, tensors: Any) -> None:
        """A backward pass: is its root a scaling (``/ k``, ``* s``)?"""
        root = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        fn = getattr(root, "grad_fn", None)
        if fn is None:
            return
        self._backward_calls += 1
        self._backward_root = type(fn).__name__
        if scaled_root(fn):
            self._backward_scaled += 1

    def on_step(self, optimizer: Any = None, args: Any = (), kwargs: Any = None) -> None:
        """Optimizer step: close this step's sync counts; digest the generators after step 2."""
        self._step += 1
        # The hook gets step()'s own arguments, the optimizer first: step(closure) means LBFGS-style
        # re-evaluation, where several backward passes per step are not accumulation.
        closure = any(a is not None for a in tuple(args)[1:]) or bool(
            kwargs and kwargs.get("closure") is not None
        )
        if len(self.data["steps"]) < MAX_STEPS_KEPT:
            self.data["steps"].append([self._synced, self._unsynced])
            self.data["backward"].append(
                [self._backward_calls, self._backward_scaled, closure, self._backward_root]
            )
        self._synced = self._unsynced = 0
        self._backward_calls = self._backward_scaled = 0
        if self.data["lr"] is None and optimizer is not None:
            try:
                self.data["lr"] = float(optimizer.param_groups[0]["lr"])
            except (AttributeError, IndexError, KeyError, TypeError, ValueError):
                pass  # an LR held as a tensor schedule or no groups: not needed for the check
        if self._step == 1:
            self._rng_step1 = rng_digests()
            # By the first step the script runs as __main__ (argv[0] is it): the batch history's key.
            self.data["script"] = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
        if self._step == 2:
            now = rng_digests()
            # Which generators the training step draws from: unchanged over a step means none is used per
            # step (no dropout, no random augmentation), so equal streams across ranks would not matter.
            self.data["rng"] = {
                name: value for name, value in now.items() if self._rng_step1.get(name) != value
            }
        if self._step in WRITE_AT_STEPS:
            self.write()


_SCALING = ("DivBackward", "MulBackward")
GROUP_CALLS = (
    "get_rank",
    "get_world_size",
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "new_group",
    "get_backend",
)


def _from_user(frame: Any) -> bool:
    """The call comes straight from the user's script (not a library that asks before init, not torch)."""
    return frame is not None and is_user_file(frame.f_code.co_filename)


def scaled_root(fn: Any) -> bool:
    """A loss graph whose root divides or multiplies, or sums terms that each do (``a / k + b / k``)."""
    name = type(fn).__name__
    if name.startswith(_SCALING):
        return True
    if name.startswith(("AddBackward", "SubBackward")):
        kids = [f for f, _ in getattr(fn, "next_functions", ()) if f is not None]
        return bool(kids) and all(type(f).__name__.startswith(_SCALING) for f in kids)
    return False


def _caller_site() -> str:
    from torchscalpel.runtime.userframes import user_site

    return user_site(sys._getframe(2))


def _watch_group_calls(facts: RankFacts) -> None:
    """Record a user's process-group call made before ``init_process_group`` (then torch raises as usual)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in GROUP_CALLS:
        original = getattr(dist, name, None)
        if (
            original is None
            or getattr(original, "_scalpel_facts", False)
            or getattr(original, "_scalpel_op", None)
        ):
            continue  # collectives the log wraps stay single-wrapped (its __wrapped__ and per-call cost unchanged)

        def wrapper(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            if (
                not dist.is_initialized()
                and _from_user(sys._getframe(1))
                and len(facts.data["before_init"]) < 5
            ):
                facts.data["before_init"].append({"call": _name, "site": _caller_site_at(sys._getframe(1))})
                facts.write()
            return _original(*args, **kwargs)

        wrapper._scalpel_facts = True  # type: ignore[attr-defined]
        wrapper.__doc__, wrapper.__name__ = original.__doc__, original.__name__
        replace_for_process(dist, name, wrapper)


def _caller_site_at(frame: Any) -> str:
    from torchscalpel.runtime.userframes import user_site

    return user_site(frame)


def install(folder: Path, rank: int, world: int) -> RankFacts:
    """Patch DDP.forward and DistributedSampler.__iter__ to report to a new :class:`RankFacts`."""
    import torch.utils.data.distributed as data_dist
    from torch.nn.parallel import distributed as ddp_mod
    from torch.optim.optimizer import register_optimizer_step_post_hook

    local = os.environ.get("LOCAL_RANK")
    facts = RankFacts(folder, rank, world, int(local) if local and local.isdigit() else None)
    ddp_cls = ddp_mod.DistributedDataParallel
    if not getattr(ddp_cls.forward, "_scalpel_facts", False):
        forward = ddp_cls.forward

        def ddp_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            facts.on_ddp_forward(self, args, kwargs)
            return forward(self, *args, **kwargs)

        ddp_forward._scalpel_facts = True  # type: ignore[attr-defined]
        replace_for_process(ddp_cls, "forward", ddp_forward)
    sampler_cls = data_dist.DistributedSampler
    if not getattr(sampler_cls.__iter__, "_scalpel_facts", False):
        iterate = sampler_cls.__iter__

        def sampler_iter(self: Any) -> Any:
            facts.on_sampler(self)
            return iterate(self)

        sampler_iter._scalpel_facts = True  # type: ignore[attr-defined]
        replace_for_process(sampler_cls, "__iter__", sampler_iter)
    from torch.utils.data import dataloader as dl_mod

    loader_cls = dl_mod.DataLoader
    if not getattr(loader_cls.__iter__, "_scalpel_facts", False):
        loader_iter = loader_cls.__iter__

        def loader_iter_facts(self: Any) -> Any:
            it = loader_iter(self)
            facts.on_loader_iter()
            return it

        loader_iter_facts._scalpel_facts = True  # type: ignore[attr-defined]
        replace_for_process(loader_cls, "__iter__", loader_iter_facts)
    import torch.autograd

    if not getattr(torch.autograd.backward, "_scalpel_facts", False):
        backward = torch.autograd.backward  # Tensor.backward calls this module attribute

        def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            facts.on_backward(tensors)
            return backward(tensors, *args, **kwargs)

        autograd_backward._scalpel_facts = True  # type: ignore[attr-defined]
        replace_for_process(torch.autograd, "backward", autograd_backward)
    _watch_group_calls(facts)
    register_optimizer_step_post_hook(facts.on_step)
    atexit.register(facts.write)
    facts.write()
    return facts
