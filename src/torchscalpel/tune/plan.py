"""Profile-guided candidates: the baseline's bottleneck decides what tune tries, and in what order.

Each bottleneck class (:mod:`torchscalpel.tune.bottleneck`) names the knob families that address
it, with the reason shown in the table. The classes that hold are taken strongest first; their
families' candidates come first, in that order; every other applicable knob follows, marked "not
indicated by the profile", so a short budget spends itself on what the profile points at.

A knob may also declare the classes it addresses itself (``Knob.addresses``), so a new knob
registered in :func:`torchscalpel.tune.knobs.all_knobs` is placed without editing this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchscalpel.tune.bottleneck import Bottleneck
from torchscalpel.tune.facts import ModelFacts
from torchscalpel.tune.knobs import Knob
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.states import TrialStatus, Verdict

FAMILIES: dict[str, tuple[str, ...]] = {
    "launch": ("compile", "optimizer"),
    "compute": ("amp", "matmul", "compile", "channels_last", "cudnn", "threads"),
    "data": ("dataloader",),
    "optimizer": ("optimizer",),
    "memory": ("checkpointing", "microbatch", "amp"),
}
"""Knob families per bottleneck class, best first."""

_RATIONALE: dict[tuple[str, str, str], str] = {
    (
        "launch",
        "compile",
        "cuda",
    ): "CUDA graphs (torch.compile mode='reduce-overhead') replay the step's kernels "
    "with one launch; compile also fuses the small kernels",
    ("launch", "compile", "cpu"): "compile fuses ops and removes per-op Python/dispatch overhead "
    "(the CPU analogue of CUDA graphs)",
    ("launch", "optimizer", ""): "a fused optimizer updates every parameter in a few kernels instead of "
    "several per tensor",
    ("compute", "amp", ""): "bf16 autocast: matmuls at bf16 throughput",
    ("compute", "matmul", ""): "TF32 float32 matmuls on tensor cores",
    ("compute", "compile", ""): "compile fuses the elementwise work around the matmuls",
    ("compute", "channels_last", ""): "channels_last convolutions use the faster NHWC kernels",
    ("compute", "cudnn", ""): "cudnn.benchmark picks the fastest conv algorithm per shape",
    ("compute", "threads", ""): "more intra-op threads for the matmul/conv kernels",
    ("data", "dataloader", ""): "DataLoader workers load batches while the model computes",
    ("optimizer", "optimizer", ""): "fused / foreach optimizer kernels",
    ("memory", "checkpointing", ""): "activation checkpointing trades recomputation for activation memory",
    ("memory", "microbatch", ""): "micro-batching lowers the activation peak per forward",
    ("memory", "amp", ""): "bf16 activations take half the memory",
}


_SHORT: dict[tuple[str, str], str] = {
    ("launch", "compile"): "fewer launches / less Python per op",
    ("launch", "optimizer"): "fewer optimizer kernels",
    ("compute", "amp"): "bf16 matmuls",
    ("compute", "matmul"): "TF32 matmuls",
    ("compute", "compile"): "fuse the elementwise work",
    ("compute", "channels_last"): "NHWC conv kernels",
    ("compute", "cudnn"): "fastest conv algorithm",
    ("compute", "threads"): "more intra-op threads",
    ("data", "dataloader"): "load batches ahead",
    ("optimizer", "optimizer"): "fused optimizer kernels",
    ("memory", "checkpointing"): "less activation memory",
    ("memory", "microbatch"): "smaller activation peak",
    ("memory", "amp"): "half-size activations",
}
"""The table's short form of each rationale (the full one is in run.json and the report)."""


def short_reason(kind: str, family: str, device: str) -> str:
    """``compute-bound: bf16 matmuls``: the class and, briefly, what the knob does about it."""
    what = _SHORT.get((kind, family), family)
    if (kind, family, device) == ("launch", "compile", "cuda"):
        what = "CUDA graphs"
    return f"{kind}-bound: {what}"


def mode_reason(settings: TuneSettings, facts: ModelFacts) -> tuple[str, str] | None:
    """(rationale, short form) of a compile candidate whose *mode* the profile chose
    (:func:`torchscalpel.tune.knobs.compile.profile_modes`), in place of the family's; None otherwise."""
    spec = settings.compile
    if spec is None or spec.mode == "default":
        return None
    if spec.mode == "reduce-overhead" and facts.device == "cuda":
        return (
            "CUDA graphs (torch.compile mode='reduce-overhead') replay the step's kernels with one launch",
            "CUDA graphs",
        )
    if spec.mode.startswith("max-autotune"):
        gemm = Bottleneck.from_dict(facts.bottleneck).measures.get("gemm_ops")
        share = f" (matmuls {gemm:.0%} of op time)" if gemm is not None else ""
        where = (
            f"inductor's C++ GEMM templates ({facts.cpu_isa.upper()} micro-kernels) against oneDNN"
            if facts.device == "cpu"
            else "every GEMM / conv kernel choice"
        )
        return (
            f"torch.compile mode='{spec.mode}' benchmarks {where} for each matmul shape{share}; "
            "its compile is much longer, which its pays-back line counts",
            "autotuned GEMMs",
        )
    return None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One planned single-knob trial and why it was chosen."""

    knob: Knob
    settings: TuneSettings
    reason: str
    indicated: bool
    short: str = ""
    """The reason in a few words, for the terminal table."""
    """True when the profile points at this knob (False: tried after the indicated ones)."""


def rationale(kind: str, family: str, device: str) -> str:
    """What a knob family does about a bottleneck class (device-specific when it differs)."""
    return (
        _RATIONALE.get((kind, family, device))
        or _RATIONALE.get((kind, family, ""))
        or f"{family} addresses {kind}-bound steps"
    )


def _families_for(kind: str, knobs: list[Knob]) -> list[str]:
    names = list(FAMILIES.get(kind, ()))
    names += [k.name for k in knobs if kind in getattr(k, "addresses", ()) and k.name not in names]
    return names


def plan_candidates(knobs: list[Knob], facts: ModelFacts) -> tuple[list[Candidate], list[TrialResult]]:
    """Candidates in trial order, each with its reason; and a skipped row per knob that cannot apply."""
    bottleneck = Bottleneck.from_dict(facts.bottleneck)
    skipped: list[TrialResult] = []
    by_family: dict[str, list[TuneSettings]] = {}
    for knob in knobs:
        candidates, reason = knob.candidates(facts)
        if reason:
            skipped.append(
                TrialResult(
                    label=knob.name,
                    settings={},
                    family=knob.name,
                    status=TrialStatus.SKIPPED,
                    cause=reason,
                    verdict=Verdict.SKIPPED,
                )
            )
            continue
        for label, why in knob.skipped_candidates(facts):
            skipped.append(
                TrialResult(
                    label=label,
                    settings={},
                    family=knob.name,
                    status=TrialStatus.SKIPPED,
                    cause=why,
                    verdict=Verdict.SKIPPED,
                )
            )
        if candidates:
            by_family[knob.name] = candidates
    by_name = {k.name: k for k in knobs}
    planned: list[Candidate] = []
    placed: set[str] = set()
    for kind in bottleneck.order():
        for family in _families_for(kind, knobs):
            if family in placed or family not in by_family:
                continue
            placed.add(family)
            why = f"{bottleneck.why(kind)}: {rationale(kind, family, facts.device)}"
            short = short_reason(kind, family, facts.device)
            for s in by_family[family]:
                mode = mode_reason(s, facts)
                planned.append(
                    Candidate(
                        knob=by_name[family],
                        settings=s,
                        reason=f"{bottleneck.why(kind)}: {mode[0]}" if mode else why,
                        indicated=True,
                        short=f"{kind}-bound: {mode[1]}" if mode else short,
                    )
                )
    if bottleneck.kind == "unknown":
        rest_why = f"tried in registry order: {bottleneck.evidence.get('unknown', 'no profile')}"
        rest_short = "no profile: registry order"
    else:
        rest_why = f"not indicated by the profile ({bottleneck.kind}-bound); tried after the indicated knobs"
        rest_short = f"not indicated ({bottleneck.kind}-bound)"
    for knob in knobs:  # registry order: cheap knobs first, compile last
        if knob.name in by_family and knob.name not in placed:
            placed.add(knob.name)
            planned.extend(
                Candidate(knob=knob, settings=s, reason=rest_why, indicated=False, short=rest_short)
                for s in by_family[knob.name]
            )
    return planned, skipped
