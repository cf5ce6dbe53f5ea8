"""Cheap environment facts for the Run record's ``environment`` section (no probes, no subprocesses).

``scalpel env`` extends these with compatibility checks and probes; every record carries at
least what :func:`collect_facts` returns.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

ENV_VARS_THAT_MATTER = (
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_COMPILE_THREADS",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
)


def collect_facts() -> dict[str, Any]:
    """Python, OS, CPU count, torch version and build, visible devices, relevant variables."""
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
        "env": {k: os.environ[k] for k in ENV_VARS_THAT_MATTER if k in os.environ}
        | {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_"))},
    }
    if facts["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["gpus"].append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_bytes": int(props.total_memory),
                    "capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                }
            )
    return facts
