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

The number rule, for every integer and float flag of every command (:func:`parse_int`, :func:`parse_float`,
and their argparse forms :func:`int_type` / :func:`float_type`): a value has a least value of its own
(0 or 1 for counts) and is below 2^63 (:data:`INT_LIMIT`; sizes too), a float is finite, a duration is at
most 2^63 nanoseconds (:data:`DURATION_LIMIT_S`, what a timed wait accepts). Past a bound the refusal is
one sentence naming the flag: ``--steps must be at least 1 and below 2^63, not 99999999999999999999.``
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

from torchscalpel.errors import UsageError

INT_LIMIT = 2**63 - 1
"""The largest value any integer flag (and any size, in bytes) takes: what a C ``int64`` / ``Py_ssize_t``
holds. argparse's ``type=int`` reads any length, and a bigger count reached torch or a sampler as an
OverflowError traceback (``batch --sizes 99999999999999999999``) or ran until killed (``--warmup``)."""

FLOAT_LIMIT = float(2**63)
"""Floats are below 2^63 too, as the integers are: one bound to state."""

DURATION_LIMIT_S = float(2**63 // 10**9)
"""The longest duration a flag takes, about 292 years: 2^63 nanoseconds, which is also
``threading.TIMEOUT_MAX`` on Linux; a longer timeout made a timed wait raise OverflowError."""

_MAX_DIGITS = 40
"""Digits read before a number is called too large without converting it: Python refuses to convert
a decimal string of more than 4300 digits (a ValueError traceback), and 40 digits is past every bound."""


class NumberError(UsageError):
    """A number out of its flag's bounds, or not a number: one line, exit 2. Deliberately not a ValueError:
    argparse turns a ValueError from a ``type=`` into its own "invalid int value" message, losing the bound."""


def _bound_phrase(minimum: float, maximum: float, *, above: bool = False) -> str:
    """``at least 1 and below 2^63`` / ``more than 0 and at most 1024``: the range a refusal states."""
    low = f"more than {_figure(minimum)}" if above else f"at least {_figure(minimum)}"
    if minimum <= -INT_LIMIT:  # the plain-int safety net (cli.common.check_numbers): only the 2^63 bound
        low = "above -2^63"
    high = "below 2^63" if maximum >= INT_LIMIT else f"at most {_figure(maximum)}"
    return f"{low} and {high}"


def _figure(value: float) -> str:
    """A bound as written: ``4294967295``, not ``4.29497e+09``; ``0.5`` as it is."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _shown(text: object) -> str:
    """The value as the user typed it, cut short when it is very long (a refusal stays one line)."""
    shown = str(text).strip()
    return shown if len(shown) <= 60 else shown[:40] + f"... ({len(shown)} characters)"


def parse_int(
    text: str | int, *, flag: str, minimum: int = 0, maximum: int = INT_LIMIT, also: str = ""
) -> int:
    """A whole number for ``flag``, at least ``minimum`` and at most ``maximum`` (below 2^63 at most);
    :class:`NumberError` with one sentence otherwise. ``also`` names other accepted words (``'all'``)."""
    if isinstance(text, bool):
        raise NumberError(f"{flag} takes a whole number{also and ', ' + also}, not {text!r}.")
    raw = str(text).strip()
    digits = raw.lstrip("+-")
    if not digits.isdigit() or not digits.isascii() or len(raw) - len(digits) > 1:
        raise NumberError(f"{flag} takes a whole number{also and ', ' + also}, not {raw!r}.")
    maximum = min(maximum, INT_LIMIT)
    value = None if len(digits) > _MAX_DIGITS else int(raw)
    if value is None or not minimum <= value <= maximum:
        raise NumberError(
            f"{flag} must be {_bound_phrase(minimum, maximum)}{also and ' (or ' + also + ')'}, not {_shown(raw)}."
        )
    return value


def parse_float(
    text: str | float,
    *,
    flag: str,
    minimum: float = 0.0,
    maximum: float = FLOAT_LIMIT,
    above_minimum: bool = False,
) -> float:
    """A finite number for ``flag``, at least ``minimum`` (more than it with ``above_minimum``) and at most
    ``maximum`` (below 2^63 at most); :class:`NumberError` with one sentence otherwise (``nan``, ``inf``,
    ``1e400`` included)."""
    raw = str(text).strip()
    try:
        value = float(text) if isinstance(text, int | float) and not isinstance(text, bool) else float(raw)
    except ValueError:
        raise NumberError(f"{flag} takes a number, not {_shown(raw)!r}.") from None
    maximum = min(maximum, FLOAT_LIMIT)
    too_low = value <= minimum if above_minimum else value < minimum
    too_high = value >= FLOAT_LIMIT if maximum >= FLOAT_LIMIT else value > maximum  # 2^63 itself is out
    if not math.isfinite(value) or too_low or too_high:
        raise NumberError(
            f"{flag} must be a finite number, {_bound_phrase(minimum, maximum, above=above_minimum)}, "
            f"not {_shown(raw)}."
        )
    return value


class NumberType:
    """An argparse ``type=`` for a number flag (:func:`int_type`, :func:`float_type`): the value parsed by
    :func:`parse_int` / :func:`parse_float`. A bad value raises :class:`NumberError` (not argparse's own
    error), which ``scalpel``'s entry point prints as one line, exit 2. The bounds stay readable
    (``kind``, ``minimum``, ``maximum``) so that tests build their tables from the parser itself."""

    def __init__(
        self, flag: str, kind: str, minimum: float, maximum: float, *, above_minimum: bool = False
    ) -> None:
        self.flag, self.kind, self.minimum, self.maximum = flag, kind, minimum, maximum
        self.above_minimum = above_minimum
        self.__name__ = kind  # what argparse names the type in its own messages

    def __call__(self, text: str | int | float) -> int | float:
        if self.kind == "int":
            return parse_int(str(text), flag=self.flag, minimum=int(self.minimum), maximum=int(self.maximum))
        return parse_float(
            text,
            flag=self.flag,
            minimum=self.minimum,
            maximum=self.maximum,
            above_minimum=self.above_minimum,
        )

    def __repr__(self) -> str:
        return f"{self.kind}_type({self.flag!r}, minimum={self.minimum!r}, maximum={self.maximum!r})"


def int_type(flag: str, *, minimum: int = 0, maximum: int = INT_LIMIT) -> NumberType:
    """``type=int_type("--steps", minimum=1)``: a whole number in ``[minimum, maximum]``, below 2^63."""
    return NumberType(flag, "int", minimum, min(maximum, INT_LIMIT))


def float_type(
    flag: str, *, minimum: float = 0.0, maximum: float = FLOAT_LIMIT, above_minimum: bool = False
) -> NumberType:
    """``type=float_type("--atol")``: a finite number in ``[minimum, maximum]`` (``(minimum, maximum]`` with
    ``above_minimum``), below 2^63."""
    return NumberType(flag, "float", minimum, min(maximum, FLOAT_LIMIT), above_minimum=above_minimum)


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
    smaller than one byte or not below 2^63 bytes.
    """
    match = _SIZE.match(text or "")
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in UNITS):
        raise UsageError(
            f"{flag} {text!r} is not a size; write bytes with an optional unit, e.g. 512MiB (2^20 bytes each) "
            "or 40GB (10^9 bytes each)."
        )
    number = match.group(1)
    size = INT_LIMIT + 1 if len(number) > _MAX_DIGITS else int(Fraction(number) * UNITS.get(unit, 1))
    if size > INT_LIMIT:
        raise NumberError(f"{flag} must be a size below 2^63 bytes (8 EiB), not {_shown(text)!r}.")
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

    A value must be more than ``minimum`` seconds (or equal to 0 when ``allow_zero``) and at most
    :data:`DURATION_LIMIT_S`. Raises :class:`UsageError` otherwise, with one sentence that shows the
    accepted spellings.
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
    if seconds > DURATION_LIMIT_S:  # infinity included; NaN is refused below
        raise NumberError(
            f"{flag} must be at most {_figure(DURATION_LIMIT_S)} seconds (2^63 ns, about 292 years), "
            f"not {_shown(text)!r}."
        )
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
            + f"), not {_shown(text)!r}."
        )
    return seconds


def duration_type(flag: str, *, minimum: float = 0.0, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a duration flag: seconds as a float. A bad value raises :class:`UsageError`
    (not one of argparse's own errors), which ``scalpel``'s entry point prints as one line, exit 2."""

    def duration(text: str | float) -> float:
        return parse_duration(text, flag=flag, minimum=minimum, allow_zero=allow_zero)

    return duration


def size_type(flag: str) -> Callable[[str], int]:
    """An argparse ``type=`` for a size flag: bytes as an int (a bad value raises :class:`UsageError`)."""

    def size(text: str) -> int:
        return parse_size(text, flag=flag)

    return size
