"""The data tables and the version arithmetic over them."""

from __future__ import annotations

import pytest

from torchscalpel.envcheck.tables import (
    load_table,
    max_cuda_for_driver,
    min_driver_for_cuda,
    newest_wheel_cuda_at_most,
    parse_version,
    version_below,
)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("2.5.1+cu121", (2, 5, 1, 1)),
        ("2.6.0a0+git1", (2, 6, 0, 0)),
        ("2.6.0.dev20241112", (2, 6, 0, 0)),
        ("12.8", (12, 8, 0, 1)),
        ("1.16.0rc1", (1, 16, 0, 0)),
        ("", None),
        ("abc", None),
        (None, None),
    ],
)
def test_parse_version(text: str | None, parsed: tuple[int, ...] | None) -> None:
    assert parse_version(text) == parsed


def test_version_below() -> None:
    assert version_below("2.5.1", "2.6.0") and version_below("2.6.0rc1", "2.6.0")
    assert not version_below("2.6.0", "2.6.0") and not version_below("2.10.0", "2.6.0")
    assert not version_below("weird", "2.6.0")  # unknown is not "vulnerable"


@pytest.mark.parametrize(
    ("driver", "platform", "cuda"),
    [
        ("535.104.05", "linux", "12.2"),
        ("570.26", "linux", "12.8"),
        ("570.25", "linux", "12.6"),
        ("450.36.06", "linux", "11.0"),
        ("440.33", "linux", None),
        ("546.12", "win32", "12.3"),
        ("580.65.06", "linux", "13.0"),
    ],
)
def test_max_cuda_for_driver(driver: str, platform: str, cuda: str | None) -> None:
    assert max_cuda_for_driver(driver, platform) == cuda


def test_min_driver_for_cuda() -> None:
    assert min_driver_for_cuda("12.8") == "570.26"
    assert min_driver_for_cuda("12.8", "win32") == "570.65"
    assert min_driver_for_cuda("12.7") == "560.28.03"  # no 12.7 release: the one before applies
    assert min_driver_for_cuda("10.2") is None


def test_newest_wheel_cuda_at_most() -> None:
    assert newest_wheel_cuda_at_most("12.2") == "12.1"
    assert newest_wheel_cuda_at_most("12.8") == "12.8"
    assert newest_wheel_cuda_at_most("11.4") is None


def test_driver_table_is_monotone() -> None:
    """A typo in the data (a driver lower than an older CUDA's) would break every lookup above."""
    rows = load_table("cuda_driver_table.json")["toolkits"]
    for key in ("linux", "windows"):
        cudas = [parse_version(r["cuda"]) for r in rows]
        drivers = [parse_version(r[key]) for r in rows]
        assert cudas == sorted(cudas)
        assert drivers == sorted(drivers), key


def test_vulnerable_rows_are_complete() -> None:
    for row in load_table("vulnerable_versions.json")["rows"]:
        assert {"slug", "package", "fixed_in", "advisory", "message", "fix"} <= row.keys()
        assert parse_version(row["fixed_in"]) is not None
        assert "{version}" in row["message"]
