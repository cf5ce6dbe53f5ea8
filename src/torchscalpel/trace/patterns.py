"""Op patterns with a named fix, read from the op-line pass (one step recorded with each op's user line).

The op-line pass (:mod:`torchscalpel.runtime.op_lines`) turns one or two profiled steps into a list of
:class:`~torchscalpel.trace.op_events.OpEvent` (defined there with :class:`PassFacts` and the per-op
line table :func:`~torchscalpel.trace.op_events.op_lines`): every op, the user's ``file:line`` that called it, its input shapes, its own time on
the host and on the device, and the kernels it launched. The rules here are plain functions of that
list (no torch: they run on traces built in a test as well as on a live run); each returns
:class:`~torchscalpel.findings.Finding` objects that cite the share of the step the pattern explains
and the line to change:

- ``unfused-attention``: ``matmul -> softmax -> matmul`` from neighbouring lines of one file; its fix is
  the ``F.scaled_dot_product_attention`` call that computes the same, read from the code there (the mask,
  scale and dropout: :mod:`~torchscalpel.trace.attention_code`), never ``is_causal=True`` by default;
- ``sync-in-step``: ``.item()``, ``.cpu()`` copies to the host, ``torch.cuda.synchronize``;
- ``conversions-in-loop``: ``aten::to`` / ``_to_copy`` / ``copy_`` called from the user's lines
  taking a large share of the step;
- ``fp32-matmul`` (CUDA): fp32 GEMM kernels on a GPU whose tensor cores would run TF32 / bf16;
- ``pageable-h2d`` (CUDA): host-to-device copies from pageable memory;
- ``tiny-ops``: most of the step in ops too small to pay for their dispatch (CPU) or launch (GPU).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.findings import Finding, Location, Severity, short_path
from torchscalpel.trace.attention_code import Unread, read_attention
from torchscalpel.trace.op_events import OpEvent, PassFacts, op_cost

MATMULS = frozenset({"aten::matmul", "aten::bmm", "aten::mm", "aten::baddbmm", "aten::einsum"})
SOFTMAXES = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize"})
"""``.item()``, ``float(t)``, ``if t:`` and indexing with a tensor all reach ``aten::_local_scalar_dense``."""
_SYNC_NAMES = {"aten::_local_scalar_dense": ".item()", "aten::copy_": "copy to host"}
CONVERSIONS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
ATTENTION_SPAN = 12
"""Lines between the first matmul and the softmax, and between the softmax and the second matmul, at
most: nanoGPT's manual attention spans 4 lines (q@k, mask, softmax, dropout, @v), minGPT's 5."""
CONVERSION_SHARE = 0.10
"""Share of the step in conversions called from the user's lines above which ``conversions-in-loop`` fires."""
FP32_SHARE = 0.05
H2D_SHARE = 0.02
SYNC_CPU_SHARE = 0.01
"""On a CPU run a ``.item()`` waits for nothing: ``sync-in-step`` fires there only past this share of the step
(nanoGPT's ``get_batch`` indexes with a tensor 16 times a step, 0.0% of it)."""
TINY_US = 10.0
"""An op (CPU self time) or kernel (GPU) shorter than this is tiny: its dispatch or launch costs as much."""
TINY_COUNT = 300
"""Tiny ops per step, at least, for ``tiny-ops`` to fire."""
TINY_SHARE = 0.5
"""Share of the step in tiny ops (CPU) or left idle between tiny kernels (GPU) for ``tiny-ops`` to fire."""


@dataclass(slots=True)
class _Group:
    cost_us: float = 0.0
    calls: int = 0
    names: set[str] = field(default_factory=set)


def _by_site(
    events: Sequence[OpEvent], keep: Callable[[OpEvent], bool], cost: Callable[[OpEvent], float]
) -> tuple[list[tuple[str, _Group]], float]:
    """The events ``keep`` selects that have a user line, grouped by that line: the lines most costly first,
    and their total cost."""
    by_site: dict[str, _Group] = defaultdict(_Group)
    for e in events:
        if e.site and keep(e):
            g = by_site[e.site]
            g.cost_us += cost(e)
            g.calls += 1
            g.names.add(e.name)
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1].cost_us)
    return ranked, sum(g.cost_us for _, g in ranked)


def _split(site: str) -> tuple[str, int]:
    file, _, line = site.rpartition(":")
    return file, int(line) if line.isdigit() else 0


def _pct(x: float, facts: PassFacts) -> str:
    return f"{100 * x / facts.step_us:.1f}%" if facts.step_us > 0 else "not measured: no step time"


_INSTALLED = re.compile(r"^.*/(?:site|dist)-packages/")


def _where(site: str) -> str:
    """``file:line`` for a message: relative to the current folder, an installed package's file from its
    package folder (``transformers/models/gpt2/modeling_gpt2.py:59``)."""
    file, line = _split(site)
    unix = file.replace("\\", "/")
    if _INSTALLED.match(unix):
        return f"{_INSTALLED.sub('', unix)}:{line}"
    return f"{short_path(file)}:{line}"


def _location(site: str) -> Location:
    file, line = _split(site)
    return Location(file=file, line=line)


SDPA_UNREAD = (
    "replace the matmul / mask / softmax / dropout / matmul lines with one fused call, "
    "y = F.scaled_dot_product_attention(q, k, v, attn_mask=..., dropout_p=...), with the mask this code applies: "
    "fix could not read it ({why}); pass a padding or other mask as attn_mask= (boolean: True = take part; "
    "float: added to the scores), and is_causal=True only if it masks every future position and nothing else"
)
"""The fix when the code at the line cannot be read with certainty: it names no is_causal, never guesses causal."""
HF_FIX = (
    "attn_implementation='sdpa': pass it where the model is built (from_pretrained(..., "
    "attn_implementation='sdpa'), AutoModel.from_config(config, attn_implementation='sdpa'), or the config's "
    "attn_implementation), not by editing the library; 'flash_attention_2' on a GPU with the flash-attn package"
)


def read_source(file: str) -> str | None:
    """The text of the user's file the attention is in (None when it cannot be read: a test's made-up path)."""
    try:
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _attention_fix(file: str, line: int, library: bool) -> tuple[str, list[str]]:
    """The fix for attention written op by op in ``file`` whose scores are computed at ``line``, and the
    evidence of the mask: the user's own code is rewritten into the fused call that computes the same
    (:mod:`~torchscalpel.trace.attention_code`: the mask, scale and dropout read from the code); a
    library's is switched by its own option (transformers' attn_implementation), never edited."""
    if library:
        if "/transformers/" in file.replace("\\", "/"):
            return HF_FIX, []
        return (
            "the attention is the library's code: switch it to its fused attention (an option such as "
            "attn_implementation='sdpa', or a newer version that calls F.scaled_dot_product_attention)"
        ), []
    source = read_source(file)
    if source is None:
        return SDPA_UNREAD.format(why=f"{short_path(file)} could not be read"), []
    try:
        code = read_attention(source, line)
    except Unread as exc:
        return SDPA_UNREAD.format(why=str(exc)), [f"mask: not read: {exc}"]
    return (
        f"replace lines {code.first}-{code.last} (the scores to the weighted sum) with one fused call: "
        f"{code.statement_text()}"
    ), [f"mask: {code.mask_text()}"]


def unfused_attention(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """``matmul -> softmax -> matmul`` from lines of one file within :data:`ATTENTION_SPAN` of each other.

    The lines are the code's (:attr:`OpEvent.code_site`): when an installed package computes the
    attention (transformers' eager attention), the chain is found in the package's lines, and the finding
    names them with the user's line that reached them and the package's own switch as the fix.
    """
    calls = sorted(
        (e for e in events if e.code_site and e.parent is None and not e.backward), key=lambda e: e.start_us
    )
    chains: dict[tuple[str, int, int], int] = defaultdict(int)
    reached: dict[tuple[str, int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for i, s in enumerate(calls):
        if s.name not in SOFTMAXES or not s.shapes or len(s.shapes[0]) < 3:
            continue
        file, line = _split(s.code_site or "")
        before = next(
            (
                e
                for e in reversed(calls[:i])
                if e.name in MATMULS
                and _split(e.code_site or "")[0] == file
                and 0 <= line - _split(e.code_site or "")[1] <= ATTENTION_SPAN
            ),
            None,
        )
        after = next(
            (
                e
                for e in calls[i + 1 :]
                if e.name in MATMULS
                and _split(e.code_site or "")[0] == file
                and 0 <= _split(e.code_site or "")[1] - line <= ATTENTION_SPAN
            ),
            None,
        )
        if before is None or after is None:
            continue
        key = (file, _split(before.code_site or "")[1], _split(after.code_site or "")[1])
        chains[key] += 1
        if s.library_site and s.site:
            reached[key][s.site] += 1
    out = []
    for key, n in chains.items():
        file, first, last = key
        cost = sum(
            op_cost(e)
            for e in events
            if e.code_site and _split(e.code_site)[0] == file and first <= _split(e.code_site)[1] <= last
        )
        site = f"{file}:{first}"
        users = sorted(reached.get(key, {}).items(), key=lambda kv: -kv[1])
        where = f"at {_where(site)}-{last}"
        evidence = [
            f"{n} call(s) per {facts.steps} step(s): matmul at line {first}, softmax, matmul at line {last}",
            f"ops of lines {first}-{last}, forward and backward: {cost / 1000:.2f} ms of "
            f"{facts.step_us / 1000:.2f} ms ({_pct(cost, facts)}); the T x T score matrix is kept for backward",
        ]
        if users:
            # The library's line is what runs; the user's line is where the user can act (and what a
            # report links to): the finding's location is the user's line, the message names both.
            where = f"in {_where(site)}-{last} (library code), reached from {_where(users[0][0])}"
            evidence.append(
                "reached from the user's line(s): "
                + ", ".join(f"{_where(u)} ({k} call(s))" for u, k in users)
            )
        fix, mask = _attention_fix(file, first, bool(users))
        evidence.extend(mask)
        out.append(
            Finding(
                rule="unfused-attention",
                severity=Severity.WARNING,
                message=f"attention computed op by op (matmul, softmax, matmul) {where}: "
                f"{_pct(cost, facts)} of the step in its forward and backward ops",
                evidence=evidence,
                fix=fix,
                location=_location(users[0][0] if users else site),
            )
        )
    return out


def syncs_in_step(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """Host-device synchronisations called from the user's lines, by line, with their share."""
    by_site: dict[str, _Group] = defaultdict(_Group)
    for e in events:
        to_host = any("DtoH" in k for k in e.kernels)
        if not e.site or not (e.name in SYNC_OPS or (to_host and e.name in CONVERSIONS)):
            continue
        if e.name in SYNC_OPS and (e.parent in SYNC_OPS or e.parent in CONVERSIONS):
            continue  # the stream sync inside .item() or a copy to the host: counted once, in the outer call
        if facts.cuda and e.name == "aten::_local_scalar_dense" and not to_host:
            continue  # .item() of a CPU tensor on a GPU run: nothing to wait for
        g = by_site[e.site]
        g.cost_us += e.total_us  # host time: on a GPU it includes the wait for the queue to drain
        g.calls += 1
        g.names.add(_SYNC_NAMES.get(e.name, e.name))
    if not by_site:
        return []
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1].cost_us)
    total = sum(g.cost_us for _, g in ranked)
    if not facts.cuda and (facts.step_us <= 0 or total / facts.step_us < SYNC_CPU_SHARE):
        return []
    lines = [
        f"{_where(site)}: {g.calls} call(s) ({', '.join(sorted(g.names))}), {g.cost_us / 1000:.2f} ms, "
        f"{_pct(g.cost_us, facts)} of the step"
        for site, g in ranked
    ]
    if facts.cuda:
        message = (
            f"{sum(g.calls for _, g in ranked)} synchronising call(s) inside the step: the host waits for the GPU "
            f"at each ({_pct(total, facts)} of the step)"
        )
        severity = Severity.WARNING
    else:
        message = (
            f"{sum(g.calls for _, g in ranked)} synchronising call(s) inside the step take {_pct(total, facts)} "
            "of it on this CPU run; on a GPU each one also stalls the host until the queue drains"
        )
        severity = Severity.INFO
    return [
        Finding(
            rule="sync-in-step",
            severity=severity,
            message=message,
            evidence=lines,
            fix="keep losses and metrics as tensors inside the loop (running = running + loss.detach()) and "
            "call .item() / .cpu() / print every N steps; drop torch.cuda.synchronize() from the step",
            location=_location(ranked[0][0]),
        )
    ]


def conversions_in_loop(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """``to`` / ``_to_copy`` / ``copy_`` called from the user's lines (not inside other ops) dominating."""
    ranked, total = _by_site(
        events,
        lambda e: e.parent is None and not e.backward and e.name in CONVERSIONS,
        lambda e: max(e.total_us, e.device_us),
    )
    if facts.step_us <= 0 or total / facts.step_us < CONVERSION_SHARE:
        return []
    return [
        Finding(
            rule="conversions-in-loop",
            severity=Severity.WARNING,
            message=f"dtype / device conversions take {_pct(total, facts)} of the step, most at {_where(ranked[0][0])}",
            evidence=[
                f"{_where(site)}: {g.calls} call(s) ({', '.join(sorted(g.names))}), {g.cost_us / 1000:.2f} ms "
                f"({_pct(g.cost_us, facts)})"
                for site, g in ranked[:5]
            ],
            fix="convert once, outside the loop: move the model and fixed tensors to the device and dtype "
            "before training, have the dataset yield the dtype the model wants, and use autocast instead "
            "of casting activations by hand",
            location=_location(ranked[0][0]),
        )
    ]


def _fp32_gemm(kernel: str) -> bool:
    k = kernel.lower()
    if any(t in k for t in ("tf32", "bf16", "f16", "fp16", "half", "tensorop", "hmma", "i8")):
        return False
    return "sgemm" in k or ("gemm" in k and ("f32" in k or "fp32" in k))


def fp32_matmuls(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """fp32 GEMM kernels (no tensor cores) on a GPU that has them."""
    cc = facts.compute_capability
    if not facts.cuda or cc is None or cc < (7, 0):
        return []
    ranked, total = _by_site(
        events, lambda e: e.device_us > 0 and any(_fp32_gemm(k) for k in e.kernels), lambda e: e.device_us
    )
    if facts.step_us <= 0 or total / facts.step_us < FP32_SHARE:
        return []
    fix = (
        "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high')), "
        "or train under torch.autocast('cuda', dtype=torch.bfloat16)"
        if cc >= (8, 0)
        else "train under torch.autocast('cuda', dtype=torch.float16) with a GradScaler (this GPU has "
        "fp16 tensor cores, not TF32 or bf16)"
    )
    return [
        Finding(
            rule="fp32-matmul",
            severity=Severity.WARNING,
            message=f"fp32 matmuls without tensor cores take {_pct(total, facts)} of the step "
            f"(compute capability {cc[0]}.{cc[1]})",
            evidence=[
                f"{_where(site)}: {g.calls} fp32 GEMM call(s), {g.cost_us / 1000:.2f} ms on the GPU "
                f"({_pct(g.cost_us, facts)})"
                for site, g in ranked[:5]
            ],
            fix=fix,
            location=_location(ranked[0][0]),
        )
    ]


def pageable_copies(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """Host-to-device copies from pageable memory (the copy cannot overlap, and is staged twice)."""
    if not facts.cuda:
        return []
    ranked, total = _by_site(
        events,
        lambda e: any("HtoD" in k and "Pageable" in k for k in e.kernels),
        lambda e: max(e.total_us, e.device_us),
    )
    if facts.step_us <= 0 or total / facts.step_us < H2D_SHARE:
        return []
    return [
        Finding(
            rule="pageable-h2d",
            severity=Severity.WARNING,
            message=f"host-to-device copies from pageable memory take {_pct(total, facts)} of the step, "
            f"most at {_where(ranked[0][0])}",
            evidence=[
                f"{_where(site)}: {g.calls} pageable copy call(s), {g.cost_us / 1000:.2f} ms ({_pct(g.cost_us, facts)})"
                for site, g in ranked[:5]
            ],
            fix="DataLoader(..., pin_memory=True) and x = x.to(device, non_blocking=True): the copy runs from "
            "pinned memory and overlaps the GPU's work",
            location=_location(ranked[0][0]),
        )
    ]


def tiny_ops(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """Most of the step in ops too small to pay for their dispatch (CPU) or their launch (GPU)."""
    if facts.step_us <= 0:
        return []
    if facts.cuda:
        kernels = [e for e in events if e.device_us > 0]
        tiny = [e for e in kernels if e.device_us < TINY_US]
        busy = sum(e.device_us for e in kernels)
        idle = 1.0 - busy / facts.step_us
        per_step = len(tiny) / max(facts.steps, 1)
        if per_step < TINY_COUNT or idle < TINY_SHARE:
            return []
        what = (
            f"{per_step:.0f} kernels per step shorter than {TINY_US:.0f} us and the GPU idle "
            f"{100 * idle:.0f}% of the step: launch-bound"
        )
        fix = (
            "torch.compile(model) fuses the small kernels; mode='reduce-overhead' (CUDA graphs) removes the "
            "launches when shapes are static"
        )
        cost = idle * facts.step_us
    else:
        ops = [e for e in events if e.name.startswith("aten::")]
        tiny = [e for e in ops if e.self_us < TINY_US]
        per_step = len(tiny) / max(facts.steps, 1)
        # Host time in tiny ops, plus the Python between them: the step minus the time in ops that are not tiny.
        big = sum(e.self_us for e in ops if e.self_us >= TINY_US)
        cost = max(facts.step_us - big, 0.0)
        if per_step < TINY_COUNT or cost / facts.step_us < TINY_SHARE:
            return []
        what = (
            f"{per_step:.0f} ops per step shorter than {TINY_US:.0f} us each; the step spends "
            f"{_pct(cost, facts)} outside ops that do real work: per-op overhead"
        )
        fix = (
            "torch.compile(model) fuses the small ops into few kernels; or batch the work (one op over a "
            "stacked tensor instead of a Python loop of small ones)"
        )
    by_site: dict[str, _Group] = defaultdict(_Group)
    for e in tiny:
        if e.site:
            by_site[e.site].calls += 1
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1].calls)
    return [
        Finding(
            rule="tiny-ops",
            severity=Severity.WARNING,
            message=what,
            evidence=[f"{_where(site)}: {g.calls} tiny op(s) per pass" for site, g in ranked[:5]],
            fix=fix,
            location=_location(ranked[0][0]) if ranked else None,
        )
    ]


PATTERN_RULES = (
    "unfused-attention",
    "sync-in-step",
    "conversions-in-loop",
    "fp32-matmul",
    "pageable-h2d",
    "tiny-ops",
)
"""The slugs of the findings these rules make, in the order they are reported."""
RULES = (unfused_attention, syncs_in_step, conversions_in_loop, fp32_matmuls, pageable_copies, tiny_ops)
"""Every pattern rule, in the order findings are reported."""


def find_patterns(events: Sequence[OpEvent], facts: PassFacts) -> list[Finding]:
    """Every rule over the pass's events."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(events, facts))
    return out
