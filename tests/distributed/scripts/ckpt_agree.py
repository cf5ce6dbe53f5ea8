"""Every rank raises when rank 0's part of a save fails (the step exists; the commit fails), none waits.

Writes OUT/rank-R.txt with one line per refused save: the CheckpointError each rank raised.
"""

import sys
from pathlib import Path

import torch

from torchscalpel import distributed as sd
from torchscalpel.distributed import manifest

out = Path(sys.argv[1])
ctx = sd.setup(seed=0)
model = sd.wrap(torch.nn.Linear(4, 2), "ddp")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lines = []
with sd.Checkpointer(out / "ckpt", model=model, optimizer=opt) as ckpt:
    ckpt.save(1)
    try:
        ckpt.save(1)  # rank 0 refuses to overwrite step 1
    except sd.CheckpointError as exc:
        lines.append(str(exc))
    real_commit = manifest.commit
    if ctx.rank == 0:

        def broken_commit(*args, **kwargs):
            raise OSError(28, "No space left on device", str(out / "ckpt" / "step-2"))

        manifest.commit = broken_commit
    try:
        ckpt.save(2)
    except sd.CheckpointError as exc:
        lines.append(str(exc))
    manifest.commit = real_commit
    ckpt.save(3)  # the group is still usable: every rank agreed and went on
(out / f"rank-{ctx.rank}.txt").write_text("\n".join(lines) + "\n")
sd.teardown()
