"""From a tune record to the edits ``scalpel fix`` proposes: each knob tune kept becomes an
:class:`~torchscalpel.fix.cst.Edit` anchored at a ``file:line`` the run recorded (``sections["sites"]``),
or a :class:`~torchscalpel.fix.planned.Planned` that says why it is not patched and gives the snippet
to apply by hand; a winner is placed whole or refused whole. The knobs placed by the newer edits (fp16,
framework precision, channels_last, checkpointing, fp32 attention) are planned in
:mod:`torchscalpel.fix.locate_knobs`, below this module. Nothing here reads the user's files.

The record's values arrive checked (:mod:`torchscalpel.fix.record_values`: tune's settings as
:class:`~torchscalpel.tune.settings.TuneSettings`, the sites' lines, classes and devices), and the code
an edit inserts is built from them as syntax nodes (:mod:`torchscalpel.fix.code`), never pasted as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchscalpel.fix import code
from torchscalpel.fix.cst import Edit
from torchscalpel.fix.locate_knobs import (
    channels_last_plan,
    checkpointing_plan,
    fp16_plan,
    fp32_attention_plan,
    framework_amp,
    repeated_blocks,
)
from torchscalpel.fix.planned import (
    Planned,
    framework_of,
    kwargs_at_site,
    model_site_refusal,
    one_site,
    script_of,
    used_sites,
)
from torchscalpel.fix.record_values import settings_of, tune_settings
from torchscalpel.fix.record_values import sites as checked_sites
from torchscalpel.record import RunRecord
from torchscalpel.sections import SitesSection, TuneSection

FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
"""Optimizers with a ``fused=True`` implementation on CPU and CUDA in torch 2.13."""
FOREACH_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "SGD", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop"}
)


def tune_plan(record: RunRecord) -> list[Planned]:
    """The edits for the settings tune kept (``sections["tune"]["settings"]``): every part of the winner,
    or, when one part cannot be placed, one refusal of the whole (see :func:`winner_refusal`)."""
    tune = record.section(TuneSection)
    typed = tune_settings(record)  # checked: enums, ints in range, known knob names
    if tune is None or typed is None or typed.is_baseline():
        return []
    parts = settings_plan(record, typed.to_dict())
    blocked = [p for p in parts if p.edit is None and not p.done]
    if not blocked:
        return parts
    # A part of a combined winner alone is not what tune measured (bf16 without fp32 attention ran at
    # 0.81x where the pair ran at 1.32x): the winner is patched whole or not at all.
    return [winner_refusal(record, tune, blocked)]


def placeable(parts: list[Planned]) -> bool:
    """Every part has an edit, or the script already does it."""
    return all(p.edit is not None or p.done for p in parts)


def best_placeable(record: RunRecord) -> tuple[dict[str, Any], Any] | None:
    """The trial tune measured faster than the baseline (verdict ``winner`` or ``faster``) with the
    highest speedup whose every part fix can place, and its :class:`~torchscalpel.tune.speedup.Speedup`;
    None when there is none."""
    from torchscalpel.tune.speedup import speedup_of
    from torchscalpel.tune.states import Verdict

    tune = record.section(TuneSection)
    if tune is None:
        return None
    best: tuple[dict[str, Any], Any] | None = None
    for i, trial in enumerate(tune.trials):
        if not isinstance(trial, dict) or not isinstance(trial.get("settings"), dict):
            continue
        if str(trial.get("verdict")) not in (Verdict.WINNER, Verdict.FASTER):
            continue
        value = speedup_of(trial)
        if value.ratio is None or value.ratio <= 1.0:
            continue  # measured no faster than the baseline beside it: never offered
        if best is not None and value.ratio <= best[1].ratio:
            continue
        # A trial's settings are record data like the kept ones: checked before any edit is planned.
        typed = settings_of(trial["settings"], f"sections.tune.trials[{i}].settings")
        if not typed.is_baseline() and placeable(settings_plan(record, typed.to_dict())):
            best = (trial, value)
    return best


def winner_refusal(record: RunRecord, tune: TuneSection, blocked: list[Planned]) -> Planned:
    """The one ``not patched`` item for a winner with a part fix cannot place: which part and why, and
    the best configuration tune measured that fix can place (with its measured speedup). A winner of one
    part keeps its own label, reason and snippet; a combined one is refused under its label, with the
    winner's whole code as the snippet (tune's ``code_lines``)."""
    from torchscalpel.tune.speedup import speedup_of

    alternative = alternative_text(record)
    parts = settings_plan(record, tune.settings)
    if len(parts) == 1:
        (part,) = blocked
        return Planned.refused(part.label, "tune", part.snippet, f"{part.reason}; {alternative}")
    winner = tune.winner or {}
    label = str(winner.get("label") or " + ".join(p.label for p in parts))
    measured = speedup_of(winner).text() if winner else "-"
    what = "; ".join(f"{p.label} ({p.reason})" for p in blocked)
    reason = (
        f"fix cannot place {what}, and patches no part of the winner alone (a part alone is not what tune "
        + (f"measured at {measured}); " if measured != "-" else "measured); ")
        + alternative
    )
    snippet = "\n".join(tune.code_lines) or "\n".join(p.snippet for p in parts)
    return Planned.refused(label, "tune", snippet, reason)


def alternative_text(record: RunRecord) -> str:
    """``the best config fix can place that tune measured: LABEL, 1.10x faster per step than the baseline
    (...)``, or that there is none."""
    best = best_placeable(record)
    if best is None:
        return "tune measured no other config faster than the baseline that fix can place"
    trial, value = best
    return f"the best config fix can place that tune measured: {trial.get('label')}, {value.sentence()}"


def settings_plan(record: RunRecord, settings: dict[str, Any]) -> list[Planned]:
    """The edits for one configuration of tune's settings (``TuneSettings.to_dict`` form of checked
    settings), each part placed or refused with its reason."""
    tune = record.section(TuneSection) or TuneSection()
    sites = checked_sites(record)
    framework = framework_of(sites)
    script = script_of(record, sites)
    out: list[Planned] = []

    def add(label: str, snippet: str, file: Any, edit: Edit | None, reason: str = "") -> None:
        path = Path(file) if file else None
        if edit is None or path is None:
            out.append(Planned.refused(label, "tune", snippet, reason or "no recorded line to edit"))
        else:
            out.append(Planned(label, "tune", path, edit, snippet))

    if settings.get("optimizer"):
        impl = settings["optimizer"]
        label, snippet = f"optimizer {impl}=True", f"optimizer = torch.optim.AdamW(..., {impl}=True)"
        site, why = one_site(sites.optimizers, "optimizer")
        if (
            framework == "transformers"
            and impl == "fused"
            and used_sites(sites.optimizers)[0].get("class") == "AdamW"
        ):
            add(
                label,
                'TrainingArguments(..., optim="adamw_torch_fused")',
                script,
                Edit(
                    kind="call_anywhere", callee="TrainingArguments", kwargs=(("optim", "adamw_torch_fused"),)
                ),
            )
        elif site is None:
            add(label, snippet, None, None, why)
        elif site.get("class") not in (FUSED_OPTIMIZERS if impl == "fused" else FOREACH_OPTIMIZERS):
            add(label, snippet, None, None, f"{site.get('class')} has no {impl} implementation")
        else:
            other = "foreach" if impl == "fused" else "fused"
            add(
                label,
                f"torch.optim.{site['class']}(..., {impl}=True)",
                site["file"],
                Edit(
                    kind="call_kwargs",
                    line=int(site["line"]),
                    callee=str(site["class"]),
                    kwargs=((impl, True),),
                    drop=(other,),
                ),
            )
    if settings.get("matmul_precision"):
        value = settings["matmul_precision"]
        line = code.statement(code.call("torch.set_float32_matmul_precision", value))
        add(f"matmul precision {value}", line.strip(), script, Edit(kind="global_call", code=line))
    if settings.get("threads"):
        line = code.statement(code.call("torch.set_num_threads", settings["threads"]))
        add(f"threads {settings['threads']}", line.strip(), script, Edit(kind="global_call", code=line))
    if settings.get("amp"):
        out.append(amp_plan(settings["amp"], sites, framework, script))
    loader = settings.get("dataloader") or {}
    if loader:
        out.append(_loader_plan(loader, sites, framework, script))
    if settings.get("compile"):
        out.append(_compile_plan(settings["compile"], sites, framework, script))
    if settings.get("channels_last"):
        out += channels_last_plan(sites, framework)
    if settings.get("checkpointing"):
        out.append(checkpointing_plan(repeated_blocks(tune.facts), sites, framework, script))
    if settings.get("amp_fp32_attention"):
        out += fp32_attention_plan(tune.facts, sites)
    for key in ("cudnn_benchmark", "microbatches"):
        if settings.get(key) is not None:
            out.append(
                Planned.refused(
                    f"{key}={settings[key]}",
                    "tune",
                    _knob_code(settings, key),
                    f"fix does not place {key} edits yet",
                )
            )
    return out


def _knob_code(settings: dict[str, Any], key: str) -> str:
    """Tune's own code lines for the one setting ``key`` (complete: every line the knob writes)."""
    from torchscalpel.tune.apply import code_lines
    from torchscalpel.tune.settings import TuneSettings

    try:
        only = TuneSettings.from_dict({key: settings[key]})
    except (TypeError, ValueError):
        return f"# {key} = {settings[key]!r}"
    return "\n".join(code_lines(only))


def amp_plan(amp: str, sites: SitesSection, framework: str | None, script: Path | None) -> Planned:
    label = f"autocast {amp}"
    if framework is not None:
        return framework_amp(amp, framework, sites, script)
    if amp == "fp16":
        return fp16_plan(sites)
    fwd, bwd = sites.forward, sites.backward
    device = (fwd or {}).get("device") or "cpu"
    header = code.text(code.call("torch.autocast", device_type=device, dtype=code.Name("torch.bfloat16")))
    snippet = f"with {header}:\n    loss = loss_fn(model(x), y)\nloss.backward()"
    if not fwd or not bwd:
        return Planned.refused(label, "tune", snippet, "the run recorded no training forward and backward")
    if fwd.get("autocast"):  # the script's own autocast (nanoGPT's ``with ctx:``) was on at the forward
        return Planned(label, "tune", None, None, snippet, done=True)
    if fwd.get("library") or bwd.get("library"):
        return Planned.refused(
            label,
            "tune",
            snippet,
            f"the forward is called inside {fwd.get('library') or bwd.get('library')}",
        )
    if fwd.get("file") != bwd.get("file"):
        return Planned.refused(
            label, "tune", snippet, "the forward and the backward are called in different files"
        )
    return Planned(
        label,
        "tune",
        Path(fwd["file"]),
        Edit(kind="autocast", line=int(fwd["line"]), end_line=int(bwd["line"]), code=header),
        snippet,
    )


_HF_LOADER = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}


def _loader_plan(
    loader: dict[str, Any], sites: SitesSection, framework: str | None, script: Path | None
) -> Planned:
    kwargs = tuple((k, v) for k, v in loader.items() if v is not None)
    label = "DataLoader " + ", ".join(f"{k}={v}" for k, v in kwargs)
    snippet = "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in kwargs) + ")"
    if framework == "transformers":
        hf = tuple((_HF_LOADER[k], v) for k, v in kwargs)
        return Planned(
            label,
            "tune",
            script,
            Edit(kind="call_anywhere", callee="TrainingArguments", kwargs=hf),
            "TrainingArguments(..., " + ", ".join(f"{k}={v!r}" for k, v in hf) + ")",
        )
    site, why = one_site(sites.dataloaders, "DataLoader")
    if site is None:
        return Planned.refused(label, "tune", snippet, why)
    return kwargs_at_site(label, "tune", site, "DataLoader", kwargs, snippet)


def _compile_plan(
    spec: dict[str, Any], sites: SitesSection, framework: str | None, script: Path | None
) -> Planned:
    target = str(spec.get("target", "model"))  # checked: model, a class or a submodule name
    args: dict[str, Any] = {}
    if spec.get("mode", "default") != "default":
        args["mode"] = spec["mode"]
    if spec.get("backend", "inductor") != "inductor":
        args["backend"] = spec["backend"]
    if spec.get("dynamic") is not None:
        args["dynamic"] = spec["dynamic"]
    call = code.text(code.call("compile", **args))
    quoted = code.text(code.value(target))
    label = f"compile({target})"
    # TrainingArguments(torch_compile=True) leaves use_cache as it is: not what tune measured with it off
    if framework == "transformers" and target == "model" and not args and spec.get("use_cache") is not False:
        return Planned(
            label,
            "tune",
            script,
            Edit(kind="call_anywhere", callee="TrainingArguments", kwargs=(("torch_compile", True),)),
            "TrainingArguments(..., torch_compile=True)",
        )
    site = sites.model or {}
    snippet = (
        f"model.{call}"
        if target == "model"
        else (
            f"for module in model.modules():\n    if type(module).__name__ == {quoted}:\n        module.{call}"
        )
    )
    if why := model_site_refusal(site):
        return Planned.refused(label, "tune", snippet, why)
    if "." in target or (target[:1].islower() and target != "model"):
        return Planned.refused(
            label, "tune", snippet, "fix places compile of the model or of a block class only"
        )
    var = "{var}"  # the name the model line assigns, read from the source by the edit
    inserted = (
        f"{var}.{call}\n"
        if target == "model"
        else (
            f"for _module in {var}.modules():  # compile each {target} block\n"
            f"    if type(_module).__name__ == {quoted}:\n        _module.{call}\n"
        )
    )
    if spec.get("use_cache") is False:  # what tune measured with compile (a transformers model in training)
        inserted += code.cache_off_statement(var)
        snippet += "\n" + code.cache_off_statement("model").strip()
    return Planned(
        label,
        "tune",
        Path(site["file"]),
        Edit(
            kind="after_statement",
            line=int(site["line"]),
            code=inserted,
            marker=f"{{var}}.{call.split('(')[0]}(" if target == "model" else ".compile(",
        ),
        snippet,
    )
