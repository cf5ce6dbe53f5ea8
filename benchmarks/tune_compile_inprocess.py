"""What the tune runtime adds around a compiled char_transformer step, in one process.

One process, ``OMP_NUM_THREADS=1``; the model, optimizer, clip and LR schedule of
examples/char_transformer.py; each step is the script's step (forward, cross-entropy, zero_grad,
backward, clip_grad_norm_, AdamW, LambdaLR). Variants, timed in interleaved rounds:

- ``eager`` / ``compiled`` (``torch.compile(model)``; with ``--knob`` the tune knob's ``compile(model)`` instead);
- ``+root hooks``: a forward pre/post hook on the root that reads a clock (what the runtime's
  narrowed hooks do around the compiled call);
- ``+backward wrap``: ``torch.Tensor.backward`` wrapped like the runtime's wrapper;
- ``+runtime``: the whole runtime attached (``torchscalpel.profile``, no profiler steps);
- ``fresh`` batches (a new random batch each step, like the DataLoader) against one ``fixed`` batch.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tune_compile_inprocess.py --rounds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("ct", REPO / "examples" / "char_transformer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument(
        "--knob",
        action="store_true",
        help="compile through the tune knob's compile(model) (CompiledRegion) instead of torch.compile",
    )
    p.add_argument(
        "--setups",
        default="plain,+root hooks,+backward wrap,+runtime",
        help="comma-separated variants (plain alone: a process that never attached anything)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    ct = load_script()
    torch.manual_seed(0)
    vocab, block, batch = 96, 64, 32
    eager = ct.CharGPT(vocab, block)
    model_c = ct.CharGPT(vocab, block)
    model_c.load_state_dict(eager.state_dict())
    models = {"eager": eager}
    if not args.knob:
        models["compiled"] = torch.compile(model_c)
    else:
        # Instead of torch.compile(model), not beside it: both compile CharGPT.forward's code, and
        # two backends on one code object recompile on every switch (BACKEND_MATCH) until dynamo's
        # recompile limit sends the frame to eager.
        # the tune knob's own path: compile(model) as a CompiledRegion on the root's forward
        from torchscalpel.tune.knobs import ApplyLog
        from torchscalpel.tune.knobs.compile import install_compile
        from torchscalpel.tune.settings import CompileSpec

        knob = ct.CharGPT(vocab, block)
        knob.load_state_dict(eager.state_dict())
        install_compile(CompileSpec(target="model"), ApplyLog())
        models["compiled"] = knob
    opts = {k: torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01) for k, m in models.items()}
    scheds = {
        k: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 300) / 300)))
        for k, o in opts.items()
    }
    fixed = (torch.randint(0, vocab, (batch, block)), torch.randint(0, vocab, (batch, block)))

    def step(kind: str, fresh: bool) -> float:
        x, y = (
            (torch.randint(0, vocab, (batch, block)), torch.randint(0, vocab, (batch, block)))
            if fresh
            else fixed
        )
        t0 = time.perf_counter()
        logits = models[kind](x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opts[kind].zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(models[kind].parameters(), 1.0)
        opts[kind].step()
        scheds[kind].step()
        return (time.perf_counter() - t0) * 1000

    def root_hooks(kind: str):
        stamp = []
        m = models[kind]
        h = [
            m.register_forward_pre_hook(lambda mod, a: stamp.append(time.perf_counter())),
            m.register_forward_hook(lambda mod, a, o: stamp.append(time.perf_counter()), always_call=True),
        ]
        return lambda: [x.remove() for x in h]

    def backward_wrap(kind: str):
        original = torch.Tensor.backward

        def backward(*a, **k):
            t = time.perf_counter()
            out = original(*a, **k)
            _ = time.perf_counter() - t
            return out

        torch.Tensor.backward = backward
        return lambda: setattr(torch.Tensor, "backward", original)

    def runtime(kind: str):
        import torchscalpel

        run = torchscalpel.profile(
            steps=None, warmup=1, profile_steps=0, report=False, out=tempfile.mkdtemp(prefix="tci-")
        )
        run.__enter__()
        return lambda: run.__exit__(None, None, None)

    every = {"plain": None, "+root hooks": root_hooks, "+backward wrap": backward_wrap, "+runtime": runtime}
    setups = {name: every[name] for name in args.setups.split(",")}
    # Warm-up (compiles, and recompiles for hook changes) before any timing.
    for kind in models:
        for setup in setups.values():
            undo = setup(kind) if setup else None
            for _ in range(3):
                step(kind, True)
            if undo:
                undo()
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, setup in setups.items():
            for fresh in (False, True):
                for kind in models:
                    undo = setup(kind) if setup else None
                    step(kind, fresh)  # one untimed step after a hook change
                    times = [step(kind, fresh) for _ in range(args.steps)]
                    if undo:
                        undo()
                    key = f"{kind} {name} {'fresh' if fresh else 'fixed'}"
                    results.setdefault(key, []).append(statistics.median(times))
                    print(
                        json.dumps(
                            {"round": r, "variant": key, "median_ms": round(statistics.median(times), 1)}
                        ),
                        flush=True,
                    )
    counters = {
        k: dict(v)
        for k, v in torch._dynamo.utils.counters.items()
        if k in ("stats", "recompiles", "graph_break")
    }
    summary = {}
    for name in setups:
        for batch_kind in ("fixed", "fresh"):
            e = results[f"eager {name} {batch_kind}"]
            c = results[f"compiled {name} {batch_kind}"]
            summary[f"{name} {batch_kind}"] = {
                "eager_ms": round(statistics.median(e), 1),
                "compiled_ms": round(statistics.median(c), 1),
                "ratio": round(statistics.median(a / b for a, b in zip(e, c, strict=True)), 2),
            }
    print(json.dumps({"summary": summary, "dynamo": counters}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
