"""The data tables behind the env checks, and the version arithmetic that reads them.

The tables live in ``torchscalpel/data/*.json`` so that a new CUDA release or a new advisory is a
data change, not a code change: ``cuda_driver_table.json`` (minimum driver per CUDA toolkit, the
CUDA versions PyTorch publishes wheels for) and ``vulnerable_versions.json`` (package versions with
known security problems).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

_PRE_RELEASE = re.compile(r"(a|b|rc|dev|alpha|beta)\d*", re.I)


@cache
def load_table(name: str) -> dict[str, Any]:
    """One JSON table from ``torchscalpel/data`` (cached; the files never change at run time)."""
    # one name per joinpath: Traversable.joinpath takes a single name before Python 3.11
    text = resources.files("torchscalpel").joinpath("data").joinpath(name).read_text(encoding="utf-8")
    return json.loads(text)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"2.5.1+cu121"`` -> ``(2, 5, 1, 1)``; a pre-release such as ``2.6.0a0`` -> ``(2, 6, 0, 0)``.

    The last element orders a pre-release (0) before its release (1), which is what the
    "fixed in" comparisons need: a 2.6.0 nightly may predate the fix. None when no number leads.
    """
    if not text:
        return None
    public = text.strip().split("+", 1)[0]
    match = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", public)
    if not match:
        return None
    numbers = [int(p) for p in match.group(1).split(".")]
    while len(numbers) < 3:
        numbers.append(0)
    tail = match.group(2).lstrip(".-_")
    return (*numbers, 0 if _PRE_RELEASE.match(tail) else 1)


def version_below(installed: str | None, fixed_in: str) -> bool:
    """True when ``installed`` parses and is older than ``fixed_in``."""
    have, need = parse_version(installed), parse_version(fixed_in)
    return have is not None and need is not None and have < need


def _table_version(text: str) -> tuple[int, ...]:
    """A version read from the shipped table, which holds only parseable ones (tests/unit/test_env_tables.py)."""
    parsed = parse_version(text)
    if parsed is None:  # a typo in the data: say which entry instead of failing on a comparison with None
        raise ValueError(f"cuda_driver_table.json holds an unparseable version {text!r}")
    return parsed


def _os_key(platform: str) -> str:
    return "windows" if platform.startswith(("win", "cygwin")) else "linux"


def min_driver_for_cuda(cuda: str, platform: str = "linux") -> str | None:
    """The oldest driver that fully supports CUDA ``cuda`` (``"12.8"`` -> ``"570.26"`` on Linux)."""
    want = parse_version(cuda)
    if want is None:
        return None
    rows = [r for r in load_table("cuda_driver_table.json")["toolkits"] if _table_version(r["cuda"]) <= want]
    if not rows:
        return None
    return max(rows, key=lambda r: _table_version(r["cuda"]))[_os_key(platform)]


def max_cuda_for_driver(driver: str, platform: str = "linux") -> str | None:
    """The newest CUDA toolkit a driver version fully supports (``"535.104.05"`` -> ``"12.2"``)."""
    have = parse_version(driver)
    if have is None:
        return None
    key = _os_key(platform)
    ok = [
        r["cuda"] for r in load_table("cuda_driver_table.json")["toolkits"] if _table_version(r[key]) <= have
    ]
    return max(ok, key=_table_version) if ok else None


def newest_wheel_cuda_at_most(cuda: str) -> str | None:
    """The newest CUDA PyTorch ships wheels for that is not newer than ``cuda`` (for a fix line)."""
    limit = parse_version(cuda)
    if limit is None:
        return None
    ok = [c for c in load_table("cuda_driver_table.json")["pytorch_wheel_cuda"] if _table_version(c) <= limit]
    return max(ok, key=_table_version) if ok else None


def cuda_major_minor(text: str | None) -> tuple[int, int] | None:
    """``"12.8"`` / ``"12.8.1"`` -> ``(12, 8)``."""
    parsed = parse_version(text)
    return (parsed[0], parsed[1]) if parsed else None
