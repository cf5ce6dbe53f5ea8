"""Where the script built its optimizer, DataLoader and model, and where it called forward and backward.

:class:`SitesObserver` rides along every run (the runtime adds it) and fills ``record.sections["sites"]``
(:class:`torchscalpel.sections.SitesSection`): the ``file:line`` of each construction and call, found
from the live stack when it happened, so that ``scalpel fix`` edits the line the run actually went
through instead of guessing one from names. A site is::

    {"file": "/abs/train.py", "line": 41, "class": "AdamW", "library": None, "used": True}

- ``file`` / ``line``: the innermost frame of the user's code (:mod:`torchscalpel.runtime.userframes`),
  skipping the constructor chain of the object itself (a user subclass's ``super().__init__()``);
- ``library``: the installed package whose code made the call when it was not the user's
  (``transformers`` builds the optimizer inside ``Trainer.train()``); the ``file:line`` is then
  the user's line that led there, which is not the place to edit the construction;
- ``used``: the optimizer stepped / the DataLoader yielded a training batch / the model ran the
  training forward (only used ones are worth an edit).

Call sites more, for fix's edits: ``step``, the first ``optimizer.step()`` call (where memory's
``zero_grad(set_to_none=True)`` and fp16's ``scaler.step`` go); ``block``, the first training call of one
of the model's repeated blocks (:func:`torchscalpel.blocks.block_classes`): the line in the model's
``forward`` that activation checkpointing wraps (a block called by torch or a library, ``nn.Sequential``
or a ``transformers`` model, has that package as ``library``); ``accelerator``, the
``accelerate.Accelerator(...)`` construction when the script builds one (where ``mixed_precision`` goes;
wrapped when accelerate is imported, see :func:`when_imported`); and the training forward's positional
inputs' dimensions (``forward["input_dims"]``: channels_last converts the 4-D ones).

Best effort: a site that cannot be read is left out, never the run.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr
from torchscalpel.runtime.userframes import Kind, call_site, file_kind

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord
    from torchscalpel.runtime.session import Session

MAX_SITES = 16
"""Optimizers / DataLoaders kept per run: a script that builds one per step must not grow the record."""


def _package(path: str) -> str | None:
    """``transformers`` for ``.../site-packages/transformers/trainer.py``; None when not installed code."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            return parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else None
    return None


def caller_site(obj: Any, frame: Any) -> dict[str, Any] | None:
    """The site of a call made at or above ``frame``: the user's frame, passing over torch, torchscalpel
    and the constructor chain of ``obj`` itself (the one walk, :func:`~torchscalpel.runtime.userframes.call_site`);
    with ``library`` set to the installed package whose frame was on the way, if any. None when no frame is
    the user's."""
    site = call_site(frame, skip_self=obj)
    if site.file is None:
        return None
    library = None if site.library_file is None else _package(site.library_file)
    return {"file": str(Path(site.file).resolve()), "line": site.line, "library": library}


def _block_class(model: torch.nn.Module) -> type | None:
    """The model's repeated block class (the one definition, :mod:`torchscalpel.blocks`); None when none."""
    from torchscalpel.blocks import block_classes

    try:
        classes = block_classes(model)
    except Exception:  # best effort: a model the walk cannot read has no block site
        return None
    return classes[0] if classes else None


def _module_call_machinery(name: str) -> bool:
    """torch's ``Module.__call__`` frames (``_wrapped_call_impl`` / ``_call_impl``) between a caller and the hooks."""
    return file_kind(name) is Kind.TORCH and Path(name).parts[-3:] == ("nn", "modules", "module.py")


def block_site(frame: Any) -> dict[str, Any] | None:
    """The line that called a block: the frame right above torch's module-call machinery (and ours).

    When that frame is not the user's (``nn.Sequential.forward``, ``torch.utils.checkpoint``, a
    ``transformers`` layer loop), ``library`` names its package and ``file:line`` is the user's line
    that led there: not a place where wrapping the call means checkpointing one block."""
    while frame is not None and (
        file_kind(frame.f_code.co_filename) is Kind.SCALPEL
        or _module_call_machinery(frame.f_code.co_filename)
    ):
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_code.co_filename
    kind = file_kind(name)
    if kind is Kind.USER:
        return {"file": str(Path(name).resolve()), "line": frame.f_lineno, "library": None}
    site = caller_site(None, frame)
    if site is None:
        return None
    return {
        **site,
        "library": "torch" if kind is Kind.TORCH else (_package(name) or site.get("library") or "a library"),
    }


class SitesObserver(Observer):
    """Records construction and call sites into ``record.sections["sites"]`` (see the module doc)."""

    name = "sites"

    def __init__(self) -> None:
        self.optimizers: dict[int, dict[str, Any]] = {}
        self.loaders: dict[int, dict[str, Any]] = {}
        # Keyed by id with a weak reference, not a WeakKeyDictionary: that hashes the module, and a
        # torchmetrics Metric's __hash__ reads state its __init__ has not set yet (Lightning failed so).
        self.modules: dict[int, tuple[weakref.ref[Any], dict[str, Any]]] = {}
        self.model: dict[str, Any] | None = None
        self.forward: dict[str, Any] | None = None
        self.backward: dict[str, Any] | None = None
        self.step: dict[str, Any] | None = None
        self.block: dict[str, Any] | None = None
        self._block_cls: type | None = None
        self.accelerator: dict[str, Any] | None = None
        self._restore: list[Undo] = []

    def on_start(self, session: Session) -> None:
        """Wrap the three constructors (undone at the end)."""
        self._wrap(torch.optim.Optimizer, self.optimizers)
        self._wrap(torch.utils.data.DataLoader, self.loaders)
        self._wrap_module()
        self._restore.append(when_imported("accelerate.accelerator", self._wrap_accelerator))

    def _wrap_accelerator(self, module: Any) -> Undo:
        """Record where the script builds its ``Accelerator`` (the first one)."""
        observer = self

        def make(original: Any) -> Any:
            def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
                original(obj, *args, **kwargs)
                if observer.accelerator is None:
                    site = caller_site(obj, sys._getframe(1))
                    if site is not None:
                        observer.accelerator = {**site, "class": type(obj).__name__}

            return __init__

        return wrap_attr(module.Accelerator, "__init__", make)

    def _wrap(self, cls: type, into: dict[int, dict[str, Any]]) -> None:
        def make(original: Any) -> Any:
            def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
                original(obj, *args, **kwargs)
                if len(into) < MAX_SITES and id(obj) not in into:
                    site = caller_site(obj, sys._getframe(1))
                    if site is not None:
                        into[id(obj)] = {**site, "class": type(obj).__name__, "used": False}

            return __init__

        self._restore.append(wrap_attr(cls, "__init__", make))

    def _wrap_module(self) -> None:
        modules = self.modules

        def make(original: Any) -> Any:
            def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
                original(obj, *args, **kwargs)
                site = caller_site(obj, sys._getframe(1))
                if site is not None:
                    key = id(obj)

                    def forget(_ref: Any, k: int = key) -> None:
                        modules.pop(k, None)

                    try:
                        ref = weakref.ref(obj, forget)
                    except TypeError:  # a module class that cannot be weakly referenced
                        return
                    modules[key] = (ref, {**site, "class": type(obj).__name__})

            return __init__

        # observe_only: a module built inside a compiled forward (a transformers ModuleList slice) is
        # not recorded; reading frames there broke the graph, and the model was built before compile
        self._restore.append(wrap_attr(torch.nn.Module, "__init__", make, observe_only=True))

    def on_forward_pre(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool
    ) -> None:
        """The first training forward of a root module: its call site and where the module was built;
        then the first training call of one of its repeated blocks."""
        if not root:
            # every submodule call comes here: one identity check until the block's call is found
            if self.block is None and type(module) is self._block_cls and torch.is_grad_enabled():
                self.block = block_site(sys._getframe(1))
                if self.block is not None:
                    self.block["class"] = type(module).__name__
            return
        if self.forward is not None or not module.training or not torch.is_grad_enabled():
            return
        self._block_cls = _block_class(module)
        site = caller_site(None, sys._getframe(1))
        if site is None:
            return
        device = next((p.device.type for p in module.parameters()), "cpu")
        try:
            autocast = bool(torch.is_autocast_enabled(device))
        except Exception:
            autocast = False
        dims = [a.dim() if isinstance(a, torch.Tensor) else None for a in args]
        self.forward = {
            **site,
            "class": type(module).__name__,
            "autocast": autocast,
            "device": device,
            "input_dims": dims,
        }
        ref, built = self.modules.get(id(module), (None, None))
        if ref is not None and ref() is module and built is not None:
            self.model = {**built, "used": True}

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """The first backward call's site."""
        if self.backward is None:
            self.backward = caller_site(None, sys._getframe(1))

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        """Mark the optimizer as the one that steps; the first step call's site."""
        if self.step is None:
            # ``optimizer`` skips the frames of its own class (a user's Optimizer subclass calling super().step())
            self.step = caller_site(optimizer, sys._getframe(1))
            if self.step is not None:
                self.step["class"] = type(optimizer).__name__
        entry = self.optimizers.get(id(optimizer))
        if entry is not None:
            entry["used"] = True

    def on_batch(self, batch: Any, loader: Any) -> None:
        """Mark the DataLoader as the one that feeds the steps."""
        entry = self.loaders.get(id(loader)) if loader is not None else None
        if entry is not None:
            entry["used"] = True

    def on_finish(self, record: RunRecord) -> None:
        """Undo the wrappers and write ``sections["sites"]``."""
        from torchscalpel.sections import SitesSection

        undo_all(self._restore)()
        self._restore = []
        record.sections[SitesSection.KEY] = SitesSection(
            optimizers=list(self.optimizers.values()),
            dataloaders=list(self.loaders.values()),
            model=self.model,
            forward=self.forward,
            backward=self.backward,
            step=self.step,
            block=self.block,
            accelerator=self.accelerator,
        ).to_dict()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``name`` is imported, runs ``then(module)`` right after its code ran."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True  # the lookup below asks every finder again, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        exec_module, finder = loader.exec_module, self

        def exec_and_then(module: Any) -> None:
            exec_module(module)
            try:
                finder.then(module)  # read now: after the run's undo it does nothing (a later reload)
            except Exception:  # best effort: a site we cannot record never costs the import
                pass

        loader.exec_module = exec_and_then
        return spec


def when_imported(name: str, wrap: Callable[[Any], Undo]) -> Undo:
    """Call ``wrap(module)`` now if ``name`` is imported, else right after the script imports it
    (a finder first on ``sys.meta_path`` until the run ends); the undo removes the finder and undoes
    what ``wrap`` did. Lets a run wrap a library's class without importing the library itself."""
    undos: list[Undo] = []
    if name in sys.modules:
        try:
            undos.append(wrap(sys.modules[name]))
        except Exception:
            pass
        return undo_all(undos)
    finder = _AfterImport(name, lambda module: undos.append(wrap(module)))
    sys.meta_path.insert(0, finder)

    def undo() -> None:
        finder.then = lambda module: None
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        undo_all(undos)()

    return undo
