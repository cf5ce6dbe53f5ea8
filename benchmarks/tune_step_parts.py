"""Where char_transformer's / digits_cnn's training step goes, per tune configuration, in one process.

For each configuration (fp32 eager, bf16 autocast, bf16 with attention in float32, + fused AdamW,
compile with and without inductor's own RNG, ...) the example's model takes real training steps
(forward, cross-entropy, backward, clip, optimizer step). Configurations run round-robin, one step
each per round, so machine load drifting over the run hits them alike; the figure is the median
step time and the median of the per-round ratios fp32 / configuration. Then one profile per
configuration named in --profile splits the step into op groups (self CPU time per step).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tune_step_parts.py --script char_transformer --rounds 20

No torchscalpel runtime is attached: this is what the knobs can gain at most on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

GROUPS = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")),
    ("conv", ("convolution", "conv2d", "mkldnn_convolution")),
    ("attention", ("scaled_dot_product",)),
    ("dropout RNG", ("bernoulli", "native_dropout", "rand")),
    ("dtype casts", ("aten::copy_", "aten::_to_copy", "aten::to")),
    ("layer/batch norm", ("layer_norm", "batch_norm")),
    ("gelu/relu", ("gelu", "relu", "threshold")),
    ("embedding + loss", ("embedding", "log_softmax", "nll_loss", "cross_entropy")),
    ("optimizer math", ("lerp", "addcmul", "addcdiv", "sqrt", "_fused_adam", "foreach")),
    ("inductor kernels", ("cpp_fused", "graph_", "## Call CompiledFxGraph")),
)


def group_of(name: str) -> str:
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def char_setup(
    fused: bool,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[], tuple[Any, Any]], int]:
    from char_transformer import CharGPT

    torch.manual_seed(0)
    vocab = 100
    model = CharGPT(vocab, 64, 128, 4, 4)
    opt = torch.optim.AdamW(
        model.parameters(), lr=2e-3, weight_decay=0.01, **({"fused": True} if fused else {})
    )
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[Any, Any]:
        return torch.randint(0, vocab, (32, 64), generator=gen), torch.randint(
            0, vocab, (32, 64), generator=gen
        )

    return model, opt, batch, vocab


def digits_setup(
    fused: bool,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[], tuple[Any, Any]], int]:
    from digits_cnn import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, **({"fused": True} if fused else {}))
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[Any, Any]:
        return torch.rand(64, 1, 8, 8, generator=gen), torch.randint(0, 10, (64,), generator=gen)

    return model, opt, batch, 10


CONFIGS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16": {"amp": True},
    "bf16 + fp32 attention": {"amp": True, "attn32": True},
    "bf16 + fp32 attention + fused": {"amp": True, "attn32": True, "fused": True},
    "fused": {"fused": True},
    "compile(model)": {"compile": True},
    "compile(model) + inductor RNG": {"compile": True, "inductor_rng": True},
    "bf16 + fp32 attention + fused + compile(model)": {
        "amp": True,
        "attn32": True,
        "fused": True,
        "compile": True,
    },
    "channels_last": {"channels_last": True},
    "bf16 + channels_last": {"amp": True, "channels_last": True},
    "bf16 + fused": {"amp": True, "fused": True},
}

DEFAULTS = {
    "char_transformer": [
        "fp32",
        "bf16",
        "bf16 + fp32 attention",
        "bf16 + fp32 attention + fused",
        "fused",
        "compile(model)",
        "compile(model) + inductor RNG",
        "bf16 + fp32 attention + fused + compile(model)",
    ],
    "digits_cnn": [
        "fp32",
        "bf16",
        "bf16 + fused",
        "fused",
        "channels_last",
        "bf16 + channels_last",
        "compile(model)",
    ],
}


def entry_point(model: torch.nn.Module, name: str) -> Callable[[Any], Any]:
    """``lambda x: model(x)`` with a code object of its own per configuration.

    dynamo caches compiled code per code object and, with nn.Module inlining, does not guard on
    the module instance: ``torch.compile(model_a)`` and ``torch.compile(model_b)`` of one class
    share ``forward``'s compiled graph, so the second configuration would silently run the first
    one's graph (compiled under the first one's inductor settings). A separately compiled entry
    function per configuration gets its own cache entry; the model's forward is inlined into it.
    """
    namespace: dict[str, Any] = {"model": model}
    exec(compile("def entry(x):\n    return model(x)\n", f"<step_parts {name}>", "exec"), namespace)
    return namespace["entry"]


class Variant:
    """One configuration: its own model and optimizer (same seed), stepped one step at a time."""

    def __init__(self, script: str, name: str) -> None:
        cfg = CONFIGS[name]
        self.name, self.cfg = name, cfg
        setup = char_setup if script == "char_transformer" else digits_setup
        self.model, self.opt, self.batch, self.vocab = setup(bool(cfg.get("fused")))
        self.model.train()
        if cfg.get("channels_last"):
            self.model = self.model.to(memory_format=torch.channels_last)
        self.forward = self.model
        if cfg.get("compile"):
            self.forward = torch.compile(entry_point(self.model, name))
        self.parts: list[tuple[float, float, float]] = []

    def step(self) -> float:
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = not self.cfg.get("inductor_rng")
        x, y = self.batch()
        if self.cfg.get("channels_last") and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        original = F.scaled_dot_product_attention
        if self.cfg.get("attn32"):

            def attention(q: Any, k: Any, v: Any, *a: Any, **kw: Any) -> Any:
                with torch.autocast("cpu", enabled=False):
                    return original(q.float(), k.float(), v.float(), *a, **kw)

            F.scaled_dot_product_attention = attention
        try:
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(self.cfg.get("amp"))):
                out = self.forward(x)
            out = out.float()
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            t1 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            t3 = time.perf_counter()
        finally:
            F.scaled_dot_product_attention = original
        self.parts.append((t1 - t0, t2 - t1, t3 - t2))
        return t3 - t0


def profile_groups(variant: Variant, steps: int = 3) -> dict[str, float]:
    """Self CPU ms per step of each op group."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            variant.step()
    groups: dict[str, float] = {}
    for evt in prof.key_averages():
        g = group_of(evt.key)
        groups[g] = groups.get(g, 0.0) + evt.self_cpu_time_total / 1000.0 / steps
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", choices=sorted(DEFAULTS), default="char_transformer")
    p.add_argument("--configs", default=None, help=f"';'-separated, from: {'; '.join(CONFIGS)}")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--profile",
        default="fp32;bf16 + fp32 attention + fused",
        help="';'-separated configurations to profile into op groups ('' for none)",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    names = [n.strip() for n in args.configs.split(";")] if args.configs else DEFAULTS[args.script]
    print(f"load average {os.getloadavg()}, threads {torch.get_num_threads()}", flush=True)
    variants = [Variant(args.script, n) for n in names]
    for v in variants:
        t = time.perf_counter()
        for _ in range(args.warmup):
            v.step()
        print(f"{v.name}: warm-up {time.perf_counter() - t:.1f} s", flush=True)
        v.parts.clear()
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            times[v.name].append(v.step())
    ref = times[variants[0].name]
    rows = []
    for v in variants:
        ratios = [b / c for b, c in zip(ref, times[v.name], strict=True)]
        fwd, bwd, opt = (statistics.median(p[i] for p in v.parts) * 1000 for i in range(3))
        rows.append(
            {
                "config": v.name,
                "median_ms": statistics.median(times[v.name]) * 1000,
                "ratio_vs_first": statistics.median(ratios),
                "forward_ms": fwd,
                "backward_ms": bwd,
                "clip_and_step_ms": opt,
            }
        )
    print(f"\n| configuration | ms/step | vs {variants[0].name} | forward + loss | backward | clip + step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['config']} | {r['median_ms']:.1f} | {r['ratio_vs_first']:.2f}x | {r['forward_ms']:.1f} | "
            f"{r['backward_ms']:.1f} | {r['clip_and_step_ms']:.1f} |"
        )
    profiles = {}
    for name in [n.strip() for n in args.profile.split(";") if n.strip()]:
        v = next((x for x in variants if x.name == name), None)
        if v is None:
            continue
        profiles[name] = profile_groups(v)
        shown = ", ".join(f"{g} {ms:.1f}" for g, ms in profiles[name].items() if ms >= 0.5)
        print(f"\nprofile, {name} (self CPU ms per step): {shown}")
    print(f"\nload average {os.getloadavg()}")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "profiles": profiles, "loadavg": os.getloadavg()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
