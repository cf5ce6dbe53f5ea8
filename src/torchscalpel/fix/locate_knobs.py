"""Plans for the tune knobs placed by the newer edits: fp16 with a GradScaler, mixed precision through
accelerate, channels_last, activation checkpointing. Like :mod:`torchscalpel.fix.locate` (which calls these), each is an
edit anchored at the lines the run recorded (``sections["sites"]``) or a :class:`Planned` that says
why not, with the snippet to apply by hand; nothing here reads the user's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchscalpel.fix import code
from torchscalpel.fix.cst import Edit
from torchscalpel.fix.planned import (
    Planned,
    hf_gradient_checkpointing,
    kwargs_at_site,
    model_site_refusal,
    one_site,
)
from torchscalpel.sections import SitesSection

FRAMEWORK_PRECISION: dict[str, dict[str, tuple[str, Any]]] = {
    "transformers": {"bf16": ("bf16", True), "fp16": ("fp16", True)},
    "lightning": {"bf16": ("precision", "bf16-mixed"), "fp16": ("precision", "16-mixed")},
}
"""The framework's own switch for each autocast dtype (HF ``TrainingArguments``, Lightning ``Trainer``)."""
FRAMEWORK_CALLEE = {"transformers": "TrainingArguments", "lightning": "Trainer"}

FP16_SNIPPET = """scaler = torch.amp.GradScaler("{device}")  # after the optimizer is built
with torch.autocast(device_type="{device}", dtype=torch.float16):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.unscale_(optimizer)  # only before clipping
scaler.step(optimizer)
scaler.update()"""


def framework_amp(amp: str, framework: str, sites: SitesSection, script: Path | None) -> Planned:
    """bf16 / fp16 through the framework's switch: HF, Lightning (file-wide call), accelerate (its
    recorded ``Accelerator(...)`` line)."""
    label = f"autocast {amp}"
    if framework == "accelerate":
        snippet = f'Accelerator(..., mixed_precision="{amp}")'
        site = sites.accelerator
        if not site:
            return Planned.refused(label, "tune", snippet, "the run recorded no Accelerator being built")
        if site.get("library"):
            return Planned.refused(
                label, "tune", snippet, f"the Accelerator is built inside {site['library']}"
            )
        return kwargs_at_site(label, "tune", site, "Accelerator", (("mixed_precision", amp),), snippet)
    key, value = FRAMEWORK_PRECISION[framework][amp]
    callee = FRAMEWORK_CALLEE[framework]
    return Planned(
        label,
        "tune",
        script,
        Edit(kind="call_anywhere", callee=callee, kwargs=((key, value),)),
        f"{callee}(..., {key}={value!r})".replace("'", '"'),
    )


def fp16_plan(sites: SitesSection) -> Planned:
    """fp16 autocast with a GradScaler in a plain loop: the optimizer, forward, backward and step lines."""
    fwd, bwd, step = sites.forward or {}, sites.backward or {}, sites.step or {}
    device = fwd.get("device") or "cuda"
    label, snippet = "autocast fp16 + GradScaler", FP16_SNIPPET.format(device=device)
    site, why = one_site(sites.optimizers, "optimizer")
    if site is None:
        return Planned.refused(label, "tune", snippet, why)
    if not fwd or not bwd or not step:
        missing = ", ".join(n for n, s in (("forward", fwd), ("backward", bwd), ("step", step)) if not s)
        return Planned.refused(label, "tune", snippet, f"the run recorded no training {missing} call")
    if fwd.get("autocast"):
        return Planned.refused(
            label, "tune", snippet, "the forward already runs under the script's own autocast"
        )
    inside = next((s.get("library") for s in (fwd, bwd, step) if s.get("library")), None)
    if inside:
        return Planned.refused(label, "tune", snippet, f"the training step is driven inside {inside}")
    if len({site.get("file"), fwd.get("file"), bwd.get("file"), step.get("file")}) != 1:
        return Planned.refused(
            label,
            "tune",
            snippet,
            "the optimizer, forward, backward and step are in different files",
        )
    return Planned(
        label,
        "tune",
        Path(fwd["file"]),
        Edit(
            kind="grad_scaler",
            line=int(site["line"]),
            anchors=(
                ("forward", int(fwd["line"])),
                ("backward", int(bwd["line"])),
                ("step", int(step["line"])),
            ),
            code=code.text(code.call("torch.autocast", device_type=device, dtype=code.Name("torch.float16"))),
            kwargs=(("device", device),),
        ),
        snippet,
    )


CHANNELS_LAST = "{var} = {var}.to(memory_format=torch.channels_last)\n"


def channels_last_plan(sites: SitesSection, framework: str | None) -> list[Planned]:
    """The model converted after its recorded line; the forward's 4-D inputs at the forward's line."""
    label = "channels_last"
    snippet = "model = model.to(memory_format=torch.channels_last)\nx = x.contiguous(memory_format=torch.channels_last)  # each 4-D input batch"
    model, fwd = sites.model or {}, sites.forward or {}
    if framework is not None:
        return [
            Planned.refused(
                label,
                "tune",
                snippet,
                f"{framework} builds and feeds the model; fix places channels_last in plain loops only",
            )
        ]
    if why := model_site_refusal(model):
        return [Planned.refused(label, "tune", snippet, why)]
    out = [
        Planned(
            "channels_last model",
            "tune",
            Path(model["file"]),
            Edit(
                kind="after_statement",
                line=int(model["line"]),
                code=CHANNELS_LAST,
                marker="{var}.to(memory_format=torch.channels_last)",  # the inserted line itself,
            ),
            snippet.splitlines()[0],
        )
    ]
    dims = fwd.get("input_dims")
    inputs = tuple(i for i, d in enumerate(dims or []) if d == 4)
    if not inputs:
        # The knob converts only 4-D inputs: none seen (or an old record without them), none to convert.
        return out
    why = "" if fwd.get("file") and not fwd.get("library") else "the forward is called inside a library"
    out.append(
        Planned(
            "channels_last inputs",
            "tune",
            None if why else Path(fwd["file"]),
            None
            if why
            else Edit(
                kind="channels_last_inputs",
                line=int(fwd["line"]),
                kwargs=(("inputs", inputs), ("arity", len(dims or []))),
                anchors=(("model", int(model["line"])),) if model.get("file") == fwd.get("file") else (),
            ),
            snippet.splitlines()[1],
            why,
        )
    )
    return out


def checkpointing_plan(
    blocks: list[str], sites: SitesSection, framework: str | None, script: Path | None
) -> Planned:
    """Activation checkpointing of each repeated block, after the model line (HF: its own switch)."""
    label = "checkpointing blocks"
    if framework == "transformers":
        return hf_gradient_checkpointing(label, "tune", script)
    names = [b for b in blocks if b.isidentifier()]
    cls = names[0] if names else "Block"
    code = (
        "import functools  # activation checkpointing of each {cls} block\n\n"
        "for _module in {var}.modules():\n"
        '    if type(_module).__name__ == "{cls}":\n'
        "        _module.forward = functools.partial(\n"
        "            torch.utils.checkpoint.checkpoint, _module.forward, use_reentrant=False\n"
        "        )\n"
    ).replace("{cls}", cls)
    snippet = code.replace("{var}", "model")
    model = sites.model or {}
    if not names:
        return Planned.refused(label, "tune", snippet, "tune's facts name no repeated block class")
    if framework is not None:
        return Planned.refused(
            label,
            "tune",
            snippet,
            f"{framework} builds the model's training step; fix checkpoints blocks in plain loops only",
        )
    if why := model_site_refusal(model):
        return Planned.refused(label, "tune", snippet, why)
    return Planned(
        label,
        "tune",
        Path(model["file"]),
        Edit(
            kind="after_statement",
            line=int(model["line"]),
            code=code,
            marker="torch.utils.checkpoint.checkpoint",
        ),
        snippet,
    )


def repeated_blocks(facts: dict[str, Any]) -> list[str]:
    """The repeated block classes tune's facts name (``facts["repeated"][*]["cls"]``), biggest first."""
    return [str(r.get("cls")) for r in facts.get("repeated") or [] if isinstance(r, dict) and r.get("cls")]


FP32_ATTENTION_NAME = "sdpa_fp32"
"""The attention implementation fix registers with transformers for ``amp_fp32_attention``."""

HF_FP32_ATTENTION = """def _sdpa_fp32(module, query, key, value, attention_mask, **kwargs):
    # scalpel tune's amp_fp32_attention: transformers' sdpa attention in float32 under autocast (on a
    # CPU the bf16 attention backward is slower than the float32 one), the model's attention from here on
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    device = query.device.type
    if not torch.is_autocast_enabled(device):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(device_type=device, enabled=False):
        return sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
AttentionInterface.register("NAME", _sdpa_fp32)
AttentionMaskInterface.register("NAME", sdpa_mask)
{var}.set_attn_implementation("NAME")
""".replace("NAME", FP32_ATTENTION_NAME)
"""What tune's ``amp_fp32_attention`` does (``torch.nn.functional.scaled_dot_product_attention`` run on
float32 inputs with autocast off while autocast is on, a floating mask in float32), as code for a
transformers model: its sdpa attention wrapped so and registered as an attention implementation of its
own, which the model is switched to after the line that builds it."""


def fp32_attention_plan(facts: dict[str, Any], sites: SitesSection) -> list[Planned]:
    """``amp_fp32_attention`` placed where the run's attention ran: each of the user's own
    ``scaled_dot_product_attention`` calls (the ``fp32_attention_call`` edit at its line), or a transformers
    model's attention implementation (after the model's recorded line); refused for attention inside
    another library (or a mix) and for a record that does not say where the attention ran."""
    label = "amp_fp32_attention"
    snippet = HF_FP32_ATTENTION.replace("{var}", "model").rstrip("\n")
    found = facts.get("attention_sites")
    called = [s for s in found if isinstance(s, dict)] if isinstance(found, list) else []
    if not called:
        return [
            Planned.refused(
                label,
                "tune",
                OWN_FP32_ATTENTION,
                "the record does not say where the model called scaled_dot_product_attention (re-run scalpel tune)",
            )
        ]
    libraries = {s.get("library") for s in called}
    if libraries == {None}:
        out = []
        for site in called:
            where = f"{Path(str(site.get('file'))).name}:{site.get('line')}"
            out.append(
                Planned(
                    f"amp_fp32_attention ({where})" if len(called) > 1 else label,
                    "tune",
                    Path(str(site["file"])),
                    Edit(kind="fp32_attention_call", line=int(site["line"])),
                    OWN_FP32_ATTENTION,
                )
            )
        return out
    if libraries != {"transformers"}:
        inside = ", ".join(sorted(str(lib) for lib in libraries if lib))
        mixed = " and in your code" if None in libraries else ""
        return [
            Planned.refused(
                label,
                "tune",
                OWN_FP32_ATTENTION,
                f"the attention runs inside {inside}{mixed}; fix places float32 attention in your own "
                "scaled_dot_product_attention calls and through a transformers model's attention implementation",
            )
        ]
    model = sites.model or {}
    # A model transformers builds from the user's line (``AutoModelForCausalLM.from_config(...)``,
    # ``from_pretrained``) is that line's value: the edit then requires the line to hold that call, so a
    # line that builds something else around the model (a Trainer) is refused, never switched.
    from_hf = model.get("library") == "transformers"
    if why := model_site_refusal({**model, "library": None} if from_hf else model):
        return [Planned.refused(label, "tune", snippet, why)]
    return [
        Planned(
            label,
            "tune",
            Path(model["file"]),
            Edit(
                kind="after_statement",
                line=int(model["line"]),
                callee=".from_" if from_hf else "",
                code=HF_FP32_ATTENTION,
                marker=f'.set_attn_implementation("{FP32_ATTENTION_NAME}")',
            ),
            snippet,
        )
    ]


OWN_FP32_ATTENTION = """if torch.is_autocast_enabled(q.device.type):  # tune's amp_fp32_attention
    with torch.autocast(device_type=q.device.type, enabled=False):
        y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
else:
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"""
"""The ``fp32_attention_call`` edit on an example call, the snippet for attention in the user's code."""
