"""Compatibility checks over environment facts: CUDA / driver / torch build / compilers / packages.

Every check reads only the facts dict (from :func:`torchscalpel.envcheck.facts.collect_facts`,
optionally extended by ``scalpel env`` with ``nvidia_smi`` and ``local_ranks``), so the checks run
the same on a live machine, on a Run record's ``environment`` section, and on a fake dict in a
unit test. Missing keys mean "unknown" and never fire a check.

The slugs are a contract (JSON consumers, ``doctor``'s rule list): see :data:`CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchscalpel.envcheck.check_types import CheckFn, Facts
from torchscalpel.envcheck.check_types import env_finding as _finding
from torchscalpel.envcheck.host_checks import check_machine_busy, check_omp_oversubscribed
from torchscalpel.envcheck.tables import (
    cuda_major_minor,
    load_table,
    max_cuda_for_driver,
    min_driver_for_cuda,
    newest_wheel_cuda_at_most,
    version_below,
)
from torchscalpel.findings import Finding, Severity


def _driver(facts: Facts) -> dict[str, Any]:
    return facts.get("driver") or {}


def _smi(facts: Facts) -> dict[str, Any]:
    return facts.get("nvidia_smi") or {}


def _build_kind(facts: Facts) -> str:
    kind = (facts.get("torch_build") or {}).get("kind")
    if kind:
        return kind
    return "cuda" if facts.get("torch_cuda") else "rocm" if facts.get("torch_hip") else "cpu"


def gpu_evidence(facts: Facts) -> list[str]:
    """Signs of an NVIDIA GPU that do not depend on torch's build (empty: no sign at all)."""
    drv, smi = _driver(facts), _smi(facts)
    signs: list[str] = []
    if smi.get("gpus"):
        names = ", ".join(sorted({g.get("name", "?") for g in smi["gpus"]}))
        signs.append(f"nvidia-smi lists {len(smi['gpus'])} GPU(s): {names}")
    if drv.get("nvidia_version"):
        signs.append(f"NVIDIA driver {drv['nvidia_version']} is loaded (/proc/driver/nvidia/version)")
    if drv.get("nvidia_devices"):
        signs.append(f"device files {', '.join(drv['nvidia_devices'][:4])}")
    if drv.get("nvidia_smi"):
        signs.append(f"nvidia-smi is installed at {drv['nvidia_smi']}")
    return signs


def driver_cuda(facts: Facts) -> tuple[str | None, str]:
    """The newest CUDA the installed driver supports, and where that figure came from."""
    drv, smi = _driver(facts), _smi(facts)
    if drv.get("cuda_version"):
        return drv["cuda_version"], "the CUDA driver API (cudaDriverGetVersion)"
    if smi.get("cuda_version"):
        return smi["cuda_version"], "nvidia-smi"
    version = drv.get("nvidia_version") or smi.get("driver_version")
    if version:
        cuda = max_cuda_for_driver(version, facts.get("platform", "linux"))
        if cuda:
            return cuda, f"driver {version} in NVIDIA's driver table"
    return None, ""


def _visible_devices_hide_all(facts: Facts) -> str | None:
    env = facts.get("env") or {}
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    if value.strip() in ("", "-1", "none", "NoDevFiles"):
        return value
    # Indices past the GPUs nvidia-smi lists (e.g. "4" on a 4-GPU machine) also hide every GPU:
    # CUDA stops at the first invalid entry.
    count = len(_smi(facts).get("gpus") or [])
    first = value.split(",")[0].strip()
    if count and first.isdigit() and int(first) >= count:
        return value
    return None


def check_cpu_build_on_gpu_machine(facts: Facts) -> list[Finding]:
    """A CPU-only torch wheel on a machine that has NVIDIA GPUs: training silently runs on CPU."""
    if _build_kind(facts) != "cpu":
        return []
    signs = gpu_evidence(facts)
    if not signs:
        return []
    cuda, source = driver_cuda(facts)
    wheel = newest_wheel_cuda_at_most(cuda) if cuda else None
    index = (
        f"https://download.pytorch.org/whl/cu{wheel.replace('.', '')}"
        if wheel
        else "https://download.pytorch.org/whl/cu126"
    )
    evidence = [f"torch {facts.get('torch')} is a CPU-only build (torch.version.cuda is None)", *signs]
    if cuda:
        evidence.append(f"the driver supports CUDA up to {cuda} ({source})")
    return [
        _finding(
            "torch-cpu-build-on-gpu-machine",
            Severity.ERROR,
            "This machine has an NVIDIA GPU but torch is a CPU-only build, so everything runs on the CPU.",
            evidence,
            f"pip install --force-reinstall torch --index-url {index}",
        )
    ]


def check_driver_too_old(facts: Facts) -> list[Finding]:
    """The wheel's CUDA is newer than what the driver supports."""
    wheel = facts.get("torch_cuda")
    have, source = driver_cuda(facts)
    need, got = cuda_major_minor(wheel), cuda_major_minor(have)
    if wheel is None or have is None or not need or not got or got >= need:
        return []
    platform = facts.get("platform", "linux")
    min_driver = min_driver_for_cuda(wheel, platform)
    alt = newest_wheel_cuda_at_most(have)
    # Same major: CUDA minor-version compatibility usually lets it run, but JIT of newer PTX
    # (triton, torch.compile) and features that need the newer driver fail. Older major: no CUDA at all.
    hard = got[0] < need[0] or not facts.get("cuda_available", True)
    evidence = [
        f"torch {facts.get('torch')} is built for CUDA {wheel}",
        f"the driver supports CUDA up to {have} ({source})",
    ]
    if min_driver:
        evidence.append(
            f"CUDA {wheel} needs driver >= {min_driver} ({'Windows' if platform.startswith('win') else 'Linux'})"
        )
    if not hard:
        evidence.append(
            "same CUDA major: runs under minor-version compatibility, but PTX JIT (triton / torch.compile) can fail"
        )
    fix = f"Upgrade the NVIDIA driver to >= {min_driver}" if min_driver else "Upgrade the NVIDIA driver"
    if alt:
        fix += f", or install a torch wheel built for CUDA {alt}: pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu{alt.replace('.', '')}"
    return [
        _finding(
            "driver-too-old-for-cuda",
            Severity.ERROR if hard else Severity.WARNING,
            f"The NVIDIA driver supports CUDA {have} but torch was built for CUDA {wheel}.",
            evidence,
            fix,
        )
    ]


# The likeliest causes of "CUDA build, but torch.cuda.is_available() is False", in the order they
# are tried: (predicate, cause, fix). Table-driven so a newly seen cause is one row.
def _cause_hidden(f: Facts) -> bool:
    return _visible_devices_hide_all(f) is not None


def _cause_no_driver(f: Facts) -> bool:
    drv = _driver(f)
    return (
        not drv.get("nvidia_version")
        and not drv.get("nvidia_devices")
        and not drv.get("wsl_dxg")
        and not _smi(f).get("gpus")
    )


def _cause_no_device_files(f: Facts) -> bool:
    drv = _driver(f)
    return (
        bool(drv.get("nvidia_version") or _smi(f).get("gpus"))
        and not drv.get("nvidia_devices")
        and not drv.get("wsl_dxg")
    )


def _cause_old_driver(f: Facts) -> bool:
    have, _ = driver_cuda(f)
    need, got = cuda_major_minor(f.get("torch_cuda")), cuda_major_minor(have)
    return bool(need and got and got < need)


def _cause_smi_error(f: Facts) -> bool:
    return bool(_smi(f).get("error"))


CUDA_UNAVAILABLE_CAUSES: tuple[tuple[Callable[[Facts], bool], str, str], ...] = (
    (
        _cause_hidden,
        "CUDA_VISIBLE_DEVICES hides every GPU",
        "Unset CUDA_VISIBLE_DEVICES or set it to the GPU indices to use, e.g. CUDA_VISIBLE_DEVICES=0,1.",
    ),
    (
        _cause_no_driver,
        "no NVIDIA driver is loaded on this machine (or it has no NVIDIA GPU)",
        "On a GPU machine install the NVIDIA driver; on a CPU-only machine the CPU wheel is ~10x smaller: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    ),
    (
        _cause_no_device_files,
        "the driver is loaded but no /dev/nvidia* device is visible (a container started without GPUs)",
        "Start the container with GPUs: docker run --gpus all ... (needs the NVIDIA Container Toolkit).",
    ),
    (
        _cause_old_driver,
        "the driver is older than the CUDA torch was built for",
        "See driver-too-old-for-cuda: upgrade the driver or install a torch wheel for an older CUDA.",
    ),
    (
        _cause_smi_error,
        "the driver does not answer (nvidia-smi fails)",
        "Check nvidia-smi and dmesg for Xid errors; a GPU that fell off the bus needs a reset or a reboot.",
    ),
)


def check_cuda_unavailable(facts: Facts) -> list[Finding]:
    """A CUDA (or ROCm) build of torch that cannot see a GPU, with the likeliest cause."""
    kind = _build_kind(facts)
    if kind == "cpu" or facts.get("cuda_available", True):
        return []
    if kind == "rocm":
        drv = _driver(facts)
        cause = (
            "no /dev/kfd: the ROCm kernel driver is not loaded or not visible"
            if not drv.get("rocm_kfd")
            else "the ROCm runtime found no usable GPU (HIP_VISIBLE_DEVICES, or the user is not in the render/video groups)"
        )
        return [
            _finding(
                "cuda-unavailable",
                Severity.ERROR,
                f"torch is a ROCm build but torch.cuda.is_available() is False: {cause}.",
                [f"torch {facts.get('torch')} (HIP {facts.get('torch_hip')})"],
                "Check rocm-smi, /dev/kfd and /dev/dri permissions (usermod -aG render,video $USER).",
            )
        ]
    signs = gpu_evidence(facts)
    cause, fix = "unknown", "Run python -c 'import torch; torch.cuda.init()' to see CUDA's own error."
    for predicate, text, remedy in CUDA_UNAVAILABLE_CAUSES:
        if predicate(facts):
            cause, fix = text, remedy
            break
    hidden = _visible_devices_hide_all(facts)
    # A CUDA wheel on a machine with no GPU at all is common (pip's default wheel) and harmless.
    severity = Severity.ERROR if signs or hidden is not None else Severity.INFO
    evidence = [f"torch {facts.get('torch')} is built for CUDA {facts.get('torch_cuda')}", *signs]
    if hidden is not None:
        evidence.append(f"CUDA_VISIBLE_DEVICES={hidden!r}")
    if _smi(facts).get("error"):
        evidence.append(_smi(facts)["error"])
    return [
        _finding(
            "cuda-unavailable",
            severity,
            f"torch is a CUDA build but torch.cuda.is_available() is False; likeliest cause: {cause}.",
            evidence,
            fix,
        )
    ]


def check_compiler(facts: Facts) -> list[Finding]:
    """torch.compile needs a C++ compiler for CPU code (inductor) and a C compiler for triton's launcher."""
    compilers = facts.get("compilers")
    if compilers is None:
        return []
    on_gpu = bool(facts.get("cuda_available"))
    missing = "cc" if on_gpu else "cxx"
    if compilers.get(missing):
        return []
    env = facts.get("env") or {}
    var = "CC" if missing == "cc" else "CXX"
    evidence = [
        f"no {'C' if missing == 'cc' else 'C++'} compiler on PATH ({'gcc, clang, cc' if missing == 'cc' else 'g++, clang++, c++'})"
    ]
    if env.get(var):
        evidence.append(f"{var}={env[var]!r} does not name an executable on PATH")
    what = (
        "triton builds a small C launcher for each kernel"
        if on_gpu
        else "inductor compiles generated C++ for CPU code"
    )
    return [
        _finding(
            "no-compiler-for-inductor",
            Severity.WARNING,
            f"torch.compile will fail here: {what} and no compiler is installed.",
            evidence,
            "Install one: apt-get install g++ (Debian/Ubuntu), dnf install gcc-c++ (Fedora), or conda install gxx_linux-64; "
            f"or point {var} at it.",
        )
    ]


def check_triton(facts: Facts) -> list[Finding]:
    """A GPU build with a usable GPU (sm70+) but no triton: torch.compile cannot generate GPU kernels."""
    kind = _build_kind(facts)
    packages = facts.get("packages")
    if kind == "cpu" or packages is None or not facts.get("cuda_available"):
        return []
    if any(k in packages for k in ("triton", "pytorch-triton", "pytorch-triton-rocm")):
        return []
    caps = [g.get("capability") for g in facts.get("gpus") or []]
    usable = [c for c in caps if c and (cc := cuda_major_minor(c)) is not None and cc >= (7, 0)]
    if kind == "cuda" and caps and not usable:
        return []  # triton does not support GPUs older than Volta; inductor falls back there
    dist = "pytorch-triton-rocm" if kind == "rocm" else "triton"
    return [
        _finding(
            "triton-missing",
            Severity.WARNING,
            "triton is not installed, so torch.compile cannot generate GPU kernels (it fails with 'Cannot find a working triton installation').",
            [
                f"torch {facts.get('torch')} ({kind} build) sees {len(facts.get('gpus') or [])} GPU(s)",
                f"no {dist} distribution installed",
            ],
            f"pip install {dist} (the version your torch wheel pins: see pip show torch, 'Requires').",
        )
    ]


def check_nccl(facts: Facts) -> list[Finding]:
    """A CUDA build on Linux with GPUs but no NCCL: multi-GPU training falls back to slow gloo or fails."""
    dist = facts.get("distributed")
    if not dist or _build_kind(facts) == "cpu" or not facts.get("cuda_available"):
        return []
    if not facts.get("platform", "linux").startswith("linux") or dist.get("nccl"):
        return []
    return [
        _finding(
            "nccl-unavailable",
            Severity.WARNING,
            "torch has no NCCL backend here, so multi-GPU training cannot use backend='nccl'.",
            [
                f"torch.distributed.is_nccl_available() is False ({'distributed available' if dist.get('available') else 'torch.distributed unavailable'})",
                f"{len(facts.get('gpus') or [])} GPU(s) visible",
            ],
            "Install an official torch wheel for Linux (they include NCCL), e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126.",
        )
    ]


def check_vulnerable_versions(facts: Facts) -> list[Finding]:
    """Rows of vulnerable_versions.json whose package is installed below the fixed version."""
    packages = dict(facts.get("packages") or {})
    if facts.get("torch") and "torch" not in packages:
        packages["torch"] = facts["torch"]
    out: list[Finding] = []
    for row in load_table("vulnerable_versions.json")["rows"]:
        installed = packages.get(row["package"])
        if installed and version_below(installed, row["fixed_in"]):
            out.append(
                _finding(
                    row["slug"],
                    Severity.WARNING,
                    row["message"].format(version=installed),
                    [
                        f"{row['package']} {installed} installed; fixed in {row['fixed_in']} ({row['advisory']})"
                    ],
                    row["fix"],
                )
            )
    return out


def check_mixed_cuda_runtimes(facts: Facts) -> list[Finding]:
    """NVIDIA CUDA wheels of different CUDA majors (or one wheel installed twice) side by side."""
    wheels = facts.get("cuda_wheels") or []
    majors = sorted({w["cuda_major"] for w in wheels if w.get("cuda_major") is not None})
    names: dict[str, list[dict[str, Any]]] = {}
    for w in wheels:
        names.setdefault(w["name"], []).append(w)
    duplicates = {n: ws for n, ws in names.items() if len(ws) > 1}
    torch_major = cuda_major_minor(facts.get("torch_cuda"))
    foreign = [m for m in majors if torch_major and m != torch_major[0]]
    if len(majors) < 2 and not duplicates and not foreign:
        return []
    evidence = [
        f"{w['name']}=={w['version']}" + (f" in {w['location']}" if w.get("location") else "")
        for w in wheels
        if len(majors) > 1 or w["name"] in duplicates or w.get("cuda_major") in foreign
    ][:12]
    if torch_major:
        evidence.append(f"torch is built for CUDA {facts.get('torch_cuda')}")
    keep = torch_major[0] if torch_major else majors[-1]
    drop = sorted({w["name"] for w in wheels if w.get("cuda_major") != keep})
    fix = (
        f"pip uninstall {' '.join(drop)}"
        if drop
        else "pip uninstall the duplicate copies (pip list -v shows where each lives)"
    )
    return [
        _finding(
            "mixed-cuda-runtimes",
            Severity.WARNING,
            f"CUDA runtime packages for several CUDA versions are installed side by side (CUDA majors {', '.join(map(str, majors))}); which library loads first is an accident.",
            evidence,
            fix + "; then reinstall torch so its own CUDA wheels are complete.",
        )
    ]


def _arch(entry: str) -> tuple[str, tuple[int, int]] | None:
    """``"sm_86"`` -> ``("sm", (8, 6))``; ``"sm_90a"`` / ``"compute_120"`` likewise (last digit is the minor)."""
    kind, _, digits = entry.partition("_")
    digits = "".join(ch for ch in digits if ch.isdigit())
    if kind not in ("sm", "compute") or len(digits) < 2:
        return None
    return kind, (int(digits[:-1]), int(digits[-1]))


def wheel_runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """True when the wheel has a cubin for the GPU's major at or below its minor, or PTX at or below it."""
    for entry in arch_list:
        parsed = _arch(entry)
        if not parsed:
            continue
        kind, (major, minor) = parsed
        if kind == "sm" and major == capability[0] and minor <= capability[1]:
            return True  # cubins run on later minors of the same major
        if kind == "compute" and (major, minor) <= capability:
            return True  # PTX is JIT-compiled for newer GPUs (slow first launch, but it runs)
    return False


def check_gpu_arch(facts: Facts) -> list[Finding]:
    """A visible GPU whose compute capability this wheel has no kernels for (e.g. sm_120 on a cu126 wheel)."""
    arch_list = (facts.get("torch_build") or {}).get("arch_list")
    if not arch_list or _build_kind(facts) != "cuda":
        return []
    out = []
    for gpu in facts.get("gpus") or []:
        cap = cuda_major_minor(gpu.get("capability"))
        if cap and not wheel_runs_on(cap, arch_list):
            out.append(
                _finding(
                    "gpu-arch-not-in-wheel",
                    Severity.ERROR,
                    f"GPU {gpu.get('index')} ({gpu.get('name')}, sm_{cap[0]}{cap[1]}) is not supported by this torch wheel: "
                    "kernels fail with 'no kernel image is available for execution on the device'.",
                    [
                        f"GPU compute capability {cap[0]}.{cap[1]}",
                        f"torch {facts.get('torch')} has kernels for {' '.join(arch_list)}",
                    ],
                    "Install a torch wheel built for a newer CUDA that lists this architecture "
                    "(Blackwell, sm_100/sm_120, needs CUDA 12.8+): pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128",
                )
            )
    return out


CHECKS: tuple[tuple[str, CheckFn], ...] = (
    ("torch-cpu-build-on-gpu-machine", check_cpu_build_on_gpu_machine),
    ("driver-too-old-for-cuda", check_driver_too_old),
    ("cuda-unavailable", check_cuda_unavailable),
    ("no-compiler-for-inductor", check_compiler),
    ("triton-missing", check_triton),
    ("nccl-unavailable", check_nccl),
    ("torch-unsafe-loader-version", check_vulnerable_versions),
    ("onnx-vulnerable-version", check_vulnerable_versions),
    ("omp-threads-oversubscribed", check_omp_oversubscribed),
    ("mixed-cuda-runtimes", check_mixed_cuda_runtimes),
    ("gpu-arch-not-in-wheel", check_gpu_arch),
    ("machine-busy", check_machine_busy),
)
"""(slug, check) pairs; a check may serve several slugs (the vulnerable-version table)."""

SLUGS: tuple[str, ...] = tuple(slug for slug, _ in CHECKS)


def run_checks(facts: Facts) -> list[Finding]:
    """All env findings for ``facts``, most severe first; each check function runs once."""
    seen: set[int] = set()
    findings: list[Finding] = []
    for _, fn in CHECKS:
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        findings.extend(fn(facts))
    findings.sort(key=lambda f: -int(f.severity))
    return findings
