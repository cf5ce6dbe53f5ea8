"""Findings from probe results: a probe that failed or timed out, a half-precision dtype that is slow.

Separate from :mod:`torchscalpel.envcheck.checks` because these need measurements (``scalpel env``
without ``--no-probe``), while the checks read facts only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchscalpel.envcheck.probes import ProbeResult
from torchscalpel.findings import Finding, Severity

SLOW_LOWP_RATIO = 0.5
"""A bf16 / fp16 matmul at under half the fp32 speed is flagged: autocast to it would slow training."""

PROBE_FIXES = {
    "matmul": "The device fails or computes wrong results on a plain matmul: check nvidia-smi -q and dmesg for Xid "
    "errors; on CPU, check that the torch wheel matches the CPU (e.g. not an AVX-512 build on an older CPU).",
    "lowp": "Half-precision matmul fails here: keep fp32 (no autocast) on this device.",
    "compile": "Run a tiny torch.compile with TORCH_LOGS=+inductor to see the error: the usual causes are a missing "
    "C/C++ compiler (no-compiler-for-inductor), a missing or mismatched triton, or an unwritable "
    "TORCHINDUCTOR_CACHE_DIR; a timeout on a small CPU may only mean a cold cache (rerun).",
    "allreduce": "Processes on this machine cannot form a process group over loopback: check that 127.0.0.1 is "
    "reachable, that no firewall blocks local ports, and set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
    "to a working interface.",
}
PROBE_SLUGS = {name: f"probe-{name}-failed" for name in PROBE_FIXES}
"""Slugs for failed probes: ``probe-matmul-failed``, ``probe-lowp-failed``, ``probe-compile-failed``, ``probe-allreduce-failed``."""


def findings_from_probes(results: Iterable[ProbeResult | dict[str, Any]]) -> list[Finding]:
    """One finding per failed / timed-out probe, and one per slow half-precision dtype per device."""
    out: list[Finding] = []
    for raw in results:
        r = raw if isinstance(raw, ProbeResult) else ProbeResult(**raw)
        if r.status in ("failed", "timeout") and r.name in PROBE_SLUGS:
            word = "timed out" if r.status == "timeout" else "failed"
            out.append(
                Finding(
                    rule=PROBE_SLUGS[r.name],
                    severity=Severity.WARNING,
                    source="env",
                    message=f"The {r.name} probe on {r.device} {word}: {r.detail}.",
                    evidence=[f"{r.name} on {r.device}: {r.status} after {r.seconds:.1f} s", r.detail],
                    fix=PROBE_FIXES[r.name],
                )
            )
        if r.name == "lowp" and r.status == "ok":
            out.extend(_slow_lowp(r))
    return out


def _slow_lowp(r: ProbeResult) -> list[Finding]:
    slow = {
        label: m
        for label in ("bf16", "fp16")
        if (m := r.metrics.get(label)) and m.get("supported") and m["speedup_vs_fp32"] < SLOW_LOWP_RATIO
    }
    if not slow:
        return []
    good = [
        label
        for label in ("bf16", "fp16")
        if label not in slow
        and (r.metrics.get(label) or {}).get("supported")
        and r.metrics[label]["speedup_vs_fp32"] >= 1.0
    ]
    names = " and ".join(slow)
    evidence = [
        f"{label} matmul at n={r.metrics.get('n')}: {m['gflops']:,.1f} GFLOP/s = {m['speedup_vs_fp32']:.3f}x fp32 "
        f"({r.metrics.get('fp32_gflops', 0):,.1f} GFLOP/s)"
        for label, m in slow.items()
    ]
    fix = (
        f"Use {good[0]} instead: torch.autocast('{r.device.split(':')[0]}', dtype=torch.{'bfloat16' if good[0] == 'bf16' else 'float16'})"
        if good
        else "Keep fp32 on this device (no autocast to half precision)."
    )
    return [
        Finding(
            rule="slow-half-precision",
            severity=Severity.WARNING,
            source="env",
            message=f"{names} matmul on {r.device} is {1 / min(m['speedup_vs_fp32'] for m in slow.values()):.0f}x slower than fp32: "
            "autocast to it would slow training down.",
            evidence=evidence,
            fix=fix,
        )
    ]
