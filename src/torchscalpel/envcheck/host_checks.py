"""Checks of the host itself over environment facts: CPU threads per rank against the cores, and a machine
too busy to time on. Pure functions of the facts dict, like every check in :mod:`torchscalpel.envcheck.checks`
(which lists them in ``CHECKS``)."""

from __future__ import annotations

from torchscalpel.envcheck.check_types import Facts
from torchscalpel.envcheck.check_types import env_finding as _finding
from torchscalpel.findings import Finding, Severity


def _threads_per_rank(facts: Facts) -> tuple[int | None, str]:
    env = facts.get("env") or {}
    raw = env.get("OMP_NUM_THREADS")
    if raw and raw.strip().isdigit() and int(raw) > 0:
        return int(raw), f"OMP_NUM_THREADS={raw}"
    if facts.get("torch_threads"):
        return int(
            facts["torch_threads"]
        ), f"torch.get_num_threads()={facts['torch_threads']} (OMP_NUM_THREADS unset)"
    return None, ""


def _local_ranks(facts: Facts) -> tuple[int, str]:
    if facts.get("local_ranks"):
        return int(facts["local_ranks"]), f"{facts['local_ranks']} local ranks (--nproc-per-node)"
    raw = (facts.get("env") or {}).get("LOCAL_WORLD_SIZE")
    if raw and raw.strip().isdigit() and int(raw) > 0:
        return int(raw), f"LOCAL_WORLD_SIZE={raw}"
    return 1, "1 process"


def check_omp_oversubscribed(facts: Facts) -> list[Finding]:
    """Threads per rank times ranks on this machine above the cores this process may use."""
    threads, t_src = _threads_per_rank(facts)
    ranks, r_src = _local_ranks(facts)
    cores = (facts.get("cpu") or {}).get("usable_cores") or facts.get("cpu_count")
    if not threads or not cores or threads * ranks <= cores:
        return []
    if ranks > cores:  # even one thread per rank is too many: fewer ranks is the only fix
        fix = f"Run at most {cores} ranks on this machine (e.g. torchrun --nproc-per-node {cores}) with OMP_NUM_THREADS=1."
    else:
        fix = f"export OMP_NUM_THREADS={cores // ranks}  # cores // local ranks"
    return [
        _finding(
            "omp-threads-oversubscribed",
            Severity.WARNING,
            f"{ranks} rank(s) x {threads} thread(s) = {threads * ranks} threads on {cores} cores: they will preempt each other and every step slows down.",
            [t_src, r_src, f"{cores} usable cores (CPU affinity)"],
            fix,
        )
    ]


BUSY_LOAD_PER_CORE = 1.0
"""Other processes' run queue per usable core at which timings stop being trustworthy: at 1.0 they alone
could keep every core busy, so a measured step waits for a core by an amount that changes run to run."""


def check_machine_busy(facts: Facts) -> list[Finding]:
    """The 1-minute load average, less this process, at or above the usable cores: timings will be noisy."""
    cpu = facts.get("cpu") or {}
    load = cpu.get("load_avg_1m")
    cores = cpu.get("usable_cores") or facts.get("cpu_count")
    if load is None or not cores:
        return []
    others = max(0.0, float(load) - 1.0)  # this process is one runnable task of the load
    if others < BUSY_LOAD_PER_CORE * cores:
        return []
    return [
        _finding(
            "machine-busy",
            Severity.WARNING,
            f"This machine is busy (load {float(load):.1f} on {cores} cores): other processes compete for the "
            "CPUs, so step times measured now will be noisy and slower than on an idle machine.",
            [
                f"1-minute load average {float(load):.2f} (os.getloadavg; in a container it counts the whole host)",
                f"{cores} usable cores (CPU affinity)",
            ],
            "Measure when the machine is idle (see `uptime` or `top`), or compare runs measured at the same load; "
            "judge differences smaller than the run-to-run spread as noise.",
        )
    ]
