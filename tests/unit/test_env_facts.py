"""Cheap environment facts: keys, JSON-ready, no subprocess, and the parsers behind them on fake inputs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from torchscalpel.envcheck import facts as facts_mod
from torchscalpel.envcheck.checks import run_checks
from torchscalpel.envcheck.facts import (
    collect_facts,
    compiler_facts,
    cpu_facts,
    cuda_wheel_distributions,
    package_versions,
    read_nvidia_driver_version,
)


def test_collect_facts_is_json_ready_and_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(*a: object, **k: object) -> None:
        raise AssertionError("collect_facts must not start a process")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    facts = collect_facts()
    assert json.loads(json.dumps(facts)) == facts
    for key in (
        "python",
        "torch",
        "torch_cuda",
        "torch_build",
        "cpu",
        "driver",
        "distributed",
        "compilers",
        "packages",
        "cuda_wheels",
        "env",
        "gpus",
        "cuda_available",
        "platform",
    ):
        assert key in facts, key
    import torch

    assert facts["torch"] == torch.__version__
    assert facts["torch_build"]["kind"] == (
        "cuda" if torch.version.cuda else "rocm" if torch.version.hip else "cpu"
    )
    assert facts["distributed"]["gloo"] == torch.distributed.is_gloo_available()
    assert facts["cpu"]["usable_cores"] == len(os.sched_getaffinity(0))


def test_env_vars_that_matter_are_kept_and_others_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("SOME_SECRET_TOKEN", "x")
    env = collect_facts()["env"]
    assert (
        env["NCCL_DEBUG"] == "INFO" and env["TORCHINDUCTOR_FREEZING"] == "1" and env["OMP_NUM_THREADS"] == "3"
    )
    assert "SOME_SECRET_TOKEN" not in env


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "535.104.05",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  (dvs-builder@U16)\n",
            "570.124.06",
        ),
        ("garbage\n", None),
    ],
)
def test_read_nvidia_driver_version(tmp_path: Path, text: str, version: str | None) -> None:
    path = tmp_path / "version"
    path.write_text(text)
    assert read_nvidia_driver_version(path) == version
    assert read_nvidia_driver_version(tmp_path / "missing") is None


def test_cpu_facts_from_a_fake_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Fake Xeon 9999\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile\n"
    )
    cpu = cpu_facts(info)
    assert cpu["model"] == "Fake Xeon 9999"
    assert cpu["flags"] == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]
    assert cpu["usable_cores"] >= 1


def _fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_cuda_wheels_read_through_importlib_metadata(tmp_path: Path) -> None:
    _fake_dist(tmp_path, "nvidia-cuda-runtime-cu11", "11.8.89")
    _fake_dist(tmp_path, "nvidia-cuda-runtime-cu12", "12.8.90")
    _fake_dist(tmp_path, "nvidia-cuda-runtime", "13.0.96")  # CUDA 13 wheels drop the suffix
    _fake_dist(tmp_path, "nvidia-ml-py", "12.560.30")  # not a CUDA wheel
    _fake_dist(tmp_path, "numpy", "2.0.0")
    wheels = cuda_wheel_distributions(path=[str(tmp_path)])
    assert [(w["name"], w["cuda_major"]) for w in wheels] == [
        ("nvidia-cuda-runtime", 13),
        ("nvidia-cuda-runtime-cu11", 11),
        ("nvidia-cuda-runtime-cu12", 12),
    ]
    assert wheels[0]["location"] == str(tmp_path)
    # the whole path: fake installed distributions -> facts -> the mixed-cuda-runtimes finding
    found = run_checks({"torch_cuda": "12.8", "cuda_wheels": wheels})
    assert [f.rule for f in found] == ["mixed-cuda-runtimes"]


def test_no_cuda_wheels_in_an_empty_site(tmp_path: Path) -> None:
    assert cuda_wheel_distributions(path=[str(tmp_path)]) == []


def test_compiler_lookup_honours_cxx_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    assert compiler_facts() == {"cxx": None, "cc": None}
    fake = tmp_path / "my-g++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", "my-g++")
    assert compiler_facts()["cxx"] == str(fake)
    monkeypatch.setenv("CXX", "not-there")
    assert compiler_facts()["cxx"] is None


def test_package_versions_leave_out_missing() -> None:
    out = package_versions(("torch", "no-such-distribution-xyz"))
    assert "torch" in out and "no-such-distribution-xyz" not in out


def test_facts_module_exports_contract() -> None:
    assert callable(facts_mod.collect_facts)
