"""One size rule for every flag (SI powers of 10, IEC powers of 2, bare bytes) and one byte formatter."""

from __future__ import annotations

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.units import fmt_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("100", 100),
        ("7B", 7),
        ("1kB", 1000),
        ("1KB", 1000),
        ("512kb", 512_000),
        ("10MB", 10**7),
        ("40GB", 40 * 10**9),
        ("2TB", 2 * 10**12),
        ("1KiB", 1024),
        ("512 MiB", 512 * 2**20),
        ("80GiB", 80 * 2**30),
        ("1TiB", 2**40),
        ("10mib", 10 * 2**20),
        ("10MIB", 10 * 2**20),
        ("24gib", 24 * 2**30),
        ("1.5GiB", 3 * 2**29),
        ("0.5MB", 500_000),
        (" 64KiB ", 65536),
        ("1.5", 1),
    ],
)
def test_si_units_are_powers_of_ten_iec_units_powers_of_two(text, size):
    assert parse_size(text, flag="--max-body") == size


@pytest.mark.parametrize("bad", ["", "ten", "10XB", "10M", "10 G", "1e9", "-1GiB", "GiB", "1.2.3MB", "inf"])
def test_unreadable_sizes_name_the_flag_and_show_an_example(bad):
    with pytest.raises(UsageError) as info:
        parse_size(bad, flag="--device-memory")
    message = str(info.value)
    assert message.startswith(f"--device-memory {bad!r} is not a size") and "e.g. 512MiB" in message


@pytest.mark.parametrize("tiny", ["0", "0GB", "0.4", "0.0001KB"])
def test_sizes_below_one_byte_are_refused(tiny):
    with pytest.raises(
        UsageError, match=r"--max-body .* less than one byte; give a positive size, e\.g\. 512MiB"
    ):
        parse_size(tiny, flag="--max-body")


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (789, "789 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (45.6 * 2**20, "45.6 MiB"),
        (1023.97 * 2**10, "1.0 MiB"),
        (22.49 * 2**30, "22.49 GiB"),
        (40 * 2**30, "40.00 GiB"),
        (3 * 2**40, "3.00 TiB"),
        (5000 * 2**40, "5000.00 TiB"),
        (-512 * 2**20, "-512.0 MiB"),
        (-7, "-7 B"),
    ],
)
def test_fmt_bytes_is_binary_with_one_decimal_below_gib_and_two_from_gib(n, text):
    assert fmt_bytes(n) == text


def test_plan_table_and_profile_summary_print_bytes_the_same_way():
    from torchscalpel.report import plan_terminal, profile_sections, profile_terminal, tune_terminal

    assert (
        plan_terminal.fmt_bytes
        is profile_terminal.fmt_bytes
        is profile_sections.fmt_bytes
        is tune_terminal.fmt_bytes
        is fmt_bytes
    )
