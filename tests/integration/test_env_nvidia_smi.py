"""nvidia-smi parsing, and the query against fake nvidia-smi executables (answering, failing, hanging)."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.envcheck import nvidia_smi

BANNER = """Sat Nov 29 20:00:00 2026
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""
CSV = "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 535.104.05\n1, NVIDIA H100 80GB HBM3, 81559, 9.0, 535.104.05\n"


def _fake_smi(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe)


def test_parse_header_and_query() -> None:
    assert nvidia_smi.parse_header(BANNER) == {"driver_version": "535.104.05", "cuda_version": "12.2"}
    gpus = nvidia_smi.parse_query(CSV)
    assert len(gpus) == 2
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "535.104.05",
        "memory_bytes": 81559 * 1024 * 1024,
        "capability": "9.0",
    }
    assert nvidia_smi.parse_query("[N/A]\n") == []


def test_query_a_fake_nvidia_smi(tmp_path: Path) -> None:
    exe = _fake_smi(
        tmp_path,
        f'if [ -z "$1" ]; then cat <<EOF\n{BANNER}EOF\nelse printf "{CSV}"; fi\n'.replace("\n0,", "\n0,"),
    )
    out = nvidia_smi.query(exe, timeout=10)
    assert out["error"] is None
    assert out["cuda_version"] == "12.2" and out["driver_version"] == "535.104.05"
    assert [g["name"] for g in out["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2


def test_query_falls_back_without_compute_cap(tmp_path: Path) -> None:
    # an old driver: --query-gpu with compute_cap fails, without it answers
    body = (
        'case "$1" in *compute_cap*) echo "Field compute_cap is not a valid field"; exit 2;; '
        '--query-gpu*) echo "0, Tesla V100, 16160, 450.80.02";; *) echo "Driver Version: 450.80.02";; esac\n'
    )
    out = nvidia_smi.query(_fake_smi(tmp_path, body), timeout=10)
    assert out["error"] is None
    assert out["gpus"][0]["name"] == "Tesla V100" and "capability" not in out["gpus"][0]


def test_query_reports_failure_and_hang_as_sentences(tmp_path: Path) -> None:
    failing = nvidia_smi.query(
        _fake_smi(
            tmp_path,
            'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9\n',
        )
    )
    assert failing["error"].startswith("nvidia-smi exited with 9: NVIDIA-SMI has failed")
    hang = tmp_path / "hang"
    hang.mkdir()
    out = nvidia_smi.query(_fake_smi(hang, "exec sleep 30\n"), timeout=0.5)
    assert "did not answer within 0.5 s" in out["error"]
    assert nvidia_smi.query(str(tmp_path / "missing"))["error"].startswith("nvidia-smi could not run")
