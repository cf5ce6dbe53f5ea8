"""``scalpel launch --plan``: plan the script's memory before its ranks start; warn when it will not fit.

The plan runs in a child process (``scalpel plan -- SCRIPT ARGS``, script mode) as a one-rank world:
the script reaches its first optimizer step for real on one device, and the plan then scales what
it saw to the launch's world size for every strategy. A child process, because a script run
in the launcher would leave a process group and a CUDA context behind while the ranks run. The
preflight only advises: whatever it finds, the launch goes ahead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.childproc import child_env
from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.netutil import free_port
from torchscalpel.units import fmt_bytes

PLAN_TIMEOUT_S = 600
"""The plan child runs one real training step plus the simulation; a hung script must not block launch."""


@dataclass(slots=True)
class Preflight:
    """What the plan said: whether any strategy fits, and the lines to print."""

    planned: bool
    fits: bool
    lines: list[str] = field(default_factory=list)


def world_size(options: LaunchOptions) -> tuple[int, int]:
    """(total ranks, nodes) the launch will have, from torchrun's ``--nproc-per-node`` and ``--nnodes``."""
    nodes = int(str(options.nnodes).split(":")[-1])
    per_node = str(options.nproc_per_node)
    if per_node.isdigit():
        return int(per_node) * nodes, nodes
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    count = gpus if per_node in ("gpu", "auto") and gpus else os.cpu_count() or 1
    return count * nodes, nodes


def plan_command(options: LaunchOptions, plan_dir: Path) -> list[str]:
    """The ``scalpel plan`` command line that plans this launch's script."""
    ranks, nodes = world_size(options)
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "plan",
        "--world-size",
        str(ranks),
        "--nodes",
        str(nodes),
        "--no-max-batch",
        "--out",
        str(plan_dir),
        "--json",
        str(plan_dir / "plan.json"),
    ]
    if options.plan_device_memory:
        cmd += ["--device-memory", options.plan_device_memory]
    return [*cmd, "--", options.training_script, *options.training_script_args]


def one_rank_env() -> dict[str, str]:
    """Environment of a one-rank world, so the script's ``init_process_group`` works in the plan child."""
    return child_env(
        RANK="0",
        LOCAL_RANK="0",
        GROUP_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def verdict(plan: dict) -> Preflight:
    """Read a plan's JSON: per-strategy peak against capacity, and a warning line if nothing fits."""
    device = plan["device"]
    rows = plan["rows"]
    cells = [
        f"{r['strategy']} {fmt_bytes(r['needed'])} {'fits' if r['fits'] else 'does NOT fit'}" for r in rows
    ]
    head = (
        f"scalpel launch --plan: per-rank memory on {device['name']} ({fmt_bytes(device['memory'])}), "
        f"{plan['world_size']} rank(s), batch {plan['batch_size']}: " + " · ".join(cells)
    )
    fits = any(r["fits"] for r in rows) or any(r["fits"] for r in plan.get("alternatives", []))
    lines = [head]
    if not fits:
        lines.append("WARNING: this run will not fit on any strategy; " + plan["recommendation"])
    elif not all(r["fits"] for r in rows):
        lines.append("note: " + plan["recommendation"])
    return Preflight(planned=True, fits=fits, lines=lines)


def run_preflight(options: LaunchOptions, out_dir: Path, *, timeout: float = PLAN_TIMEOUT_S) -> Preflight:
    """Plan the launch's script in a one-rank child; never raises for the script's own failures."""
    plan_dir = out_dir / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    cmd = plan_command(options, plan_dir)
    print(
        f"scalpel launch --plan: planning {options.training_script} (one rank, first optimizer step)...",
        flush=True,
    )
    try:
        proc = subprocess.run(
            cmd, env=one_rank_env(), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Preflight(
            False,
            True,
            [f"scalpel launch --plan: the plan did not finish in {timeout:.0f} s; launching without it."],
        )
    (plan_dir / "plan.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    plan_json = plan_dir / "plan.json"
    if proc.returncode != 0 or not plan_json.exists():
        last = next(
            (line for line in reversed((proc.stderr or proc.stdout).splitlines()) if line.strip()),
            "no output",
        )
        return Preflight(
            False,
            True,
            [
                f"scalpel launch --plan: could not plan this script ({last.strip()}); "
                f"launching anyway (log: {plan_dir / 'plan.log'})."
            ],
        )
    result = verdict(json.loads(plan_json.read_text(encoding="utf-8")))
    result.lines.append(f"plan: {plan_dir / 'report.html'}")
    return result
