"""Cheap environment facts for the Run record's ``environment`` section (no probes, no subprocesses).

``scalpel env`` extends these with compatibility checks and probes; every record carries at
least what :func:`collect_facts` returns. Everything here reads what the process already has
(torch attributes, package metadata, a few files under /proc and /dev), so collecting the facts
costs tens of milliseconds and never starts a process or touches a GPU beyond what
``torch.cuda.is_available()`` already does.

The keys (all JSON-ready) are documented in docs/env.md; checks read them with ``.get`` so a
record written by an older torchscalpel (fewer keys) still works.
"""

from __future__ import annotations

import glob
import importlib.metadata as metadata
import importlib.util
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_VARS_THAT_MATTER = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_HOME",
    "CUBLAS_WORKSPACE_CONFIG",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "KMP_AFFINITY",
    "PYTORCH_CUDA_ALLOC_CONF",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GLOO_SOCKET_IFNAME",
    "CC",
    "CXX",
)
ENV_PREFIXES_THAT_MATTER = ("NCCL_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "PYTORCH_")

# CPU features that decide whether bf16 / fp16 / int8 paths are fast; read from /proc/cpuinfo.
CPU_FLAGS_THAT_MATTER = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "sve",
    "bf16",
)

# Distributions whose versions the checks and the report use (import name differs for some).
PACKAGES = (
    "torch",
    "triton",
    "pytorch-triton",
    "pytorch-triton-rocm",
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxscript",
    "torchvision",
    "torchaudio",
    "torchao",
    "transformers",
)

# NVIDIA's pip wheels carry the CUDA major in the name (nvidia-cudnn-cu12) or, from CUDA 13, in
# the version of an unsuffixed name (nvidia-cuda-runtime 13.x).
_CUDA_WHEEL = re.compile(r"^nvidia-[a-z0-9-]+?(?:-cu(\d+))?$")


def collect_facts() -> dict[str, Any]:
    """Python, OS, CPU, torch build, devices, driver, compilers, packages, relevant variables."""
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": f"{platform.system()} {platform.release()}",
        "platform": sys.platform,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_facts(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "torch_build": _torch_build(torch),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
        "driver": _driver_facts(torch),
        "distributed": _distributed_facts(),
        "compilers": compiler_facts(),
        "packages": package_versions(),
        "cuda_wheels": cuda_wheel_distributions(),
        "env": {k: os.environ[k] for k in ENV_VARS_THAT_MATTER if k in os.environ}
        | {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES_THAT_MATTER)},
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
        facts["torch_build"]["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
        facts["torch_build"]["arch_list"] = list(
            torch.cuda.get_arch_list()
        )  # GPU archs the wheel has kernels for
    return facts


def cpu_facts(
    cpuinfo: Path = Path("/proc/cpuinfo"),
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
) -> dict[str, Any]:
    """Model, usable and physical cores, the load, the feature flags that matter, and torch's own view of
    them. ``loadavg`` is the load's source (``os.getloadavg``; a test passes its own)."""
    import torch

    usable: int | None  # os.cpu_count() is None when the count cannot be determined
    try:
        usable = len(os.sched_getaffinity(0))  # what cgroups / taskset leave this process
    except (AttributeError, OSError):
        usable = os.cpu_count()
    out: dict[str, Any] = {
        "model": None,
        "usable_cores": usable,  # platform.processor() runs uname -p
        "physical_cores": None,
        "flags": [],
    }
    try:
        import psutil

        out["physical_cores"] = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unsupported platform: the count is optional
        pass
    try:
        # Other processes' load explains noisy probe timings (and slow multi-threaded ops).
        out["load_avg_1m"] = round(loadavg()[0], 2)
    except (AttributeError, OSError):
        out["load_avg_1m"] = None
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    if model:
        out["model"] = model.group(1).strip()
    flags_line = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    if flags_line:
        present = set(flags_line.group(1).split())
        out["flags"] = [f for f in CPU_FLAGS_THAT_MATTER if f in present]
    # torch's view can differ from /proc/cpuinfo (a hypervisor may list AMX yet not enable it).
    cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    out["torch_capability"] = cap() if cap else None
    for key, fn in (
        ("torch_avx512_bf16", "_is_avx512_bf16_supported"),
        ("torch_amx_tile", "_is_amx_tile_supported"),
    ):
        probe = getattr(torch.cpu, fn, None)
        out[key] = bool(probe()) if probe else None
    return out


def _torch_build(torch: Any) -> dict[str, Any]:
    """Which build of torch this is: cuda / rocm / cpu, cuDNN, git revision."""
    kind = "cuda" if torch.version.cuda else "rocm" if getattr(torch.version, "hip", None) else "cpu"
    cudnn = None
    if kind != "cpu":
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # a broken cuDNN install is itself worth seeing, but not fatal here
            cudnn = None
    nccl = None
    if kind != "cpu":
        try:
            raw = torch.cuda.nccl.version()
            nccl = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
        except Exception:  # no NCCL in this build
            nccl = None
    return {
        "kind": kind,
        "cudnn": cudnn,
        "nccl": nccl,
        "git": (getattr(torch.version, "git_version", "") or "")[:12] or None,
        "debug": bool(getattr(torch.version, "debug", False)),
    }


def _distributed_facts() -> dict[str, Any]:
    """Which process-group backends this torch build was compiled with."""
    import torch.distributed as dist

    if not dist.is_available():
        return {"available": False}
    out: dict[str, Any] = {"available": True}
    for name in ("gloo", "nccl", "mpi", "ucc", "xccl"):
        fn = getattr(dist, f"is_{name}_available", None)
        try:
            out[name] = bool(fn()) if fn else False
        except Exception:
            out[name] = False
    return out


def _driver_facts(torch: Any) -> dict[str, Any]:
    """NVIDIA / ROCm driver traces visible without starting a process."""
    out: dict[str, Any] = {
        "nvidia_version": read_nvidia_driver_version(),
        "cuda_version": None,
        "nvidia_smi": shutil.which("nvidia-smi"),
        "nvidia_devices": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "rocm_kfd": os.path.exists("/dev/kfd"),
        "wsl_dxg": os.path.exists("/dev/dxg"),
    }
    # cudaDriverGetVersion: the newest CUDA the installed driver supports, e.g. 12020 -> "12.2".
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if torch.version.cuda and get is not None:
        try:
            code = int(get())
        except Exception:
            code = 0
        if code > 0:
            out["cuda_version"] = f"{code // 1000}.{(code % 1000) // 10}"
    return out


def read_nvidia_driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The loaded NVIDIA kernel module's version (``535.104.05``), or None when none is loaded."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def compiler_facts() -> dict[str, Any]:
    """The C++ compiler inductor would use on CPU and the C compiler triton builds its launcher with."""

    def first(env_var: str, names: tuple[str, ...]) -> str | None:
        # An explicit CC / CXX wins, as it does for inductor's cpp_builder and triton.
        if os.environ.get(env_var):
            return shutil.which(os.environ[env_var]) or None
        return next((p for p in map(shutil.which, names) if p), None)

    return {
        "cxx": first("CXX", ("g++", "clang++", "c++")),
        "cc": first("CC", ("gcc", "clang", "cc")),
    }


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the distributions that matter (absent ones are left out)."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    # Triton ships under several distribution names; the import name tells whether it is usable.
    importable = importlib.util.find_spec("triton") is not None
    if importable and not any(k in out for k in ("triton", "pytorch-triton", "pytorch-triton-rocm")):
        out["triton"] = "unknown"
    return out


def cuda_wheel_distributions(path: list[str] | None = None) -> list[dict[str, Any]]:
    """NVIDIA CUDA wheels installed (``nvidia-*``), with the CUDA major each one belongs to.

    ``path`` defaults to ``sys.path``; tests pass a folder of fake ``*.dist-info`` entries. Only
    entries whose folder name starts with ``nvidia`` are opened (through importlib.metadata):
    reading every installed distribution's METADATA costs 20-200 ms, too much for every record.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for root in sys.path if path is None else path:
        real = os.path.realpath(root or ".")
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = [
                e
                for e in os.scandir(real)
                if e.name.lower().startswith("nvidia") and e.name.endswith((".dist-info", ".egg-info"))
            ]
        except OSError:  # a zip, a missing folder: nothing installed there that we care about
            continue
        for entry in entries:
            dist = metadata.PathDistribution(Path(entry.path))
            raw = dist.metadata["Name"] if dist.metadata else None
            if raw:
                wheel = _cuda_wheel(raw, dist.version or "", real)
                if wheel:
                    out.append(wheel)
    out.sort(key=lambda d: (d["name"], d["version"]))
    return out


def _cuda_wheel(raw_name: str, version: str, location: str) -> dict[str, Any] | None:
    name = re.sub(r"[-_.]+", "-", raw_name).lower()
    match = _CUDA_WHEEL.match(name)
    if not match:
        return None
    if match.group(1):
        major = int(match.group(1))
    elif name.startswith("nvidia-cuda-") and version.split(".")[0].isdigit():
        major = int(version.split(".")[0])
    else:
        return None  # e.g. nvidia-ml-py: no CUDA major
    return {"name": name, "version": version, "cuda_major": major, "location": location}
