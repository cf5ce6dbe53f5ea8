"""Command line: one module per verb, each with ``register(subparsers)`` and ``run(args) -> int``."""
