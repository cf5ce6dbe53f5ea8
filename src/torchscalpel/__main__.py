"""``python -m torchscalpel`` is the same as the ``scalpel`` command."""

from torchscalpel.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
