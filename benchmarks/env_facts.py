"""Cost of the environment facts every Run record carries, against PyTorch's own collect_env.

torchscalpel.envcheck.facts.collect_facts() runs at the start of every profiled run, so it must stay
cheap (no subprocesses). The peer is torch.utils.collect_env.get_env_info(), PyTorch's environment
report (it shells out to nvidia-smi, pip, conda, gcc, ...). Both are timed in the same process,
interleaved, after one warm-up call each; the figure is the median of --rounds rounds.

    python benchmarks/env_facts.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import torch.utils.collect_env as collect_env

    from torchscalpel.envcheck.checks import run_checks
    from torchscalpel.envcheck.facts import collect_facts

    collect_facts()
    collect_env.get_env_info()  # warm-up: imports and first-call caches for both
    ours, peer, checks = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        facts = collect_facts()
        t1 = time.perf_counter()
        run_checks(facts)
        t2 = time.perf_counter()
        collect_env.get_env_info()
        t3 = time.perf_counter()
        ours.append(t1 - t0)
        checks.append(t2 - t1)
        peer.append(t3 - t2)
    m_ours, m_peer, m_checks = (statistics.median(x) * 1e3 for x in (ours, peer, checks))
    print(f"collect_facts():                 median {m_ours:8.1f} ms over {args.rounds} rounds")
    print(f"run_checks(facts):               median {m_checks:8.2f} ms")
    print(f"torch collect_env.get_env_info(): median {m_peer:8.1f} ms")
    print(f"ratio peer / ours: {m_peer / m_ours:.1f}x")


if __name__ == "__main__":
    main()
