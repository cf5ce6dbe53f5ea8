"""One number rule for every command (issue 41, item 3): every integer, float, size, duration and ``--steps``
flag has a least value, is below 2^63 (a duration at most 2^63 ns), is finite, and a value past a bound is
one sentence naming the flag, exit 2, before anything runs.

The shared validator (``torchscalpel.units``: ``parse_int`` / ``parse_float`` and their argparse forms
``int_type`` / ``float_type``, plus ``parse_size`` / ``parse_duration`` / ``runtime.window.parse_steps``) is
tested directly; the table test builds its cases from the parser itself, so a flag added later is covered,
and runs ``scalpel`` in-process (``cli.main.main``): each case must be refused before a script starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from torchscalpel.cli.main import build_parser, main
from torchscalpel.errors import UsageError
from torchscalpel.runtime.window import parse_steps
from torchscalpel.units import (
    DURATION_LIMIT_S,
    INT_LIMIT,
    NumberType,
    float_type,
    int_type,
    parse_duration,
    parse_float,
    parse_int,
    parse_size,
)

BIG = "99999999999999999999"  # > 2^63: what `batch --sizes` took and handed to the script's sampler
BAD = (BIG, "1e400", "nan", "-1")


# --- the validator ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "minimum", "maximum", "value"),
    [
        ("0", 0, INT_LIMIT, 0),
        ("+7", 1, INT_LIMIT, 7),
        (str(INT_LIMIT), 0, INT_LIMIT, INT_LIMIT),
        ("5", 1, 5, 5),
    ],
)
def test_parse_int_takes_whole_numbers_within_bounds(
    text: str, minimum: int, maximum: int, value: int
) -> None:
    assert parse_int(text, flag="--n", minimum=minimum, maximum=maximum) == value


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        (str(INT_LIMIT + 1), "--n must be at least 1 and below 2^63, not 9223372036854775808."),
        (BIG, f"--n must be at least 1 and below 2^63, not {BIG}."),
        ("0", "--n must be at least 1 and below 2^63, not 0."),
        ("-1", "--n must be at least 1 and below 2^63, not -1."),
        ("nan", "--n takes a whole number, not 'nan'."),
        ("1e400", "--n takes a whole number, not '1e400'."),
        ("1.5", "--n takes a whole number, not '1.5'."),
        ("", "--n takes a whole number, not ''."),
        ("--5", "--n takes a whole number, not '--5'."),
        ("٣", "--n takes a whole number, not '٣'."),  # a non-ASCII digit int() would take
    ],
)
def test_parse_int_refuses_in_one_sentence_naming_the_flag(text: str, sentence: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_int(text, flag="--n", minimum=1)
    assert str(info.value) == sentence and info.value.exit_code == 2


def test_a_5000_digit_number_is_out_of_range_not_a_conversion_error() -> None:
    # int() refuses a decimal string over 4300 digits with a ValueError; the rule never converts one
    with pytest.raises(UsageError, match=r"below 2\^63, not 9{40}\.\.\. \(5000 characters\)\.$"):
        parse_int("9" * 5000, flag="--n")
    with pytest.raises(UsageError, match="must be a size below 2"):
        parse_size("9" * 5000, flag="--fit")


def test_an_upper_bound_is_stated_as_the_flag_has_it() -> None:
    with pytest.raises(
        UsageError, match=r"^--seed must be at least 0 and at most 4294967295, not 4294967296\.$"
    ):
        int_type("--seed", maximum=2**32 - 1)("4294967296")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "-1", str(2**63), "1e23", "x"])
def test_parse_float_refuses_non_finite_negative_and_past_2_63(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_float(text, flag="--atol")
    message = str(info.value)
    assert message.startswith("--atol ") and message.endswith(".") and "\n" not in message


def test_parse_float_takes_finite_values_and_an_open_minimum() -> None:
    assert parse_float("0", flag="--atol") == 0.0 and parse_float("1e-5", flag="--atol") == 1e-5
    assert float_type("--x", above_minimum=True)("0.5") == 0.5
    with pytest.raises(
        UsageError, match=r"^--x must be a finite number, more than 0 and below 2\^63, not 0\.$"
    ):
        float_type("--x", above_minimum=True)("0")


def test_sizes_and_durations_have_the_same_upper_bounds() -> None:
    assert parse_size("8000000TB", flag="--fit") == 8 * 10**18  # below 2^63 (9.22e18)
    with pytest.raises(UsageError, match=r"^--fit must be a size below 2\^63 bytes"):
        parse_size("9300000000000000000", flag="--fit")
    with pytest.raises(UsageError, match=r"^--memory-limit must be a size below 2\^63 bytes"):
        parse_size(BIG + "GB", flag="--memory-limit")
    assert parse_duration(str(int(DURATION_LIMIT_S)), flag="--budget") == DURATION_LIMIT_S
    for text in (BIG, "9" * 400):  # 9...9 (400 digits) is infinite as a float
        with pytest.raises(UsageError, match=r"^--budget must be at most 9223372036 seconds"):
            parse_duration(text, flag="--budget")


def test_steps_grammar_uses_the_same_bound() -> None:
    assert parse_steps("all") == "all" and parse_steps(str(INT_LIMIT)) == INT_LIMIT
    with pytest.raises(
        ValueError, match=r"^--steps must be at least 1 and below 2\^63 \(or 'all' / 'auto'\)"
    ):
        parse_steps(BIG)
    with pytest.raises(ValueError, match=r"^--steps must be at least 2 and below"):
        parse_steps("1", minimum=2)
    with pytest.raises(ValueError, match=r"^--steps takes a number, 'all' or 'auto'"):
        parse_steps("1e23")


def test_a_number_type_error_is_not_argparses_invalid_value() -> None:
    # argparse turns a ValueError raised by a type= into "invalid int value", which loses the bound
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int_type("--top", minimum=1))
    with pytest.raises(UsageError, match=r"^--top must be at least 1"):
        parser.parse_args(["--top", "0"])


# --- every command's numeric flags, from the parser --------------------------------------------------------

PLAIN_TYPES_LEFT = {"fix", "serve", "lr --min", "lr --max"}
"""Commands and flags whose checks other work owns (issue 41: fix, serve, lr's sweep range): their plain
int flags meet the 2^63 bound through cli.common.check_numbers; their least values and their floats are
their own modules' checks."""


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _takes_script(sub: argparse.ArgumentParser) -> bool:
    return any(a.nargs == argparse.REMAINDER for a in sub._actions)


# Flags that hold a number in a string parsed after argparse: (command, flag, how a bad value is spelled).
STRING_NUMBERS = [
    ("profile", "--steps", "{}"),
    ("doctor", "--steps", "{}"),
    ("memory", "--steps", "{}"),
    ("tune", "--steps", "{}"),
    ("tune", "--budget", "{}"),
    ("tune", "--fit", "{}GB"),
    ("memory", "--memory-limit", "{}GB"),
    ("run", "--memory-limit", "{}GB"),
    ("plan", "--device-memory", "{}GB"),
    ("batch", "--sizes", "8,{}"),
    ("launch", "--nproc", "{}"),
    ("launch", "--steps", "{}"),
    ("launch", "--hang-timeout", "{}"),
    ("launch", "--max-restarts", "{}"),  # torchrun's own flag, its parser left as it is
    ("launch", "--monitor-interval", "{}"),
]


def _plain_type(command: str, flag: str) -> object:
    return next(a.type for a in _subparsers()[command]._actions if flag in a.option_strings)


def _numeric_flags() -> list[tuple[str, str]]:
    flags: list[tuple[str, str]] = []
    for command, sub in _subparsers().items():
        for action in sub._actions:
            kind = getattr(action.type, "__name__", "")
            if action.option_strings and (
                isinstance(action.type, NumberType) or action.type in (int, float) or kind == "duration"
            ):
                flags.append((command, max(action.option_strings, key=len)))
    return flags


def _cases() -> list[tuple[str, ...]]:
    subs = _subparsers()
    cases: list[tuple[str, ...]] = []
    for command, flag in _numeric_flags():
        for bad in BAD:
            left = command in PLAIN_TYPES_LEFT or f"{command} {flag}" in PLAIN_TYPES_LEFT
            if left and (bad != BIG or _plain_type(command, flag) is float):
                continue  # only the 2^63 bound of a plain int is ours there; the rest is their modules' checks
            cases.append((command, f"{flag}={bad}"))
    for command, flag, spelling in STRING_NUMBERS:
        for bad in BAD:
            if command == "launch" and bad == "1e400" and flag in ("--max-restarts", "--nproc"):
                continue  # argparse's own "invalid int value" (tested in test_cli_fuzz)
            cases.append((command, f"{flag}={spelling.format(bad)}"))
    out = []
    for case in cases:
        command = case[0]
        if command == "export":
            case = (*case, "--model", "m:f", "--example", "float32[1,8]")
        elif command == "analyze":
            case = (command, "{F}", *case[1:])
        elif command in ("fix", "serve"):  # a run folder / a bundle folder: refused after the numbers
            case = (*case, "{D}")
        if command == "launch" or _takes_script(subs[command]):
            case = (*case, "--", "{S}")
        out.append(case)
    return out


CASES = _cases()


def test_the_table_covers_every_command_with_a_number_flag() -> None:
    covered = {c[0] for c in CASES}
    assert {
        "profile",
        "doctor",
        "memory",
        "tune",
        "run",
        "lr",
        "batch",
        "plan",
        "launch",
        "analyze",
    } <= covered
    assert {"export", "env", "demo", "fix", "serve"} <= covered


def test_no_command_of_ours_parses_a_number_with_plain_int_or_float() -> None:
    """A new flag must take the shared rule (units.int_type / float_type), not type=int: argparse's int reads
    any length and float takes nan."""
    plain = [
        f"{command} {max(a.option_strings, key=len)}"
        for command, sub in _subparsers().items()
        if command not in PLAIN_TYPES_LEFT
        for a in sub._actions
        if a.type in (int, float) and f"{command} {max(a.option_strings, key=len)}" not in PLAIN_TYPES_LEFT
    ]
    assert plain == []


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("numbers")
    script = root / "train.py"
    script.write_text("raise SystemExit('the script must never run in a validation test')\n")
    afile = root / "trace.json"
    afile.write_text('{"traceEvents": []}')
    folder = root / "folder"
    folder.mkdir()
    return {"{S}": str(script), "{F}": str(afile), "{D}": str(folder)}


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
def test_every_number_flag_refuses_past_its_bounds_in_one_sentence(
    case: tuple[str, ...],
    places: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # default run folders land here, never in the checkout
    argv = [places.get(a, a) for a in case]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, f"exit {code}: {err[-600:]} {captured.out[-300:]}"
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    flag = next(a for a in case if a.startswith("--") and "=" in a).split("=", 1)[0]
    assert flag in err, err  # the sentence names the flag the user typed
    assert "must never run" not in captured.out + err
    assert not (tmp_path / "scalpel-runs").exists(), "work started (a run folder was made) before the refusal"


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("warmup = 99999999999999999999", "--warmup"),
        ("profile_steps = 99999999999999999999", "--profile-steps"),
        ("step_timeout = 1e300", "--step-timeout"),
    ],
)
def test_a_config_files_numbers_meet_the_same_bounds(
    line: str,
    flag: str,
    places: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scalpel.toml's defaults reach the parser as numbers, not through the flags' types."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scalpel.toml").write_text(f"[defaults.profile]\n{line}\n")
    assert main(["profile", "--", places["{S}"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"scalpel: error: {flag} must be ") and "2^63" in err and "\n" not in err
    assert not (tmp_path / "scalpel-runs").exists()
