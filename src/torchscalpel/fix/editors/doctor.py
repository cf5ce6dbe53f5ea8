"""The libcst edits for doctor findings whose fix is one mechanical change at the finding's line.

Like every editor (:mod:`torchscalpel.fix.editors`; :func:`torchscalpel.fix.edits.apply_edit`
dispatches here), every one starts from the statement at the recorded line, reads from the code there the
names it needs (the sampler, the epoch variable, the model, the scaler and optimizer, the kept loss),
and raises :class:`~torchscalpel.fix.cst.EditError` (``not patched``) when the code is not what the
rule saw, instead of looking elsewhere. Each returns None when the fix is already there, so a second
``scalpel fix`` gives no diff.

The editors live by job: :mod:`~torchscalpel.fix.editors.loop` (the training loop),
:mod:`~torchscalpel.fix.editors.eval` (evaluation code), :mod:`~torchscalpel.fix.editors.model` (a model
class, single statements), over the shared helpers of :mod:`~torchscalpel.fix.cst`; this module
registers them, each refusing a code shape it was not written for in one sentence.

The kinds:

- ``set_epoch`` (``sampler-set-epoch-missing``): ``SAMPLER.set_epoch(EPOCH)`` as the first statement
  of the epoch loop, the ``for`` loop around the loop over the DataLoader whose sampler it is. The
  line is that inner loop (runtime) or the statement building the sampler (static).
- ``no_grad`` (``eval-without-no-grad``): the evaluation forward at the line under ``torch.no_grad()``:
  as a decorator of the function that holds it when that function never trains (nanoGPT's
  ``estimate_loss``), else around the innermost loop holding it that never trains, else around the
  statement alone; ``MODEL.eval()`` before and ``MODEL.train()`` after when the run saw those forwards
  in training mode. Never around the training forward's line.
- ``eval_mode`` (``eval-in-train-mode``): ``MODEL.eval()`` before the ``with torch.no_grad():`` block
  (or at the top of the ``@torch.no_grad()`` function) holding the forward, ``MODEL.train()`` after it.
- ``detach_kept`` (``loss-graph-retained``): in the loop (or function) of the backward at the line,
  ``X += loss`` becomes ``X += loss.item()`` (``.detach()`` when the file uses ``X`` as a tensor) and
  ``X.append(loss)`` becomes ``X.append(loss.detach())``.
- ``unscale_before_clip`` (``clip-before-unscale``): ``SCALER.unscale_(OPT)`` before the clipping call,
  with the names read from the ``SCALER.step(OPT)`` that follows it.
- ``shuffle`` (``train-loader-not-shuffled``): ``shuffle=True`` on the ``DataLoader(...)`` the loop at
  the line iterates, or on its ``DistributedSampler(..., shuffle=False)``.
- ``module_container`` (``module-in-plain-container``): ``self.x = [...]`` / ``{...}`` at the line
  becomes ``nn.ModuleList([...])`` / ``nn.ModuleDict({...})``.
- ``register_buffer`` (``tensor-attribute-not-registered``): ``self.x = <tensor>`` in ``__init__``
  becomes ``self.register_buffer("x", <tensor>)``.
- ``super_init_first`` (``super-init-missing``): ``super().__init__()`` as the first statement of the
  ``__init__`` at the line (moved there when it comes later and takes only the parameters).
- ``delete_statement`` (``empty-cache-in-loop``, ``cudnn-disabled``): the statement at the line, when it
  is exactly ``torch.cuda.empty_cache()`` / ``torch.backends.cudnn.enabled = False`` (``callee`` says
  which); a block left empty gets ``pass``. Already done: no such statement is left in the file.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper

from torchscalpel.fix.cst import Edit, EditError, Editor
from torchscalpel.fix.editors.eval import eval_mode_edit, no_grad_edit
from torchscalpel.fix.editors.loop import (
    detach_kept_edit,
    set_epoch_edit,
    shuffle_edit,
    unscale_before_clip_edit,
)
from torchscalpel.fix.editors.model import (
    delete_statement_edit,
    module_container_edit,
    register_buffer_edit,
    super_init_first_edit,
)

KINDS = (
    "set_epoch",
    "no_grad",
    "eval_mode",
    "detach_kept",
    "unscale_before_clip",
    "shuffle",
    "module_container",
    "register_buffer",
    "super_init_first",
    "delete_statement",
)
"""The kinds this module edits (registered in :data:`torchscalpel.fix.edits.EDITORS`)."""


def _guarded(editor: Editor) -> Editor:
    """``editor``, with a code shape it was not written for refused in one sentence (``not patched``)
    instead of failing the whole ``scalpel fix`` run with a traceback."""

    def edit(module: cst.Module, wrapper: MetadataWrapper, e: Edit) -> cst.Module | None:
        try:
            return editor(module, wrapper, e)
        except EditError:
            raise
        except (AttributeError, IndexError, KeyError, StopIteration, TypeError, ValueError) as exc:
            raise EditError(f"fix cannot read the code around line {e.line} ({type(exc).__name__})") from None

    return edit


EDITORS: dict[str, Editor] = {
    kind: _guarded(editor)
    for kind, editor in {
        "set_epoch": set_epoch_edit,
        "no_grad": no_grad_edit,
        "eval_mode": eval_mode_edit,
        "detach_kept": detach_kept_edit,
        "unscale_before_clip": unscale_before_clip_edit,
        "shuffle": shuffle_edit,
        "module_container": module_container_edit,
        "register_buffer": register_buffer_edit,
        "super_init_first": super_init_first_edit,
        "delete_statement": delete_statement_edit,
    }.items()
}
"""The editor of each kind in :data:`KINDS`."""
