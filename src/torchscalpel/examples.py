"""The bundled example scripts, shipped as package data so ``scalpel demo`` works after ``pip install``.

In a checkout they live in the top-level ``examples/`` (``src/torchscalpel/example_scripts`` is a link
to it, which the wheel turns into real files); in an installed package they are
``torchscalpel/example_scripts/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torchscalpel.errors import UsageError

_PACKAGED = Path(__file__).resolve().parent / "example_scripts"
# A checkout whose link was not made (git without symlink support) still finds the top-level folder.
EXAMPLES_DIR = (
    _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "examples"
).resolve()
NAMES = ("char_transformer.py", "digits_cnn.py", "ddp_fsdp_transformer.py")


def example_script(name: str) -> Path:
    """Path of the bundled example ``name``; a clear error when it is not there."""
    path = EXAMPLES_DIR / name
    if not path.is_file():
        raise UsageError(
            f"There is no bundled example {name} in {EXAMPLES_DIR}; choose one of {', '.join(NAMES)} or name a script."
        )
    return path


def copy_examples(dest: Path) -> Path:
    """Copy the bundled examples into ``dest`` (made if needed) and return it.

    The demo runs these copies: the user can read and edit what ran, and file:line evidence points at
    them rather than into the installed package (whose frames torchscalpel treats as its own).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        shutil.copyfile(example_script(name), dest / name)
    return dest
