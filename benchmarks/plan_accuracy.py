"""How close `scalpel plan` gets to measured peaks: real CPU training steps vs the plan, per strategy.

For each architecture in benchmarks/plan_models.py and each strategy (single process; 2-rank gloo
DDP; 2-rank FSDP2 full and grad-op sharding), run 3 real AdamW training steps with the model built
inside a torch.profiler window and take the allocator peak (``[memory]`` events, max over ranks; for
the 2-rank rows with the frees gloo's worker threads hide from the profiler restored, see
plan_measure; the JSON keeps each rank's raw counter peak as ``raw_counter_per_rank``). Beside it:
the plan's per-rank peak and what a weights+grads+optimizer-only rule predicts for the same run.

    OMP_NUM_THREADS=1 python benchmarks/plan_accuracy.py [--json out.json] [--cases mlp,cnn,gpt,llama]
    python benchmarks/plan_accuracy.py --cuda      # one GPU: single process, torch.cuda.max_memory_allocated
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_models as pm
from plan_measure import profiled_memory, profiled_peak, train_steps, wrap_for
from torchscalpel.blocks import find_blocks
from torchscalpel.netutil import free_port
from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec
from torchscalpel.plan.strategies import evaluate

CASES = {
    "mlp": (pm.mlp, "x=float32[128,784],y=int64[128]:10"),
    "cnn": (pm.cnn, "x=float32[32,3,32,32],y=int64[32]:10"),
    "gpt": (pm.gpt, "idx=int64[8,128]:8192,y=int64[8,128]:8192"),
    "llama": (pm.llama, "input_ids=int64[4,128]:8192,labels=int64[4,128]:8192"),
    "lstm": (pm.lstm, "idx=int64[16,64]:1000,y=int64[16,64]:1000"),
    "t5": (pm.t5, "input_ids=int64[4,64]:4000,labels=int64[4,32]:4000"),
}
# Other shapes of three families, run only when named (--cases gpt-wide,llama-deep,mlp-wide): a check
# that the FSDP2 strategy model holds beyond the shapes it was developed on.
EXTRA_CASES = {
    "gpt-wide": (
        functools.partial(pm.gpt, d=384, layers=8, heads=6),
        "idx=int64[4,128]:8192,y=int64[4,128]:8192",
    ),
    "llama-deep": (
        functools.partial(pm.llama, hidden=384, layers=4, heads=6, intermediate=1024),
        "input_ids=int64[2,256]:8192,labels=int64[2,256]:8192",
    ),
    "mlp-wide": (functools.partial(pm.mlp, width=2048, depth=6), "x=float32[64,784],y=int64[64]:10"),
}
# (strategy, precision, activation checkpointing)
VARIANTS = [
    ("single", "fp32", False),
    ("single", "bf16-mixed", False),
    ("single", "fp32", True),
    ("ddp", "fp32", False),
    ("fsdp-full", "fp32", False),
    ("fsdp-grad-op", "fp32", False),
]
CPU = Device(name="cpu", memory=1 << 40, kind="cpu")
GPU = Device(name="gpu", memory=1 << 40, kind="cuda")
# GPU-sized versions of the same families: (factory, factory kwargs, batch spec)
CUDA_CASES = {
    "mlp": (pm.mlp, {"width": 4096, "depth": 6}, "x=float32[512,784],y=int64[512]:10"),
    "cnn": (pm.cnn, {"width": 64, "blocks": 8}, "x=float32[128,3,64,64],y=int64[128]:10"),
    "gpt": (
        pm.gpt,
        {"vocab": 32000, "d": 768, "layers": 6, "heads": 12, "ctx": 512},
        "idx=int64[16,512]:32000,y=int64[16,512]:32000",
    ),
    "llama": (
        pm.llama,
        {"vocab": 32000, "hidden": 768, "layers": 4, "heads": 12, "intermediate": 2048},
        "input_ids=int64[8,512]:32000,labels=int64[8,512]:32000",
    ),
}
CUDA_VARIANTS = [("fp32", False), ("bf16-mixed", False), ("fp32", True)]


def case(name: str) -> tuple:
    """(factory, batch spec) of a CPU case, default or extra."""
    return CASES[name] if name in CASES else EXTRA_CASES[name]


def settings(precision: str, ckpt: bool) -> SimSettings:
    return SimSettings(optimizer=OptimizerSpec.named("adamw"), precision=precision, checkpoint_blocks=ckpt)


def measured_single(name: str, precision: str, ckpt: bool) -> int:
    factory, spec = case(name)
    torch.manual_seed(0)
    from torchscalpel.plan.simulate import checkpointed_blocks

    def go() -> None:
        model = factory()
        with checkpointed_blocks(find_blocks(model), ckpt):
            train_steps(model, parse_batch_spec(spec), settings(precision, ckpt))

    return profiled_peak(go)


def _worker(rank: int, port: int, out: str, strategy: str, names: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = {}
    for name in names:
        factory, spec = case(name)
        torch.manual_seed(0)
        reading = profiled_memory(
            lambda f=factory, s=spec: train_steps(
                f(), parse_batch_spec(s), settings("fp32", False), wrap=wrap_for(strategy, find_blocks)
            )
        )
        # the raw profiler counter too: it misses frees done on gloo's worker threads (plan_measure)
        result[name] = [reading.peak, reading.counter_peak]
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def measured_dist(strategy: str, names: list[str]) -> dict[str, list[list[int]]]:
    """Each rank's [peak, raw counter peak] of each case (one retry on gloo's exit abort, see DESIGN.md)."""
    for _attempt in range(2):
        port = free_port()
        out = tempfile.mktemp(prefix="plan-acc-")
        try:
            mp.spawn(_worker, args=(port, out, strategy, names), nprocs=2)
        except Exception as exc:  # judge by what the ranks wrote (gloo teardown abort)
            print(
                f"note: {strategy} spawn ended with {type(exc).__name__}: {str(exc)[-600:]}", file=sys.stderr
            )
        files = [Path(f"{out}.{r}") for r in range(2)]
        if all(f.exists() for f in files):
            ranks = [json.loads(f.read_text()) for f in files]
            for f in files:
                f.unlink()
            return {n: [r[n] for r in ranks] for n in names}
    raise RuntimeError(f"{strategy}: ranks did not report")


def planned(name: str, strategy: str, precision: str, ckpt: bool) -> tuple[int, int]:
    factory, spec = case(name)
    m = simulate(
        lambda: build_meta_model(factory, precision), parse_batch_spec(spec), settings(precision, ckpt)
    )
    bd = evaluate(
        m, strategy, world_size=1 if strategy == "single" else 2, nodes=1, device=CPU, checkpointing=ckpt
    )
    return bd.peak, bd.weights_optimizer_rule


def cuda_rows(names: list[str]) -> list[dict]:
    """Single-GPU rows: measured max_memory_allocated vs the plan simulated on fake CUDA tensors."""
    from plan_measure import cuda_peak
    from torchscalpel.plan.simulate import checkpointed_blocks

    rows = []
    for name in names:
        factory, kwargs, spec_text = CUDA_CASES[name]
        spec = parse_batch_spec(spec_text)
        for precision, ckpt in CUDA_VARIANTS:
            s = SimSettings(
                optimizer=OptimizerSpec.named("adamw"),
                precision=precision,
                checkpoint_blocks=ckpt,
                foreach=True,
                device="cuda",
            )

            def go(factory=factory, kwargs=kwargs, spec=spec, s=s, ckpt=ckpt) -> None:
                model = factory(**kwargs).cuda()
                with checkpointed_blocks(find_blocks(model), ckpt):
                    train_steps(model, spec, s, device="cuda")

            real = cuda_peak(go)
            m = simulate(
                lambda f=factory, k=kwargs, p=precision: build_meta_model(lambda: f(**k), p), spec, s
            )
            bd = evaluate(m, "single", world_size=1, nodes=1, device=GPU, checkpointing=ckpt)
            rows.append(
                {
                    "model": name,
                    "strategy": "single (cuda)",
                    "precision": precision,
                    "checkpointing": ckpt,
                    "measured": real,
                    "plan": bd.peak,
                    "plan_error": bd.peak / real - 1,
                    "rule": bd.weights_optimizer_rule,
                    "rule_error": bd.weights_optimizer_rule / real - 1,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--cases", default=None, help="comma-separated model names (default: all of the chosen mode's)"
    )
    parser.add_argument("--cuda", action="store_true", help="single-GPU rows instead of the CPU ones")
    parser.add_argument(
        "--max-error", type=float, default=None, help="exit 1 if any |plan error| exceeds this"
    )
    args = parser.parse_args()
    names = args.cases.split(",") if args.cases else list(CUDA_CASES if args.cuda else CASES)
    if args.cuda:
        report(cuda_rows(names), args)
        return
    rows = []
    dist_cache = {s: measured_dist(s, names) for s in sorted({v[0] for v in VARIANTS if v[0] != "single"})}
    for name in names:
        for strategy, precision, ckpt in VARIANTS:
            counters = None
            try:
                if strategy == "single":
                    real = measured_single(name, precision, ckpt)
                else:
                    real = max(peak for peak, _ in dist_cache[strategy][name])
                    counters = [counter for _, counter in dist_cache[strategy][name]]
            except Exception as exc:  # e.g. a model that generic block checkpointing breaks for real
                print(
                    f"note: {name} {strategy} {precision} ckpt={ckpt}: real run failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200]}",
                    file=sys.stderr,
                )
                continue
            plan, rule = planned(name, strategy, precision, ckpt)
            rows.append(
                {
                    "model": name,
                    "strategy": strategy,
                    "precision": precision,
                    "checkpointing": ckpt,
                    "measured": real,
                    "plan": plan,
                    "plan_error": plan / real - 1,
                    "rule": rule,
                    "rule_error": rule / real - 1,
                }
            )
            if counters is not None:
                rows[-1]["raw_counter_per_rank"] = counters
    report(rows, args)


def report(rows: list[dict], args: argparse.Namespace) -> None:
    """Markdown table, summary line, optional JSON; exit 1 above --max-error."""
    mib = 1024**2
    print(
        "| model | strategy | precision | ckpt | measured MiB | plan MiB | plan error | weights+opt rule MiB | rule error |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['strategy']} | {r['precision']} | {'blocks' if r['checkpointing'] else '-'} | "
            f"{r['measured'] / mib:.1f} | {r['plan'] / mib:.1f} | {r['plan_error']:+.1%} | {r['rule'] / mib:.1f} | "
            f"{r['rule_error']:+.1%} |"
        )
    errs = [abs(r["plan_error"]) for r in rows]
    print(
        f"\nplan: max |error| {max(errs):.1%}, mean {sum(errs) / len(errs):.1%}; within ±15%: "
        f"{sum(e <= 0.15 for e in errs)}/{len(errs)}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.max_error is not None and max(errs) > args.max_error:
        sys.exit(1)


if __name__ == "__main__":
    main()
