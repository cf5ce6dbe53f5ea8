"""A finished script's DDP model is kept alive, not freed inside the runtime (a gloo GIL deadlock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscalpel.netutil import free_port
from torchscalpel.runtime import script as script_mod
from torchscalpel.runtime.session import RuntimeOptions, run_target
from torchscalpel.runtime.target import Target

SCRIPT = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(4, 2)).sum().backward(); opt.step(); opt.zero_grad()
dist.destroy_process_group()
"""


def test_a_ddp_scripts_globals_are_parked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
    }.items():
        monkeypatch.setenv(key, value)
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    before = len(script_mod._PARKED_GLOBALS)
    record = run_target(Target(script=script), RuntimeOptions(warmup=0, steps=None, profile_steps=0))
    assert record.status == "complete" and len(record.steps) == 3
    assert len(script_mod._PARKED_GLOBALS) == before + 1
    assert type(script_mod._PARKED_GLOBALS[-1]["model"]).__name__ == "DistributedDataParallel"
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nm = torch.nn.Linear(2, 1)\nm(torch.ones(1, 2)).sum().backward()\n")
    run_target(Target(script=plain), RuntimeOptions(warmup=0, steps=None, profile_steps=0))
    assert len(script_mod._PARKED_GLOBALS) == before + 1  # nothing distributed: freed as usual
