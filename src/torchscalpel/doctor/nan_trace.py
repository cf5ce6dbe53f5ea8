"""Locating the op that first produced a NaN/inf: a dispatch mode checks every op's outputs.

Too slow for the main doctor run, so :func:`torchscalpel.doctor.api.diagnose` re-runs the script up
to the failing step with :class:`NanOpTracer` (and anomaly mode, which names backward ops).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.runtime.dynamo_skip import force_eager


def _bad(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.numel() > 0
        and not bool(torch.isfinite(t).all())
    )


_UNINITIALISED = ("empty", "new_empty", "resize", "set_")
"""Ops whose outputs hold uninitialised memory (may contain NaN bit patterns): never an origin."""


class _Mode(TorchDispatchMode):
    def __init__(self, tracer: NanOpTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(getattr(getattr(func, "overloadpacket", None), "__name__", func))
        if self.tracer.found is None and not name.startswith(_UNINITIALISED):
            try:
                outs, _ = tree_flatten(out)
                if any(_bad(o) for o in outs):
                    ins, _ = tree_flatten((args, kwargs or {}))
                    if not any(_bad(i) for i in ins):
                        self.tracer.found = {
                            "op": name,
                            "location": user_location(),
                            "backward": torch._C._current_autograd_node() is not None,
                        }
            except Exception:  # diagnosing must never break the re-run
                pass
        return out


class NanOpTracer(RuntimeRule):
    """Checks every dispatched op from the start of the run; keeps the first one that made NaN/inf from finite inputs."""

    slugs = ()

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, Any] | None = None
        self._mode: _Mode | None = None
        self._anomaly: Any = None
        self._stance: Any = None

    def on_start(self, session: Any) -> None:
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=True)
        self._mode = _Mode(self)
        # the re-run is eager anyway under a dispatch mode; the stance keeps dynamo from marking the user's compiled
        # code "skip" for the rest of the process (runtime.dynamo_skip.force_eager)
        self._stance = force_eager()
        self._mode.__enter__()

    def on_backward_pre(self, tensors: Any) -> None:
        if self.found is not None and self.session is not None:
            self.session.request_stop("the first non-finite op was found")

    def on_finish(self, record: Any) -> None:
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:
                pass
            self._mode = None
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None
        torch.autograd.set_detect_anomaly(False)
