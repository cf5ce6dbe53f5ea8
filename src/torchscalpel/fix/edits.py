"""Which editor makes each edit kind, and :func:`apply_edit`, the one way an edit is made.

Every edit is anchored at a line the run recorded (the planners: :mod:`torchscalpel.fix.locate`,
:mod:`torchscalpel.fix.doctor_plan`, :mod:`torchscalpel.fix.memory_plan`,
:mod:`torchscalpel.fix.profile_plan`) and either changes the code there, finds it already changed
(``already``: running fix twice gives no diff), or refuses with a reason (``not patched``): it never
looks elsewhere for a likely-looking line. libcst keeps everything it does not touch byte for byte
(comments, blank lines, the user's layout).

This module sits above every editor and imports each family plainly; the editors know nothing of it
(they build on :mod:`torchscalpel.fix.cst`, the edit types and the shared libcst helpers). The
families, one module each under :mod:`torchscalpel.fix.editors`:

- :mod:`~torchscalpel.fix.editors.calls`: ``call_kwargs``, ``call_anywhere``, ``global_call``,
  ``after_statement`` (tune's plain settings);
- :mod:`~torchscalpel.fix.editors.amp`: ``autocast``, ``grad_scaler``, ``fp32_attention_call``;
- :mod:`~torchscalpel.fix.editors.checkpoint`: ``save_state_dict``, ``safe_load``;
- :mod:`~torchscalpel.fix.editors.memory`: ``checkpoint_call``, ``zero_grad_after_step``, ``batch_accum``;
- :mod:`~torchscalpel.fix.editors.layout`: ``channels_last_inputs``;
- :mod:`~torchscalpel.fix.editors.attention`: ``sdpa`` (profile's ``unfused-attention``);
- :mod:`~torchscalpel.fix.editors.doctor`: the doctor-finding kinds, over
  :mod:`~torchscalpel.fix.editors.loop`, :mod:`~torchscalpel.fix.editors.eval` and
  :mod:`~torchscalpel.fix.editors.model`.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper

from torchscalpel.fix.cst import Edit, EditError, Editor, Outcome
from torchscalpel.fix.editors import amp, attention, calls, checkpoint, doctor, layout, memory

EDITORS: dict[str, Editor] = {
    **doctor.EDITORS,  # set_epoch, no_grad, eval_mode, detach_kept, unscale_before_clip, shuffle, ...
    "call_kwargs": calls.call_kwargs,
    "call_anywhere": calls.call_kwargs,
    "global_call": calls.global_call,
    "autocast": amp.wrap_in_autocast,
    "after_statement": calls.after_statement,
    "save_state_dict": checkpoint.save_state_dict,
    "safe_load": checkpoint.safe_load,
    **memory.EDITORS,  # checkpoint_call, zero_grad_after_step, batch_accum
    "grad_scaler": amp.grad_scaler,
    "fp32_attention_call": amp.fp32_attention_call,
    "channels_last_inputs": layout.channels_last_inputs,
    "sdpa": attention.sdpa,  # unfused-attention (profile)
}
"""The editor of each kind."""
EDIT_KINDS = tuple(EDITORS)
"""Every kind an :class:`~torchscalpel.fix.cst.Edit` may have."""


def apply_edit(source: str, edit: Edit) -> tuple[str, Outcome]:
    """``source`` with ``edit`` made, and what happened. Never raises for an edit that cannot be placed:
    the outcome is ``refused`` with the reason and the source comes back unchanged."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return source, Outcome("refused", f"libcst cannot parse the file ({exc.message})")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    try:
        new = EDITORS[edit.kind](module, wrapper, edit)
    except EditError as exc:
        return source, Outcome("refused", str(exc))
    if new is None or new.code == source:
        return source, Outcome("already")
    return new.code, Outcome("applied")
