"""FLOP formulas for the fused recurrent kernels FlopCounterMode has none for.

torch's formulas (``torch.utils.flop_counter.flop_registry``) cover matmul, convolution and attention.
A recurrent layer reaches them only when it decomposes into matmuls: ``nn.GRU`` / ``nn.RNN`` and every
``*Cell`` on CPU do (``aten::gru`` and the cell ops are composite), but ``nn.LSTM`` on CPU runs oneDNN's
fused kernel (``aten::mkldnn_rnn_layer``, one call per layer and direction) and every recurrent layer on
a GPU runs cuDNN's (``aten::_cudnn_rnn``) or MIOpen's (``aten::miopen_rnn``): FlopCounterMode counts
nothing for them, though they are the model's matmuls (an LSTM language model's largest op).

The formulas count what FlopCounterMode counts for the same recurrence written with matmuls: two FLOPs
per multiply-add of every weight matrix with every token (input-to-hidden, hidden-to-hidden and, with
``proj_size``, the projection), biases and gate nonlinearities left out as they are for ``addmm``. The
backward kernels compute the gradients of the input, the initial state and the weights whatever needs
them, so their count is twice the forward's (a data pass and a weight pass, each one matmul per weight
matrix per token); cuDNN's and MIOpen's ``output_mask`` drop the weight pass when no weight needs a
gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_aten = torch.ops.aten


def _tokens(x: torch.Tensor) -> int:
    """Timesteps times batch: a (seq, batch, feature) or (batch, seq, feature) input, or a packed
    (tokens, feature) one."""
    if x.dim() == 3:
        return int(x.shape[0]) * int(x.shape[1])
    if x.dim() == 2:
        return int(x.shape[0])
    return 1


def _matrix_elements(weights: Sequence[Any]) -> int:
    """Elements of the weight matrices (2-D tensors) in ``weights``; the biases (1-D) are left out."""
    return sum(int(w.numel()) for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2)


def recurrent_flops(tokens: int, weights: Sequence[Any]) -> int:
    """Forward matmul FLOPs of a recurrent layer: every token times every weight matrix, two per
    multiply-add (the sum of ``2 * tokens * out * in`` over the matrices)."""
    return 2 * tokens * _matrix_elements(weights)


def _mkldnn_rnn_layer(
    input: torch.Tensor, weight0: torch.Tensor, weight1: torch.Tensor, *_: Any, **__: Any
) -> int:
    return recurrent_flops(_tokens(input), (weight0, weight1))


def _mkldnn_rnn_layer_backward(
    input: torch.Tensor, weight1: torch.Tensor, weight2: torch.Tensor, *_: Any, **__: Any
) -> int:
    return 2 * recurrent_flops(_tokens(input), (weight1, weight2))


def _fused_rnn(input: torch.Tensor, weight: Sequence[Any], *_: Any, **__: Any) -> int:
    return recurrent_flops(_tokens(input), weight)


def _fused_rnn_backward(input: torch.Tensor, weight: Sequence[Any], *args: Any, **kwargs: Any) -> int:
    mask = kwargs.get("output_mask", args[-1] if args else None)
    forward = recurrent_flops(_tokens(input), weight)
    if not isinstance(mask, list | tuple) or len(mask) != 4:
        return 2 * forward
    return forward * (int(any(mask)) + int(bool(mask[3])))


RECURRENT_FORMULAS: dict[Any, Callable[..., int]] = {
    _aten.mkldnn_rnn_layer: _mkldnn_rnn_layer,
    _aten.mkldnn_rnn_layer_backward: _mkldnn_rnn_layer_backward,
    _aten._cudnn_rnn: _fused_rnn,
    _aten._cudnn_rnn_backward: _fused_rnn_backward,
    _aten.miopen_rnn: _fused_rnn,
    _aten.miopen_rnn_backward: _fused_rnn_backward,
}
"""Formulas by op overload packet, called as torch's are: the op's own arguments plus ``out_val``."""
