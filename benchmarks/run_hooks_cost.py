"""Benchmark: the per-step cost of the global forward hooks ``scalpel run`` installs for settings that need
the model's outermost call (amp, compile: ``tune.knobs.base.RootHooks``), on a tiny transformers Llama's eager
training step. Interleaved blocks of steps with and without the hooks, in one process (BENCHMARKS.md,
"`scalpel run`'s own start-up and per-step cost").

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/run_hooks_cost.py [--rounds 12] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torchscalpel.tune.knobs.base import RootHooks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=5, help="steps per block")
    args = p.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    model = LlamaForCausalLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, config.vocab_size, (8, 64))

    def step() -> None:
        out = model(input_ids=x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        opt.step()

    for _ in range(5):
        step()
    calls = [0]

    def count(module: torch.nn.Module, inputs: object) -> None:
        calls[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    step()
    handle.remove()
    plain: list[float] = []
    hooked: list[float] = []
    for _ in range(args.rounds):
        for into in (plain, hooked):
            undo = RootHooks(on_pre=lambda m, a: None).install() if into is hooked else (lambda: None)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            into.append((time.perf_counter() - start) / args.steps * 1000.0)
            undo()
    a, b = statistics.median(plain), statistics.median(hooked)
    print(
        f"module calls per step {calls[0]}; plain {a:.2f} ms, with RootHooks {b:.2f} ms, "
        f"{b - a:+.2f} ms ({b / a - 1:+.1%}); {args.rounds} rounds x {args.steps} steps"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
