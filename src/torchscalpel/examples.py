"""Where the bundled example scripts live (``examples/`` at the top of the source tree)."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.errors import UsageError

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def example_script(name: str) -> Path:
    """Path of ``examples/<name>``; a clear error when torchscalpel was installed without them."""
    path = EXAMPLES_DIR / name
    if not path.exists():
        raise UsageError(
            f"The bundled example {name} is not here ({path}); run from a torchscalpel checkout or name a script."
        )
    return path
