"""AMP knob: bf16 autocast around the model's forward.

The outermost module call (the model) runs inside ``torch.autocast(device, dtype=bfloat16)``;
its floating outputs are cast back to float32 so the loss the script computes outside the model
is computed in full precision, as the autocast recipe recommends. Backward runs outside autocast
(it follows the forward's dtypes). bf16 has float32's range, so no GradScaler is needed. On a CUDA
GPU without bf16 (before Ampere) fp16 is tried instead, with a GradScaler the runtime inserts
(:mod:`torchscalpel.tune.knobs.scaler`); on a CPU fp16 matmuls are emulated, so it never is.

Optionally attention stays in float32: on CPUs with avx512_bf16 the bf16 matmuls are several
times faster, but the bf16 flash-attention backward for CPU is ~7x slower than the float32 one
(measured on torch 2.13), so "bf16 except attention" is tried first on CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import (
    LOW_PRECISION,
    ApplyLog,
    Knob,
    RootHooks,
    SetupHook,
    Undo,
    map_tensors,
    module_device,
)
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


class AmpKnob(Knob):
    """bf16 autocast around the model forward."""

    name = "amp"
    numerics = LOW_PRECISION
    description = "bf16 autocast around the model's forward"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.amp is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if not facts.models:
            return [], "no model forward call was seen"
        if not facts.bf16_supported:
            if facts.device == "cuda":
                # Pre-Ampere GPUs: fp16 tensor cores, with the GradScaler the runtime inserts.
                return [TuneSettings(amp="fp16")], None
            how = (
                "; oneDNN would emulate it, converting to float32 per op"
                if facts.bf16_detail == "emulated"
                else ""
            )
            return (
                [],
                f"bf16 is not supported natively on this CPU (no avx512_bf16 or AMX flag{how}), "
                "so autocast would be slower",
            )
        if facts.device == "cpu" and facts.attention_calls != 0:
            return [TuneSettings(amp="bf16", amp_fp32_attention=True), TuneSettings(amp="bf16")], None
        return [TuneSettings(amp="bf16")], None

    def skipped_candidates(self, facts: ModelFacts) -> list[tuple[str, str]]:
        if facts.device == "cpu" and facts.bf16_supported and facts.attention_calls == 0:
            return [
                (
                    "amp=bf16 + amp_fp32_attention",
                    "the model never calls F.scaled_dot_product_attention: nothing to keep in float32",
                )
            ]
        return []

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if settings.amp is None:
            return None
        if settings.amp == "fp16":
            return lambda: install_fp16(log)
        fp32_attention = bool(settings.amp_fp32_attention)

        def hook() -> Undo:
            undo_autocast = install_autocast(torch.bfloat16, log)
            if not fp32_attention:
                return undo_autocast
            undo_attention = patch_attention_fp32(log)

            def undo() -> None:
                undo_attention()
                undo_autocast()

            return undo

        return hook

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.amp is None:
            return []
        if settings.amp == "fp16":
            return [
                'scaler = torch.amp.GradScaler("cuda")',
                'with torch.autocast(device_type="cuda", dtype=torch.float16):  # around the model call',
                "    out = model(inputs)",
                "loss = loss_fn(out.float(), targets)",
                "scaler.scale(loss).backward()",
                "scaler.unscale_(optimizer)  # before clipping",
                "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
                "scaler.step(optimizer)  # skipped when a gradient is inf/NaN",
                "scaler.update()",
            ]
        lines = [
            "with torch.autocast(device_type=device.type, dtype=torch.bfloat16):  # around the model call",
            "    out = model(inputs)",
            "out = out.float()  # compute the loss in float32",
        ]
        if settings.amp_fp32_attention:
            lines += [
                "# attention in float32 inside the autocast region (in the model's forward):",
                'with torch.autocast(device_type="cpu", enabled=False):',
                "    # your call's own arguments (mask, is_causal, dropout_p) stay as they are",
                "    att = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **attention_kwargs)",
            ]
        return lines


def install_fp16(log: ApplyLog) -> Undo:
    """fp16 autocast around the model plus a GradScaler inserted into backward, clipping and the step."""
    from torchscalpel.tune.knobs.scaler import install_grad_scaler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    undo_scaler = install_grad_scaler(device, log)
    undo_autocast = install_autocast(torch.float16, log)

    def undo() -> None:
        undo_autocast()
        undo_scaler()

    return undo


def install_autocast(dtype: torch.dtype, log: ApplyLog) -> Undo:
    """Enter autocast on every root-module call and cast its floating outputs back to float32."""
    stack: list[Any] = []

    def pre(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        device = module_device(module).type
        ctx = torch.autocast(device_type=device, dtype=dtype)
        ctx.__enter__()
        stack.append(ctx)
        log.did(
            "amp", f"autocast({device}, {str(dtype).removeprefix('torch.')}) around {type(module).__name__}"
        )
        return None

    def post(module: torch.nn.Module, output: Any) -> Any:
        if stack:
            stack.pop().__exit__(None, None, None)
        return map_tensors(output, _to_float32)

    return RootHooks(on_pre=pre, on_post=post).install()


def _to_float32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.float()
    return t


def patch_attention_fp32(log: ApplyLog) -> Undo:
    """Make ``F.scaled_dot_product_attention`` run in float32 while autocast is on."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        device = query.device.type
        if not torch.is_autocast_enabled(device):
            return original(query, key, value, *args, **kwargs)
        mask = kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            kwargs["attn_mask"] = mask.float()
        if not torch.compiler.is_compiling():  # a log call inside a compiled region would break the graph
            log.did("amp", "scaled_dot_product_attention kept in float32")
        with torch.autocast(device_type=device, enabled=False):
            return original(query.float(), key.float(), value.float(), *args, **kwargs)

    F.scaled_dot_product_attention = attention

    def undo() -> None:
        F.scaled_dot_product_attention = original

    return undo
