"""Env compatibility checks on fake environments (no GPU needed): each slug fires exactly when it should."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from torchscalpel.envcheck.checks import SLUGS, run_checks
from torchscalpel.findings import Finding, Severity

CONTRACT_SLUGS = {
    "torch-cpu-build-on-gpu-machine",
    "driver-too-old-for-cuda",
    "cuda-unavailable",
    "no-compiler-for-inductor",
    "triton-missing",
    "nccl-unavailable",
    "torch-unsafe-loader-version",
    "onnx-vulnerable-version",
    "omp-threads-oversubscribed",
    "mixed-cuda-runtimes",
}

CPU_BOX: dict[str, Any] = {
    "platform": "linux",
    "torch": "2.13.0+cpu",
    "torch_cuda": None,
    "torch_hip": None,
    "torch_build": {"kind": "cpu"},
    "torch_threads": 2,
    "cuda_available": False,
    "gpus": [],
    "cpu_count": 2,
    "cpu": {"usable_cores": 2},
    "driver": {
        "nvidia_version": None,
        "cuda_version": None,
        "nvidia_smi": None,
        "nvidia_devices": [],
        "rocm_kfd": False,
        "wsl_dxg": False,
    },
    "distributed": {"available": True, "gloo": True, "nccl": False},
    "compilers": {"cxx": "/usr/bin/g++", "cc": "/usr/bin/gcc"},
    "packages": {"torch": "2.13.0+cpu", "onnx": "1.23.2"},
    "cuda_wheels": [],
    "env": {},
}

GPU_BOX: dict[str, Any] = {
    **copy.deepcopy(CPU_BOX),
    "torch": "2.8.0+cu128",
    "torch_cuda": "12.8",
    "torch_build": {
        "kind": "cuda",
        "cudnn": 91002,
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    },
    "cuda_available": True,
    "torch_threads": 8,
    "cpu_count": 32,
    "cpu": {"usable_cores": 32},
    "gpus": [{"index": 0, "name": "NVIDIA H100", "capability": "9.0", "memory_bytes": 80 << 30}],
    "driver": {
        "nvidia_version": "570.124.06",
        "cuda_version": "12.8",
        "nvidia_smi": "/usr/bin/nvidia-smi",
        "nvidia_devices": ["/dev/nvidia0"],
        "rocm_kfd": False,
        "wsl_dxg": False,
    },
    "distributed": {"available": True, "gloo": True, "nccl": True},
    "packages": {"torch": "2.8.0+cu128", "triton": "3.4.0"},
    "cuda_wheels": [
        {"name": "nvidia-cuda-runtime-cu12", "version": "12.8.90", "cuda_major": 12, "location": "/venv"}
    ],
}


def facts(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with top-level keys replaced (nested dicts merged one level)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def slugs(f: dict[str, Any]) -> set[str]:
    return {x.rule for x in run_checks(f)}


def only(f: dict[str, Any], slug: str) -> Finding:
    found = [x for x in run_checks(f) if x.rule == slug]
    assert len(found) == 1, [x.rule for x in run_checks(f)]
    return found[0]


def test_contract_slugs_are_all_registered() -> None:
    assert set(SLUGS) >= CONTRACT_SLUGS
    assert set(SLUGS) - CONTRACT_SLUGS == {"gpu-arch-not-in-wheel", "machine-busy"}


@pytest.mark.parametrize("base", [CPU_BOX, GPU_BOX], ids=["cpu-box", "gpu-box"])
def test_healthy_machines_have_no_findings(base: dict[str, Any]) -> None:
    assert run_checks(base) == []


def test_findings_are_env_sourced_and_serialisable() -> None:
    found = run_checks(facts(CPU_BOX, torch="2.4.1", packages={"torch": "2.4.1", "onnx": "1.15.0"}))
    assert {f.rule for f in found} == {"torch-unsafe-loader-version", "onnx-vulnerable-version"}
    for f in found:
        assert f.source == "env"
        assert Finding.from_dict(f.to_dict()) == f


def test_cpu_build_with_nvidia_smi_present() -> None:
    f = only(facts(CPU_BOX, driver={"nvidia_smi": "/usr/bin/nvidia-smi"}), "torch-cpu-build-on-gpu-machine")
    assert f.severity == Severity.ERROR
    assert any("nvidia-smi" in e for e in f.evidence)


def test_cpu_build_fix_names_a_wheel_the_driver_can_run() -> None:
    f = only(
        facts(CPU_BOX, driver={"nvidia_version": "535.104.05", "nvidia_devices": ["/dev/nvidia0"]}),
        "torch-cpu-build-on-gpu-machine",
    )
    assert "whl/cu121" in f.fix  # driver 535 -> CUDA 12.2 -> newest PyTorch wheel at most 12.2 is cu121
    assert any("12.2" in e for e in f.evidence)


def test_cpu_build_on_cpu_machine_is_fine() -> None:
    assert "torch-cpu-build-on-gpu-machine" not in slugs(CPU_BOX)


def test_cuda_12_8_wheel_on_driver_that_supports_12_2() -> None:
    box = facts(GPU_BOX, driver={"nvidia_version": "535.104.05", "cuda_version": "12.2"})
    f = only(box, "driver-too-old-for-cuda")
    assert f.severity == Severity.WARNING  # same major: minor-version compatibility, PTX JIT may fail
    assert "570.26" in f.fix and "whl/cu121" in f.fix
    assert only(facts(box, cuda_available=False), "driver-too-old-for-cuda").severity == Severity.ERROR


def test_driver_version_alone_is_looked_up_in_the_table() -> None:
    box = facts(GPU_BOX, torch_cuda="12.4", driver={"nvidia_version": "525.60.13", "cuda_version": None})
    f = only(box, "driver-too-old-for-cuda")
    assert any("12.0" in e and "table" in e for e in f.evidence)
    # a new enough driver, again only by version number: no finding
    assert "driver-too-old-for-cuda" not in slugs(facts(box, driver={"nvidia_version": "550.54.14"}))


def test_older_driver_major_is_an_error() -> None:
    box = facts(GPU_BOX, torch_cuda="12.1", driver={"nvidia_version": "470.82.01", "cuda_version": "11.4"})
    assert only(box, "driver-too-old-for-cuda").severity == Severity.ERROR


def test_windows_uses_the_windows_column() -> None:
    box = facts(GPU_BOX, platform="win32", driver={"nvidia_version": "546.12", "cuda_version": None})
    f = only(box, "driver-too-old-for-cuda")
    assert "570.65" in f.fix  # Windows minimum for 12.8


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"env": {"CUDA_VISIBLE_DEVICES": ""}}, "CUDA_VISIBLE_DEVICES"),
        (
            {"env": {"CUDA_VISIBLE_DEVICES": "2,3"}, "nvidia_smi": {"gpus": [{"name": "A"}, {"name": "B"}]}},
            "CUDA_VISIBLE_DEVICES",
        ),
        ({"driver": {"nvidia_devices": [], "wsl_dxg": False}}, "container"),
        ({"driver": {"cuda_version": "11.8"}}, "older than the CUDA"),
        ({"nvidia_smi": {"error": "nvidia-smi did not answer within 10 s"}}, "does not answer"),
    ],
)
def test_cuda_unavailable_names_the_likeliest_cause(change: dict[str, Any], cause: str) -> None:
    f = only(facts(GPU_BOX, cuda_available=False, gpus=[], **change), "cuda-unavailable")
    assert cause in f.message
    assert f.severity == Severity.ERROR


def test_visible_devices_within_range_is_not_blamed() -> None:
    box = facts(
        GPU_BOX,
        cuda_available=False,
        gpus=[],
        env={"CUDA_VISIBLE_DEVICES": "1"},
        nvidia_smi={"gpus": [{"name": "A"}, {"name": "B"}]},
        driver={"nvidia_devices": []},
    )
    assert "container" in only(box, "cuda-unavailable").message


def test_cuda_wheel_on_machine_without_gpu_is_only_info() -> None:
    box = facts(
        GPU_BOX,
        cuda_available=False,
        gpus=[],
        driver={"nvidia_version": None, "cuda_version": None, "nvidia_smi": None, "nvidia_devices": []},
    )
    f = only(box, "cuda-unavailable")
    assert f.severity == Severity.INFO and "no NVIDIA driver" in f.message
    assert "whl/cpu" in f.fix


def test_rocm_build_without_kfd() -> None:
    box = facts(CPU_BOX, torch_hip="6.2", torch_build={"kind": "rocm"}, cuda_available=False)
    assert "/dev/kfd" in only(box, "cuda-unavailable").message


def test_no_cxx_compiler_on_cpu() -> None:
    f = only(facts(CPU_BOX, compilers={"cxx": None}, env={"CXX": "g++-99"}), "no-compiler-for-inductor")
    assert any("CXX='g++-99'" in e for e in f.evidence)
    # on a GPU machine the C++ compiler is not what triton needs, the C compiler is
    assert "no-compiler-for-inductor" not in slugs(facts(GPU_BOX, compilers={"cxx": None}))
    assert "triton" in only(facts(GPU_BOX, compilers={"cc": None}), "no-compiler-for-inductor").message


def test_triton_missing_on_gpu_build() -> None:
    box = facts(GPU_BOX)
    box["packages"] = {"torch": "2.8.0+cu128"}  # replace, not merge
    assert "pip install triton" in only(box, "triton-missing").fix
    assert "triton-missing" not in slugs(facts(box, packages={"pytorch-triton": "3.4.0"}))
    # pre-Volta GPUs are not supported by triton anyway
    assert "triton-missing" not in slugs(facts(box, gpus=[{"index": 0, "name": "P100", "capability": "6.0"}]))
    assert "triton-missing" not in slugs(facts(CPU_BOX, packages={}))


def test_nccl_unavailable_on_linux_gpu_build() -> None:
    box = facts(GPU_BOX, distributed={"nccl": False})
    assert only(box, "nccl-unavailable").severity == Severity.WARNING
    assert "nccl-unavailable" not in slugs(facts(box, platform="win32"))  # Windows never has NCCL
    assert "nccl-unavailable" not in slugs(CPU_BOX)


@pytest.mark.parametrize(
    ("version", "fires"),
    [
        ("2.5.1+cu121", True),
        ("2.6.0a0+git1234", True),
        ("2.6.0", False),
        ("2.13.0+cpu", False),
        ("1.13.1", True),
    ],
)
def test_torch_unsafe_loader_version(version: str, fires: bool) -> None:
    box = facts(CPU_BOX, torch=version, packages={"torch": version})
    assert ("torch-unsafe-loader-version" in slugs(box)) is fires


@pytest.mark.parametrize(("version", "fires"), [("1.15.0", True), ("1.16.0", False), ("1.23.2", False)])
def test_onnx_vulnerable_version(version: str, fires: bool) -> None:
    assert ("onnx-vulnerable-version" in slugs(facts(CPU_BOX, packages={"onnx": version}))) is fires
    assert "onnx-vulnerable-version" not in slugs(facts(CPU_BOX, packages={}))  # onnx not installed


def test_omp_threads_times_local_ranks_above_cores() -> None:
    box = facts(GPU_BOX, env={"OMP_NUM_THREADS": "8", "LOCAL_WORLD_SIZE": "8"})
    f = only(box, "omp-threads-oversubscribed")
    assert "64 threads on 32 cores" in f.message
    assert f.fix.startswith("export OMP_NUM_THREADS=4")
    assert "omp-threads-oversubscribed" not in slugs(facts(box, env={"OMP_NUM_THREADS": "4"}))
    # --nproc-per-node on the command line beats the environment
    assert "omp-threads-oversubscribed" in slugs(facts(GPU_BOX, local_ranks=8))


def test_more_ranks_than_cores_asks_for_fewer_ranks() -> None:
    f = only(facts(CPU_BOX, local_ranks=4, env={"OMP_NUM_THREADS": "1"}), "omp-threads-oversubscribed")
    assert "at most 2 ranks" in f.fix


def test_omp_default_threads_count_when_unset() -> None:
    assert "omp-threads-oversubscribed" in slugs(
        facts(CPU_BOX, local_ranks=2)
    )  # 2 threads x 2 ranks > 2 cores
    assert "omp-threads-oversubscribed" not in slugs(
        facts(CPU_BOX, local_ranks=2, env={"OMP_NUM_THREADS": "1"})
    )


def test_mixed_cuda_runtimes() -> None:
    wheels = [
        {"name": "nvidia-cuda-runtime-cu11", "version": "11.8.89", "cuda_major": 11, "location": "/venv"},
        {"name": "nvidia-cuda-runtime-cu12", "version": "12.8.90", "cuda_major": 12, "location": "/venv"},
    ]
    f = only(facts(GPU_BOX, cuda_wheels=wheels), "mixed-cuda-runtimes")
    assert "nvidia-cuda-runtime-cu11==11.8.89 in /venv" in f.evidence
    assert f.fix.startswith("pip uninstall nvidia-cuda-runtime-cu11")


def test_same_runtime_installed_twice_or_for_another_cuda() -> None:
    twice = [
        {
            "name": "nvidia-cuda-runtime-cu12",
            "version": "12.1.105",
            "cuda_major": 12,
            "location": "/home/u/.local",
        },
        {"name": "nvidia-cuda-runtime-cu12", "version": "12.8.90", "cuda_major": 12, "location": "/venv"},
    ]
    assert "mixed-cuda-runtimes" in slugs(facts(GPU_BOX, cuda_wheels=twice))
    foreign = [{"name": "nvidia-cudnn-cu11", "version": "8.9.2", "cuda_major": 11, "location": "/venv"}]
    assert "mixed-cuda-runtimes" in slugs(facts(GPU_BOX, cuda_wheels=foreign))


def test_missing_keys_mean_unknown_not_a_crash() -> None:
    # a minimal record environment from an older torchscalpel
    assert run_checks({"torch": "2.13.0", "torch_cuda": None, "cuda_available": False, "gpus": []}) == []
    assert run_checks({}) == []


def test_findings_sorted_most_severe_first() -> None:
    box = facts(
        CPU_BOX, torch="2.4.0", packages={"torch": "2.4.0"}, driver={"nvidia_smi": "/usr/bin/nvidia-smi"}
    )
    severities = [int(f.severity) for f in run_checks(box)]
    assert severities == sorted(severities, reverse=True) and severities[0] == Severity.ERROR


@pytest.mark.parametrize(
    ("capability", "arch_list", "fires"),
    [
        ("12.0", ["sm_50", "sm_80", "sm_86", "sm_90"], True),  # RTX 50xx on a cu126 wheel
        ("8.9", ["sm_80", "sm_86", "sm_90"], False),  # Ada runs sm_86 cubins (same major)
        ("9.0", ["sm_80", "sm_90a"], False),
        ("12.0", ["sm_80", "compute_90"], False),  # PTX JIT
        ("7.0", ["sm_75", "sm_80"], True),  # V100 on a wheel that dropped Volta
    ],
)
def test_gpu_arch_not_in_wheel(capability: str, arch_list: list[str], fires: bool) -> None:
    box = facts(
        GPU_BOX,
        torch_build={"arch_list": arch_list},
        gpus=[{"index": 0, "name": "GPU", "capability": capability}],
    )
    assert ("gpu-arch-not-in-wheel" in slugs(box)) is fires


def test_busy_machine_warns_that_timings_will_be_noisy() -> None:
    from torchscalpel.envcheck.facts import cpu_facts

    # the load source injected: load 13 on this process's cores (the case the issue saw on 2 cores)
    cpu = cpu_facts(loadavg=lambda: (13.0, 12.0, 11.0))
    assert cpu["load_avg_1m"] == 13.0
    busy = facts(CPU_BOX, cpu={**cpu, "usable_cores": 2})
    f = only(busy, "machine-busy")
    assert f.severity is Severity.WARNING
    assert "load 13.0 on 2 cores" in f.message and "noisy" in f.message
    # this process alone (load 1) or a light load is not busy; an unknown load says nothing
    assert "machine-busy" not in slugs(facts(CPU_BOX, cpu={"usable_cores": 2, "load_avg_1m": 2.5}))
    assert "machine-busy" not in slugs(facts(CPU_BOX, cpu={"usable_cores": 2, "load_avg_1m": None}))
    assert "machine-busy" in slugs(facts(CPU_BOX, cpu={"usable_cores": 2, "load_avg_1m": 3.0}))


def test_env_report_on_a_busy_machine_is_not_clean() -> None:
    import io

    from rich.console import Console

    from torchscalpel.envcheck.report import build_report
    from torchscalpel.report.env_terminal import render as render_env

    busy = facts(CPU_BOX, cpu={"usable_cores": 2, "load_avg_1m": 13.0})
    report = build_report(probes=(), facts=busy)
    out = io.StringIO()
    render_env(report, Console(file=out, width=80))
    text = out.getvalue()
    assert "No environment problems found" not in text
    assert "machine-busy" in text and "noisy" in text
