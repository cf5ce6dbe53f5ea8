"""The one-screen terminal view of a ``scalpel env`` report (rich). Renders only; never measures."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchscalpel.console import say

_SEV_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}
_STATUS_STYLE = {"ok": "green", "failed": "bold red", "timeout": "bold yellow", "skipped": "dim"}


def _gib(nbytes: int | None) -> str:
    return f"{nbytes / 2**30:.0f} GiB" if nbytes else "?"


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def fact_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of the facts block; shared by the screen and tests."""
    cpu = facts.get("cpu") or {}
    build = facts.get("torch_build") or {}
    drv = facts.get("driver") or {}
    smi = facts.get("nvidia_smi") or {}
    dist = facts.get("distributed") or {}
    comp = facts.get("compilers") or {}
    pk = facts.get("packages") or {}
    rows = [
        ("Python", f"{facts.get('python')} ({facts.get('executable')})"),
        ("OS", f"{facts.get('os')} {facts.get('machine')}"),
        (
            "CPU",
            f"{cpu.get('model') or '?'}: {cpu.get('usable_cores', facts.get('cpu_count'))} usable cores"
            f" ({cpu.get('physical_cores') or '?'} physical), load {cpu.get('load_avg_1m', '?')};"
            f" torch kernels {cpu.get('torch_capability') or '?'}",
        ),
    ]
    flags = cpu.get("flags") or []
    if flags:
        torch_view = f"; torch: avx512_bf16 {_yes(cpu.get('torch_avx512_bf16'))}, amx {_yes(cpu.get('torch_amx_tile'))}"
        rows.append(("CPU features", " ".join(flags) + torch_view))
    kind = build.get("kind", "cpu")
    what = {
        "cuda": f"CUDA {facts.get('torch_cuda')}",
        "rocm": f"ROCm/HIP {facts.get('torch_hip')}",
        "cpu": "CPU-only",
    }[kind]
    cudnn = f", cuDNN {build['cudnn']}" if build.get("cudnn") else ""
    cudnn += f", NCCL {build['nccl']}" if build.get("nccl") else ""
    rows.append(
        ("torch", f"{facts.get('torch')} ({what} build{cudnn}), {facts.get('torch_threads')} thread(s)")
    )
    gpus = facts.get("gpus") or []
    if gpus:
        for g in gpus:
            rows.append(
                (
                    f"GPU {g.get('index')}",
                    f"{g.get('name')}, {_gib(g.get('memory_bytes'))}, sm {g.get('capability')}"
                    f", {g.get('multiprocessors', '?')} SMs",
                )
            )
        if "bf16_supported" in build:
            rows.append(("GPU bf16", _yes(build["bf16_supported"])))
    elif smi.get("gpus"):
        for g in smi["gpus"]:
            rows.append(
                (
                    f"GPU {g.get('index')}",
                    f"{g.get('name')}, {_gib(g.get('memory_bytes'))}, sm {g.get('capability') or '?'}"
                    " (nvidia-smi; torch cannot see it)",
                )
            )
    else:
        rows.append(
            (
                "GPUs",
                "none visible to torch" + (" (torch.cuda.is_available() is False)" if kind != "cpu" else ""),
            )
        )
    driver = drv.get("nvidia_version") or smi.get("driver_version")
    cuda = drv.get("cuda_version") or smi.get("cuda_version")
    if driver or cuda or drv.get("nvidia_smi"):
        rows.append(
            (
                "NVIDIA driver",
                f"{driver or '?'}, supports CUDA up to {cuda or '?'}"
                + (f"; nvidia-smi: {smi['error']}" if smi.get("error") else ""),
            )
        )
    if kind == "cuda" or pk.get("triton") or pk.get("pytorch-triton"):
        triton = (
            pk.get("triton") or pk.get("pytorch-triton") or pk.get("pytorch-triton-rocm") or "not installed"
        )
        rows.append(("triton", triton))
    rows.append(("Compilers", f"C++ {comp.get('cxx') or 'none'}, C {comp.get('cc') or 'none'}"))
    if dist:
        if not dist.get("available"):
            rows.append(("Distributed", "torch.distributed not available in this build"))
        else:
            backends = [b for b in ("gloo", "nccl", "mpi", "ucc", "xccl") if dist.get(b)]
            rows.append(("Distributed", "backends: " + (", ".join(backends) or "none")))
    shown = [
        f"{k} {pk[k]}"
        for k in ("numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "torchvision", "torchao", "transformers")
        if k in pk
    ]
    if shown:
        rows.append(("Packages", ", ".join(shown)))
    wheels = facts.get("cuda_wheels") or []
    if wheels:
        majors = sorted({w["cuda_major"] for w in wheels})
        rows.append(
            ("CUDA wheels", f"{len(wheels)} nvidia-* packages for CUDA {', '.join(map(str, majors))}")
        )
    env = facts.get("env") or {}
    rows.append(
        (
            "Variables",
            ", ".join(f"{k}={v}" for k, v in sorted(env.items()) if k != "LD_LIBRARY_PATH") or "none set",
        )
    )
    if facts.get("local_ranks"):
        rows.append(("Local ranks", str(facts["local_ranks"])))
    return rows


def render(report: dict[str, Any], console: Console) -> None:
    """Print the facts, the probe table and the findings (with evidence and fix)."""
    facts = report.get("facts") or {}
    console.print(Text(f"scalpel env · torchscalpel {report.get('tool_version')}", style="bold"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value in fact_rows(facts):
        grid.add_row(label, value)
    console.print(grid)

    probes = report.get("probes") or []
    cells = [
        [
            str(p["name"]),
            str(p["device"]),
            str(p["status"]),
            str(p.get("detail", "")),
            f"{p.get('seconds', 0):.1f} s",
        ]
        for p in probes
    ]
    # the table's width: each column's widest cell (or header) and 3 columns of rule and padding between
    wide = (
        sum(
            max(len(c[i]) for c in [["probe", "device", "status", "result", "time"], *cells])
            for i in range(5)
        )
        + 12
    )
    if probes and wide > console.width:
        # a table narrower than its cells wrapped them ("then 0.12" / "ms"): each probe a line of its own,
        # wrapped between words (say), never inside a figure
        console.print(Text("Probes", style="bold"))
        for name, device, status, detail, took in cells:
            say(console, f"{name} ({device}): {status} · {detail} · {took}", hang=2, sep=" · ")
    elif probes:
        table = Table(title="Probes", title_justify="left", show_edge=False)
        for col in ("probe", "device", "status", "result", "time"):
            table.add_column(col, justify="right" if col == "time" else "left")
        for p in probes:
            table.add_row(
                p["name"],
                p["device"],
                Text(p["status"], style=_STATUS_STYLE.get(p["status"], "")),
                p.get("detail", ""),
                f"{p.get('seconds', 0):.1f} s",
            )
        console.print(table)
    elif not report.get("probes_requested"):
        console.print(Text("Probes skipped (--no-probe).", style="dim"))
    if not report.get("complete", True):
        console.print(Text("Probes interrupted: the results above are partial.", style="bold yellow"))

    findings = report.get("findings") or []
    if not findings:
        console.print(Text("No environment problems found.", style="green"))
        return
    console.print(Text("Findings", style="bold"))
    for f in findings:
        sev = f["severity"]
        head = Text()
        head.append(f"{sev.upper():<7} ", style=_SEV_STYLE.get(sev, ""))
        head.append(f"{f['rule']}: ", style="bold")
        head.append(f["message"])
        # continuation lines under the message, not back at column 0 (say keeps a figure with its unit)
        say(console, head, hang=8)
        for e in f.get("evidence") or []:
            say(console, Text(f"        - {e}", style="dim"), hang=2)
        if f.get("fix"):
            say(console, Text(f"        fix: {f['fix']}"), hang=5)
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in ("error", "warning", "info")}
    console.print(
        Text(
            f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info", style="bold"
        )
    )
