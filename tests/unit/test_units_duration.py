"""One duration grammar for every flag that takes a time (--budget, --tune-budget, --step-timeout, serve and
env timeouts): bare numbers are seconds, lower-case s/m/h units, upper-case refused with the spelling to use."""

from __future__ import annotations

import pytest

from torchscalpel.cli.main import main
from torchscalpel.errors import UsageError
from torchscalpel.units import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("1.5s", 1.5),
        ("10m", 600.0),
        ("10min", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2m30s", 150.0),
        (45, 45.0),
        (2.5, 2.5),
    ],
)
def test_durations_in_seconds(text, seconds):
    assert parse_duration(text, flag="--budget") == seconds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("10M", "write 'm'"),
        ("1H", "write 'h'"),
        ("10MB", "size unit"),
        ("abc", "not a duration"),
        ("1h30", "not a duration"),
        ("0", "more than zero"),
        ("nan", "not a duration"),
        ("-5", "not a duration"),
    ],
)
def test_bad_durations_are_one_sentence_naming_the_flag(text, needle):
    with pytest.raises(UsageError) as err:
        parse_duration(text, flag="--budget")
    assert "--budget" in str(err.value) and needle in str(err.value)


def test_minimum_is_inclusive():
    assert parse_duration("1s", flag="--x", minimum=1.0) == 1.0
    with pytest.raises(UsageError, match="at least 1 s"):
        parse_duration("0.5", flag="--x", minimum=1.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--tune-budget", "3M"],
        ["tune", "--budget", "10M", "--", "x.py"],
        ["serve", "/nope", "--timeout", "10M"],
        ["profile", "--step-timeout", "5M", "--", "x.py"],
        ["env", "--probe-timeout", "1H"],
    ],
)
def test_every_duration_flag_uses_the_rule_and_exits_2_in_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "lower-case" in err


def test_demo_tune_budget_takes_minutes():
    from torchscalpel.cli.main import build_parser

    args = build_parser().parse_args(["demo", "--tune-budget", "3m"])
    assert args.tune_budget == 180.0
