"""Sizes and durations: one rule for every flag that takes a size (:func:`parse_size`) and one for every flag
that takes a duration (:func:`parse_duration`); one way to print sizes (:func:`fmt_bytes`).

The size rule: SI suffixes are powers of 10, IEC suffixes powers of 2, a bare number is bytes::

    B            1
    kB / KB      10**3     KiB  2**10
    MB           10**6     MiB  2**20
    GB           10**9     GiB  2**30
    TB           10**12    TiB  2**40

The unit is case-insensitive (``10mb`` is ``10MB``); a space before it is allowed; the number may
have a fraction (``1.5GiB``), rounded down to whole bytes. A bare prefix (``10M``) is refused:
it would have to guess between the two families.

The duration rule: a number of seconds, or numbers with lower-case units, added up::

    90   90s   1.5s      seconds
    10m  10min           minutes
    1h   1h30m           hours (and minutes)

An upper-case unit (``10M``, ``1H``) is refused with the spelling to use: ``M`` reads as mega (a
size) as easily as minutes. :func:`size_type` / :func:`duration_type` wrap both rules for argparse
(``type=``); a bad value is a one-line usage error (exit 2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

from torchscalpel.errors import UsageError

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
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


DURATION_UNITS: dict[str, float] = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}
"""Duration suffix -> seconds per unit (lower case only)."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")


def parse_duration(
    text: str | float | int, *, flag: str, minimum: float = 0.0, allow_zero: bool = False
) -> float:
    """``90`` / ``90s`` / ``10m`` / ``1h30m`` -> seconds, by the rule above; ``flag`` names the option in errors.

    A value must be more than ``minimum`` seconds (or equal to 0 when ``allow_zero``). Raises
    :class:`UsageError` otherwise, with one sentence that shows the accepted spellings.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text or "").strip()
        spelled = raw.replace(" ", "")
        parts = _DURATION_PART.findall(spelled)
        if (
            not parts
            or "".join(n + u for n, u in parts) != spelled
            or (len(parts) > 1 and any(not u for _, u in parts))
        ):
            raise UsageError(
                f"{flag} {raw!r} is not a duration; write seconds (90 or 90s), minutes (10m) or hours "
                "(1h, 1h30m)."
            )
        bad = next((u for _, u in parts if u and u not in DURATION_UNITS), None)
        if bad is not None:
            if bad.lower() in DURATION_UNITS:
                hint = f" (durations use lower-case units: write {bad.lower()!r}" + (
                    "; 'M' reads as mega, a size prefix)" if bad == "M" else ")"
                )
            else:
                hint = " (that is a size unit)" if bad.lower() in UNITS else ""
            raise UsageError(f"{flag} {raw!r} has an unknown unit {bad!r}{hint}; write 90s, 10m or 1h.")
        seconds = sum(float(n) * DURATION_UNITS[u or "s"] for n, u in parts)
    if (
        not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
        or (0 < seconds < minimum)
    ):
        least = f"at least {minimum:g} s" if minimum else "more than zero"
        raise UsageError(
            f"{flag} must be a positive number of seconds ({least}"
            + (", or 0 to turn it off" if allow_zero else "")
            + f"), not {text!r}."
        )
    return seconds


def duration_type(flag: str, *, minimum: float = 0.0, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a duration flag: seconds as a float. A bad value raises :class:`UsageError`
    (not one of argparse's own errors), which ``scalpel``'s entry point prints as one line, exit 2."""

    def duration(text: str) -> float:
        return parse_duration(text, flag=flag, minimum=minimum, allow_zero=allow_zero)

    return duration


def size_type(flag: str) -> Callable[[str], int]:
    """An argparse ``type=`` for a size flag: bytes as an int (a bad value raises :class:`UsageError`)."""

    def size(text: str) -> int:
        return parse_size(text, flag=flag)

    return size
