"""What ``nvidia-smi`` says about the GPUs and the driver (``scalpel env`` only, never in records).

torch only sees GPUs when its build and the driver agree; nvidia-smi sees them regardless, which
is what lets ``scalpel env`` say "there are 8 H100s here but your torch is a CPU build". It runs
as a subprocess with a timeout (a wedged driver can hang it), so it is kept out of
:func:`torchscalpel.envcheck.facts.collect_facts`.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

QUERY_FIELDS = ("index", "name", "memory.total", "compute_cap", "driver_version")


def query(executable: str, timeout: float = 10.0) -> dict[str, Any]:
    """Run nvidia-smi twice (header for the CUDA version, ``--query-gpu`` for the GPUs).

    Returns ``{"driver_version", "cuda_version", "gpus": [...], "error"}``; ``error`` is a
    sentence when nvidia-smi failed or timed out (a finding's evidence, never an exception).
    """
    out: dict[str, Any] = {"driver_version": None, "cuda_version": None, "gpus": [], "error": None}
    try:
        header = subprocess.run([executable], capture_output=True, text=True, timeout=timeout, check=False)
        out.update({k: v for k, v in parse_header(header.stdout).items() if v})
        fields = list(QUERY_FIELDS)
        result = subprocess.run(
            [executable, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:  # drivers before ~510 do not know compute_cap
            fields.remove("compute_cap")
            result = subprocess.run(
                [executable, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        if result.returncode != 0:
            message = (result.stdout + result.stderr).strip().splitlines()
            out["error"] = (
                f"nvidia-smi exited with {result.returncode}: {message[0] if message else 'no output'}"
            )
            return out
        out["gpus"] = parse_query(result.stdout, fields)
        if out["gpus"] and not out["driver_version"]:
            out["driver_version"] = out["gpus"][0].get("driver_version")
    except subprocess.TimeoutExpired:
        out["error"] = f"nvidia-smi did not answer within {timeout:g} s (a hung driver or GPU)"
    except OSError as exc:
        out["error"] = f"nvidia-smi could not run: {exc.strerror or exc}"
    return out


def parse_header(text: str) -> dict[str, str | None]:
    """Driver and CUDA version from nvidia-smi's banner (``Driver Version: 535.104.05  CUDA Version: 12.2``)."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return {
        "driver_version": driver.group(1) if driver else None,
        "cuda_version": cuda.group(1) if cuda else None,
    }


def parse_query(text: str, fields: list[str] | tuple[str, ...] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Rows of ``--query-gpu ... --format=csv,noheader,nounits`` as dicts (memory in bytes)."""
    gpus: list[dict[str, Any]] = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells, strict=True))
        gpu: dict[str, Any] = {
            "index": int(row["index"]) if row["index"].isdigit() else row["index"],
            "name": row["name"],
            "driver_version": row.get("driver_version"),
        }
        try:
            gpu["memory_bytes"] = int(float(row["memory.total"]) * 1024 * 1024)  # MiB with nounits
        except ValueError:
            gpu["memory_bytes"] = None
        if "compute_cap" in row:
            gpu["capability"] = row["compute_cap"] if re.fullmatch(r"\d+\.\d+", row["compute_cap"]) else None
        gpus.append(gpu)
    return gpus
