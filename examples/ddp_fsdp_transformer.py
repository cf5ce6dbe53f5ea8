"""A small byte-level transformer trained with torchscalpel.distributed on DDP or FSDP2.

Runs unchanged as one process (``python examples/ddp_fsdp_transformer.py``), on one node
(``scalpel launch --nproc 2 -- examples/ddp_fsdp_transformer.py``) or on many (Slurm, Kubernetes:
see docs/dist.md). Data: the Python standard library's own source text, so nothing is downloaded.

Kill it at any point and start it again with the same arguments: it resumes from the newest
committed checkpoint and continues exactly (same losses, same final weights) as if it had never
stopped. The ``--die-*`` options exist to test precisely that.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from torchscalpel import distributed as sd


class TextWindows(torch.utils.data.Dataset):
    """Byte windows of the standard library's source; a random shift per sample (an augmentation
    that makes resume exactness depend on seeded workers)."""

    def __init__(self, seq_len: int, n_windows: int) -> None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        text = b"".join(p.read_bytes() for p in sorted(stdlib.glob("[a-c]*.py"))[:12])
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.seq_len = seq_len
        self.n_windows = min(n_windows, (len(self.data) - 2 * seq_len) // seq_len)

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len + int(torch.randint(0, self.seq_len, ()))
        chunk = self.data[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2, heads: int = 2, seq_len: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="auto", choices=["auto", "ddp", "fsdp", "none"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--windows", type=int, default=256, help="dataset size (an epoch is windows/(ranks*batch) steps)")
    p.add_argument("--ckpt", type=Path, default=Path("ckpt"))
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--scaler", action="store_true", help="use a GradScaler (its state is checkpointed too)")
    p.add_argument("--guard", default="halt", choices=["halt", "skip"])
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (FSDP policy or autocast)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (needed for bit-exact resume on CUDA: some backward kernels use atomics)")
    p.add_argument("--log", type=Path, help="append per-step losses (JSON lines, one file per rank) here")
    p.add_argument("--final", type=Path, help="rank 0 writes the full final state here (torch.save of tensors)")
    p.add_argument("--die-at", type=int, default=-1, help="test: SIGKILL this process before this step")
    p.add_argument("--die-rank", type=int, default=0)
    p.add_argument("--die-attempt", type=int, default=-1, help="test: only die on this torchrun attempt")
    p.add_argument("--sleep", type=float, default=0.0, help="test: seconds to sleep per step")
    return p.parse_args()


def full_state(model: nn.Module, opt: torch.optim.Optimizer, sched, scaler) -> dict:
    """Full (unsharded) state on every rank, for comparing runs."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict(), "scaler": scaler.state_dict()}


def main() -> None:
    args = parse_args()
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    ctx = sd.setup(seed=args.seed)
    log = sd.get_logger("train")
    model: torch.nn.Module = TinyLM(dropout=args.dropout)
    sample = torch.zeros(2, 8, dtype=torch.long)
    model = sd.wrap(model, args.strategy, activation_checkpointing=args.activation_checkpointing,
                    mixed_precision="bf16" if args.bf16 else None, sample=sample.to(ctx.device))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=args.scaler, init_scale=2.0**10, growth_interval=3)
    data = sd.loader(TextWindows(32, args.windows), args.batch_size, num_workers=args.workers)
    guard = sd.NonFiniteGuard(model, mode=args.guard)
    ckpt = sd.Checkpointer(args.ckpt, model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                           loader=data, guard=guard, keep=args.keep)
    step = ckpt.load() or 0
    log.info("starting at step %d of %d on %d ranks (attempt %d)", step, args.steps, ctx.world_size, ctx.attempt)
    loss_log = None
    if args.log:
        args.log.mkdir(parents=True, exist_ok=True)
        loss_log = open(args.log / f"losses-rank{ctx.rank}.jsonl", "a")  # noqa: SIM115 - kept open for the run
    while step < args.steps:
        for x, y in data:
            if step == args.die_at and ctx.rank == args.die_rank and args.die_attempt in (-1, ctx.attempt):
                os.kill(os.getpid(), signal.SIGKILL)
            if args.sleep:
                import time

                time.sleep(args.sleep)
            logits = model(x.to(ctx.device))
            loss = F.cross_entropy(logits.flatten(0, 1), y.to(ctx.device).flatten())
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            guard.step(opt, loss, scheduler=sched, scaler=scaler)
            step += 1
            if loss_log:
                loss_log.write(json.dumps({"step": step, "loss": float(loss.item()).hex(), "attempt": ctx.attempt}) + "\n")
                loss_log.flush()
            if step % 10 == 0 or step == args.steps:
                log.info("step %d loss %.4f", step, loss.item())
            ckpt.maybe_save(step, every=args.save_every)
            if step >= args.steps:
                break
    ckpt.wait()
    state = full_state(model, opt, sched, scaler)
    if args.final and ctx.is_main:
        torch.save(state, args.final)
    sd.teardown()


if __name__ == "__main__":
    main()
