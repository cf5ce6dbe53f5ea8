"""torchscalpel.distributed: the few calls a training script adds to scale out on torchrun.

```python
from torchscalpel import distributed as sd

ctx = sd.setup(seed=0)
model = sd.wrap(Model(), strategy="auto")
opt = torch.optim.AdamW(model.parameters())
data = sd.loader(dataset, batch_size=32, num_workers=2)
ckpt = sd.Checkpointer("ckpt", model=model, optimizer=opt, loader=data)
step = ckpt.load() or 0
...
sd.teardown()
```
"""

from torchscalpel.distributed.checkpoint import Checkpointer
from torchscalpel.distributed.consolidation import consolidate
from torchscalpel.distributed.data import ResumableLoader, loader
from torchscalpel.distributed.guard import NonFiniteError, NonFiniteGuard
from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.distributed.process import (
    DistContext,
    context,
    get_logger,
    seed_everything,
    setup,
    teardown,
)
from torchscalpel.distributed.wrapping import find_blocks, fsdp1_advice, script_advice, wrap

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "DistContext",
    "NonFiniteError",
    "NonFiniteGuard",
    "ResumableLoader",
    "consolidate",
    "context",
    "find_blocks",
    "fsdp1_advice",
    "get_logger",
    "loader",
    "script_advice",
    "seed_everything",
    "setup",
    "teardown",
    "wrap",
]
