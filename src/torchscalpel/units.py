"""Byte sizes: one rule for every flag that takes a size (:func:`parse_size`), one way to print them (:func:`fmt_bytes`).

The size rule: SI suffixes are powers of 10, IEC suffixes powers of 2, a bare number is bytes::

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


_BINARY_UNITS = (("B", 0), ("KiB", 1), ("MiB", 1), ("GiB", 2), ("TiB", 2))
"""Display units, each with its decimals: whole bytes, 0.1 KiB/MiB, 0.01 GiB/TiB."""


def fmt_bytes(n: float | None) -> str:
    """Bytes for people, in powers of 2: ``'-'`` / ``'789 B'`` / ``'1.5 KiB'`` / ``'45.6 MiB'`` / ``'1.23 GiB'``.

    The largest unit whose rounded value stays below 1024 (TiB at most); negative values keep
    their sign (headroom below zero).
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    for unit, decimals in _BINARY_UNITS:
        if round(value, decimals) < 1024 or unit == "TiB":
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.{decimals}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: TiB formats every remaining value")
