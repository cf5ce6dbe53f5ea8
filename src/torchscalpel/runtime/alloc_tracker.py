"""Tensor-level memory accounting on any device: every storage an op creates, who owns it, where it came from.

CPU has no allocator statistics API (TORCH-FACTS.md), so the tracker sees memory the way PyTorch's own
``MemTracker`` does: a :class:`~torch.utils._python_dispatch.TorchDispatchMode` registers the storage of
every tensor an op returns (its bytes, the user's ``file:line`` that called the op, the module whose
forward was running, the step) in the project's one storage ledger
(:class:`~torchscalpel.runtime.storage_ledger.StorageLedger`, which the plan's fake-tensor tracker shares),
whose weak reference subtracts it when the storage dies.
Categories (:mod:`~torchscalpel.runtime.memory_categories`) start as ``temporaries`` and are refined as
ownership becomes known:

- ``activations``: a storage autograd saved for backward (``saved_tensors_hooks`` pack hook), owned by
  the module whose forward saved it;
- ``parameters`` / ``gradients`` / ``optimizer_state``: adopted by :meth:`AllocationTracker.adopt`
  (the memory observer calls it with the model's parameters, their ``.grad`` after backward and the
  optimizer's state after its step), and for storages allocated before the tracker started too.

Totals per category, per module and per call site are kept incrementally (an allocation costs a few
dictionary updates), and the breakdown is copied whenever the live total reaches a new high by
:data:`PEAK_RESOLUTION` (at the first free after that high, when the picture is still the peak's), so the
peak breakdown is never more than that share below the true peak.

With ``limit`` set, the op whose outputs take the live total over it raises
:class:`~torchscalpel.runtime.memory_limit.MemoryLimitExceeded` after the tracker has copied what was
live: ``--memory-limit`` is enforced the same way on a CPU and a GPU.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchscalpel.runtime.alias_ops import OPS, op_entry
from torchscalpel.runtime.dynamo_skip import CODE_SKIP_AVAILABLE, force_eager, skip_dynamo_recursively
from torchscalpel.runtime.memory_categories import CATEGORIES, Category
from torchscalpel.runtime.memory_limit import MemoryLimitExceeded, requested_bytes
from torchscalpel.runtime.module_names import split_display_name, user_modules
from torchscalpel.runtime.storage_ledger import StorageLedger
from torchscalpel.runtime.userframes import call_site

PEAK_RESOLUTION = 0.005
"""The peak breakdown is re-copied each time the live total passes the last copy by this share."""

LIVE_TOP = 40
"""Largest live allocations kept in a full copy (at an out-of-memory and at the end)."""

_CUDA_BLOCK = 512
"""The CUDA caching allocator rounds every block up to 512 bytes."""


@dataclass(slots=True)
class Alloc:
    """One live storage."""

    nbytes: int
    category: Category
    site: str
    module: str
    step: int
    op: str
    is_loss: bool = False


class AllocationTracker(StorageLedger[Alloc], TorchDispatchMode):
    """Live bytes by category, module and site, the peak breakdown, and an optional hard limit."""

    def __init__(self, *, limit: int | None = None, device_kind: str = "cpu") -> None:
        super().__init__(CATEGORIES)
        self.limit = limit
        self.device_kind = device_kind
        self.peak = 0
        self.step_peak = 0
        self.by_module: dict[str, int] = {}
        """Live activation bytes per module (the saving module's qualified name)."""
        self.by_site: dict[str, int] = {}
        """Live bytes per call site (``file:line``)."""
        self._peak_copy: dict[str, Any] = {}
        self._copy_at = 0
        self._pending: Alloc | None = None
        self._pending_at: tuple[int, Any, bool] = (0, None, False)
        """(step, phase, accumulating) when the pending high was reached: the copy is taken at a later free,
        after a step end or phase change that allocated nothing (a limit crossed in step 0 was reported as
        the peak of "step 1")."""
        """The allocation that made a new high not copied yet: copied at the next free (see _free)."""
        self.step = 0
        self.phase: str | None = "forward"
        """Set by the memory observer from the runtime's events; None when nothing tells it (a bare limit)."""
        self.committed_step = 0
        """Steps before this index ended with an optimizer step (set by the memory observer). Provisional step ends
        (a forward or backward before the first optimizer step) do not count: activations saved in them are not
        kept across a step, however their step index reads."""
        self.accumulating = False
        """A backward ran since the last optimizer step: gradients live in a forward are being accumulated."""
        self.module_stack: list[str] = []
        self.module_names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self.index_labels: dict[str, str] = {}
        """``blocks.3`` -> ``blocks.3 (Block)`` for every indexed submodule named: the per-block rollup's labels."""
        self.oom: dict[str, Any] | None = None
        """What was live when the limit was crossed (or a device out-of-memory was raised)."""
        self._cuda = device_kind == "cuda"
        self._saved_hooks: Any = None
        self._stance: Any = None
        """dynamo's ``force_eager`` stance while tracking (see runtime.dynamo_skip.force_eager)."""
        self._module_handles: list[Any] = []
        self.allocations = 0

    # ----- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Enter the dispatch mode, the saved-tensor hooks and the module-stack hooks."""
        from torch.nn.modules import module as nn_module

        self._module_handles = [
            nn_module.register_module_forward_pre_hook(self._module_pre),
            nn_module.register_module_forward_hook(self._module_post, always_call=True),
        ]
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved_hooks.__enter__()
        # A compiled model runs eagerly under this mode whatever we do (dynamo refuses frames under a non-infra
        # dispatch mode); the stance keeps dynamo from marking its code "skip" for the rest of the process.
        self._stance = force_eager()
        self.__enter__()

    def stop(self) -> None:
        """Leave everything :meth:`start` entered (safe to call twice)."""
        if self._saved_hooks is None:
            return
        try:
            self.__exit__(None, None, None)
        finally:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
            if self._stance is not None:
                self._stance.__exit__(None, None, None)
                self._stance = None
            for h in self._module_handles:
                h.remove()
            self._module_handles = []

    # ----- the dispatch mode --------------------------------------------------------------
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._dynamo.disable: three Python
        # frames and four eval-frame switches per op, a fifth of the tracker's cost on small ops. Dynamo
        # must still never trace this mode; skip_dynamo_recursively marks its code (C-level, no wrapper),
        # and torch 2.13 refuses to compile any frame while a non-infra dispatch mode is active anyway.
        # A torch without the C-level marker keeps its own wrapper.
        return not CODE_SKIP_AVAILABLE

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except torch.OutOfMemoryError as exc:
            self._record_oom(str(func), requested_bytes(str(exc)), device_error=str(exc).split("\n")[0])
            raise
        # Keyed by id(): an OpOverload's own __hash__ is Python code, a third of this method's cost.
        entry = OPS.get(id(func))
        if entry is None or entry[0] is not func:
            entry = op_entry(func)
        name = entry[1]
        if (
            name is None
        ):  # a view / in-place / out= op returns an input's storage: nothing new (the common case)
            return out
        if type(out) is torch.Tensor:
            self._register(out, name)
        elif isinstance(out, tuple | list):
            for t in out:
                if type(t) is torch.Tensor:
                    self._register(t, name)
        return out

    def _register(self, t: torch.Tensor, name: str) -> None:
        if t.is_meta:
            return  # fake / subclass tensors (filtered by the caller) and meta ones own no storage of their own
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        nbytes = st.nbytes()
        if nbytes == 0:
            return
        if self._cuda and t.is_cuda:
            nbytes = -(-nbytes // _CUDA_BLOCK) * _CUDA_BLOCK
        stack = self.module_stack
        self._add(
            key,
            st,
            Alloc(
                nbytes,
                "optimizer_state" if self.phase == "optimizer" else "temporaries",
                self._site(),
                stack[-1] if stack else "",
                self.step,
                name,
            ),
        )
        if self.limit is not None and self.total > self.limit and self.oom is None:
            self._record_oom(name, nbytes, device_error=None)
            raise MemoryLimitExceeded(self.oom_sentence())

    def _added(self, alloc: Alloc) -> None:
        self.allocations += 1
        self.by_site[alloc.site] = self.by_site.get(alloc.site, 0) + alloc.nbytes
        if self.total > self.step_peak:
            self.step_peak = self.total
        if self.total > self.peak:
            self.peak = self.total
            if self._pending is not None or self.total >= self._copy_at:
                self._pending = alloc
                self._pending_at = (self.step, self.phase, self.accumulating)

    def _release(self, alloc: Alloc) -> None:
        if self._pending is not None:
            # Only allocations happened since the last new high, so the live picture before this free is the
            # one at the peak: one copy per local maximum instead of one per allocation while memory climbs.
            self._copy_peak(self._pending)
        super()._release(alloc)
        n = alloc.nbytes
        left = self.by_site.get(alloc.site, 0) - n
        if left > 0:
            self.by_site[alloc.site] = left
        else:
            self.by_site.pop(alloc.site, None)
        if alloc.category == "activations":
            self._module_sub(alloc.module, n)

    def _module_sub(self, module: str, n: int) -> None:
        left = self.by_module.get(module, 0) - n
        if left > 0:
            self.by_module[module] = left
        else:
            self.by_module.pop(module, None)

    @property
    def peak_copy(self) -> dict[str, Any]:
        """The breakdown at the highest live total, at most :data:`PEAK_RESOLUTION` below it ({} before any)."""
        if self._pending is not None:
            self._copy_peak(self._pending)
        return self._peak_copy

    def restart_peak(self) -> dict[str, Any] | None:
        """Start the peak over from the live total now; return the breakdown of the peak so far (None if none).

        The memory observer calls it at the model's first training forward: a dataset materialised as
        tensors before training can be the run's highest total, and would hide the training step's breakdown.
        """
        before = dict(self.peak_copy) or None
        if before is not None:
            before["total"] = self.peak
        self._peak_copy, self._pending, self._copy_at = {}, None, 0
        self.peak = self.step_peak = self.total
        return before

    def _copy_peak(self, alloc: Alloc) -> None:
        self._pending = None
        self._copy_at = int(self.total * (1 + PEAK_RESOLUTION))
        step, phase, accumulating = self._pending_at
        self._peak_copy = {
            "total": self.total,
            "step": step,
            "phase": phase,
            "accumulating": accumulating,
            "op": alloc.op,
            "module": alloc.module,
            "site": alloc.site,
            "by_category": dict(self.by_category),
            "by_module": dict(self.by_module),
            "by_site": dict(self.by_site),
        }

    # ----- ownership ----------------------------------------------------------------------
    def recategorize(
        self,
        t: torch.Tensor,
        category: Category,
        *,
        only_from: Category | None = None,
        module: str | None = None,
    ) -> None:
        """Give ``t``'s storage ``category`` (start tracking it when it predates the tracker)."""
        if (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)) or t.is_meta:
            return
        st = t.untyped_storage()
        key = st._cdata
        alloc = self.live.get(key)
        if alloc is None:
            nbytes = st.nbytes()
            if nbytes == 0:
                return
            self._add(
                key,
                st,
                Alloc(nbytes, category, "(before the tracker started)", module or "", self.step, "adopted"),
            )
            if category == "activations":
                self.by_module[module or ""] = self.by_module.get(module or "", 0) + nbytes
            return
        if alloc.category == category or (only_from is not None and alloc.category != only_from):
            return
        if alloc.category == "activations":
            self._module_sub(alloc.module, alloc.nbytes)
        self.move(alloc, category)
        if category == "activations":
            alloc.module = module if module is not None else alloc.module
            self.by_module[alloc.module] = self.by_module.get(alloc.module, 0) + alloc.nbytes

    def adopt(self, tensors: Any, category: Category) -> None:
        """Mark every tensor in ``tensors`` (an iterable) as ``category``."""
        with torch.utils._python_dispatch._disable_current_modes():
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    self.recategorize(t, category)

    def mark_loss(self, t: torch.Tensor) -> None:
        """Remember that ``t`` was passed to backward (a loss kept across steps keeps its graph)."""
        if isinstance(t, torch.Tensor) and not t.is_meta:
            alloc = self.live.get(t.untyped_storage()._cdata)
            if alloc is not None:
                alloc.is_loss = True

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            self.recategorize(
                t,
                "activations",
                only_from="temporaries",
                module=self.module_stack[-1] if self.module_stack else "",
            )
        except Exception:  # never break the user's forward over accounting
            pass
        # Detached: same storage and values, but no reference to its grad_fn. Returning ``t`` itself
        # would make an output that its own node saves (relu, tanh, softmax) a reference cycle, freed
        # only by the garbage collector: a graph never backwarded (a logged loss) would outlive its step.
        # A tensor with no grad_fn (a parameter, an input) makes no cycle and is returned as it is.
        if t.grad_fn is None:
            return t
        if (
            type(t) is torch.Tensor
        ):  # our own detach need not go through this mode (a full dispatch round trip)
            with _NO_DISPATCH():
                return t.detach()
        return t.detach()

    # ----- module stack -------------------------------------------------------------------
    def name_modules(self, root: torch.nn.Module) -> None:
        """Names for ``root``'s submodules a user recognises (see :func:`display_name`; the root is its class)."""
        if root in self.module_names:
            return
        # wrappers (Fabric's _forward_module, DDP's module, compile's _orig_mod, ...) named as the model they wrap
        root_name, named = user_modules(root)
        self.module_names[root] = root_name
        for name, m in named:
            if m not in self.module_names:
                self.module_names[m] = name
                path, _cls = split_display_name(name)
                if path.rsplit(".", 1)[-1].isdigit():
                    self.index_labels[path] = name

    def _module_pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self.module_stack.append(self.module_names.get(module) or type(module).__name__)

    def _module_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or not self.module_stack:
            return
        self.module_stack.pop()

    # ----- call sites ---------------------------------------------------------------------
    def _site(self) -> str:
        """The innermost frame of the user's code (:mod:`runtime.userframes`), else the innermost frame of a
        third-party package (a library the user called: Lightning, transformers), as ``file:line``."""
        try:
            f: Any = sys._getframe(3)
        except ValueError:  # a thread with no Python caller (CUDA's autograd device threads run backward ops)
            return "(no Python caller)"
        site = call_site(f)
        return site.user or site.library or "(no Python caller)"

    # ----- copies -------------------------------------------------------------------------
    def live_top(self, n: int = LIVE_TOP) -> list[dict[str, Any]]:
        """The ``n`` largest live storages, largest first."""
        rows = sorted(self.live.values(), key=lambda a: a.nbytes, reverse=True)[:n]
        return [
            {
                "bytes": a.nbytes,
                "category": a.category,
                "site": a.site,
                "module": a.module,
                "step": a.step,
                "op": a.op,
            }
            for a in rows
        ]

    def state(self) -> dict[str, Any]:
        """The live picture now: totals by category, module and site."""
        return {
            "total": self.total,
            "by_category": dict(self.by_category),
            "by_module": dict(self.by_module),
            "by_site": dict(self.by_site),
            "step": self.step,
            "phase": self.phase,
            "accumulating": self.accumulating,
        }

    def _record_oom(self, op: str, request: int | None, *, device_error: str | None) -> None:
        # Activations saved in an earlier step and still live: graphs kept across steps (outputs or losses kept
        # with their graph). Known at the out-of-memory even when too few steps ran to fit a growth slope.
        kept = sum(
            a.nbytes
            for a in self.live.values()
            if a.category == "activations" and a.step < self.committed_step
        )
        self.oom = {
            "op": op,
            "request_bytes": request,
            "site": self._site(),
            "module": self.module_stack[-1] if self.module_stack else "",
            "limit": self.limit,
            "device_error": device_error,
            **self.state(),
            "live": self.live_top(),
            "kept_activations": kept,
        }

    def oom_sentence(self) -> str:
        """One sentence for the exception and the record's error."""
        from torchscalpel.units import fmt_bytes

        o = self.oom or {}
        # Without a step timeline (scalpel run's bare limit: phase None) the step and phase are not known.
        where = f" (step {o.get('step')}, {o.get('phase')})" if o.get("phase") is not None else ""
        return (
            f"memory limit {fmt_bytes(self.limit)} exceeded: {o.get('op')} at {o.get('site')} asked for "
            f"{fmt_bytes(o.get('request_bytes'))} with {fmt_bytes(o.get('total'))} live{where}"
        )


_NO_DISPATCH = torch._C._DisableTorchDispatch


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


skip_dynamo_recursively(
    AllocationTracker.__torch_dispatch__,
    AllocationTracker._pack,
    AllocationTracker._module_pre,
    AllocationTracker._module_post,
    AllocationTracker._storage_died,
)
