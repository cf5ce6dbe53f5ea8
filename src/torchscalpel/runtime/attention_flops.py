"""FLOP formulas for CPU's fused attention kernels, which FlopCounterMode has none for.

``F.scaled_dot_product_attention`` on CPU runs ``aten::_scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``); torch's formulas cover the CUDA kernels of the same computation (``_scaled_dot_product_flash_
attention``, ``_efficient_attention``, cuDNN's), so on CPU a transformer's attention counted nothing. These count
it with torch's own attention formulas (``sdpa_flop_count``, ``sdpa_backward_flop_count``: the two batched matmuls
forward, four backward), as the CUDA kernels are counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any) -> int:
    return int(sdpa_flop_count(query.shape, key.shape, value.shape))


def _cpu_flash_backward(
    grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any
) -> int:
    return int(sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape))


ATTENTION_FORMULAS: dict[Any, Callable[..., int]] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
}
"""Formulas by op overload packet, called as torch's are: the op's own arguments plus ``out_val``."""
