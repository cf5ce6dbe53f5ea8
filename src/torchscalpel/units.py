"""Byte sizes as the user types them: one rule for every flag that takes a size.

SI suffixes are powers of 10, IEC suffixes powers of 2, a bare number is bytes::

    B            1
    kB / KB      10**3     KiB  2**10
    MB           10**6     MiB  2**20
    GB           10**9     GiB  2**30
    TB           10**12    TiB  2**40

The unit is case-insensitive (``10mb`` is ``10MB``); a space before it is allowed; the number may
have a fraction (``1.5GiB``), rounded down to whole bytes. A bare prefix (``10M``) is refused:
it would have to guess between the two families.
"""

from __future__ import annotations

import re
from fractions import Fraction

from torchscalpel.errors import UsageError

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
"""Lower-cased suffix -> bytes per unit."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, *, flag: str) -> int:
    """``512MiB`` / ``40GB`` / ``1048576`` -> bytes, by the rule above; ``flag`` names the option in errors.

    Raises :class:`UsageError` for anything that is not a number with a known unit, or that is
    smaller than one byte.
    """
    match = _SIZE.match(text or "")
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in UNITS):
        raise UsageError(
            f"{flag} {text!r} is not a size; write bytes with an optional unit, e.g. 512MiB (2^20 bytes each) "
            "or 40GB (10^9 bytes each)."
        )
    size = int(Fraction(match.group(1)) * UNITS.get(unit, 1))
    if size < 1:
        raise UsageError(f"{flag} {text!r} is less than one byte; give a positive size, e.g. 512MiB.")
    return size
