"""Per-rank entry point of ``scalpel launch --profile``/``--doctor``.

torchrun runs ``python -m torchscalpel.cli.rank_entry COMMAND BASE [OPTIONS] -- SCRIPT ARGS`` on
every rank; this turns it into ``scalpel COMMAND --out BASE/rank-R [OPTIONS] -- SCRIPT ARGS`` with
R the global rank (torchrun can only substitute the *local* rank into arguments, which repeats
across nodes).
"""

from __future__ import annotations

import os
import sys

from torchscalpel.errors import UsageError


def rank_argv(argv: list[str], rank: int) -> list[str]:
    """The ``scalpel`` argv for this rank (pure, for tests)."""
    if len(argv) < 2:
        raise UsageError("rank_entry needs COMMAND BASE_OUT [OPTIONS] -- SCRIPT [ARGS].")
    command, base, rest = argv[0], argv[1], argv[2:]
    extra = ["--no-report"] if command == "profile" and rank != 0 else []  # one HTML report is enough
    return [command, "--out", os.path.join(base, f"rank-{rank}"), *extra, *rest]


def main() -> int:
    """Run the scalpel command for this rank and return its exit code."""
    from torchscalpel.cli.main import main as scalpel_main

    return scalpel_main(rank_argv(sys.argv[1:], int(os.environ.get("RANK", "0"))))


if __name__ == "__main__":
    raise SystemExit(main())
