"""Real 2-rank gloo DDP and FSDP2 steps against the plan (the strategy model's check with real ranks)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from torch import nn

from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec
from torchscalpel.plan.strategies import evaluate

SPEC = "x=float32[64,256],y=int64[64]:10"


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                                     for _ in range(3)])
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from torchscalpel.blocks import find_blocks
    from torchscalpel.plan.measure import profiled_peak, train_steps, wrap_for

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    settings = SimSettings(optimizer=OptimizerSpec.named("adamw"))
    peaks = {s: profiled_peak(lambda s=s: train_steps(_Net(), parse_batch_spec(SPEC), settings,
                                                      wrap=wrap_for(s, find_blocks)))
             for s in ("ddp", "fsdp-full", "fsdp-grad-op")}
    Path(f"{out}.{rank}").write_text(json.dumps(peaks))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.slow
def test_ddp_and_fsdp_plans_are_within_15_percent_of_two_real_ranks(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "peaks")
    try:
        mp.spawn(_worker, args=(port, out), nprocs=2)
    except Exception:
        # gloo's teardown abort (DESIGN.md, Testing): judge by what the ranks wrote before exiting
        pass
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    m = simulate(lambda: build_meta_model(_Net, "fp32"), parse_batch_spec(SPEC),
                 SimSettings(optimizer=OptimizerSpec.named("adamw")))
    cpu = Device(name="cpu", memory=1 << 40, kind="cpu")
    # FSDP2 peaks are steady too once the frees gloo's worker threads hide from the profiler are
    # restored (plan.measure.allocator_peak): both ranks read the same peak in every run.
    for strategy in ("ddp", "fsdp-full", "fsdp-grad-op"):
        measured = max(r[strategy] for r in ranks)
        planned = evaluate(m, strategy, world_size=2, nodes=1, device=cpu).peak
        assert abs(planned / measured - 1) < 0.15, (strategy, planned, measured)
    # the strategies differ by what the model says: DDP above single, FSDP below it
    assert max(r["ddp"] for r in ranks) > m.peak_bytes > max(r["fsdp-full"] for r in ranks)
