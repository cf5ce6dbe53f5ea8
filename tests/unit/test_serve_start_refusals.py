"""Flags and token files `scalpel serve` must refuse at start: exit 2, one sentence, nothing bound or loaded."""

from __future__ import annotations

import pytest

from torchscalpel.cli.main import main

GOOD_TOKEN = "a" * 32


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "flags",
    [
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--timeout", "0"],
        ["--timeout", "-1"],
        ["--body-timeout", "nan"],
        ["--body-timeout", "inf"],
        ["--body-timeout", "-0.5"],
        ["--max-wait-ms", "nan"],
        ["--max-wait-ms", "-1"],
        ["--max-wait-ms", "inf"],
        ["--threads", "-1"],
        ["--threads", "100000"],
    ],
)
def test_bad_numbers_refused_before_the_bundle_is_read(tmp_path, capsys, flags):
    err = _refused(capsys, ["serve", str(tmp_path / "missing-bundle"), *flags])
    assert flags[0] in err and "bundle" not in err.lower()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620, 0o700 | 0o010])
def test_token_file_must_be_owner_only(tmp_path, capsys, mode):
    tok = tmp_path / "token"
    tok.write_text(GOOD_TOKEN + "\n")
    tok.chmod(mode)
    err = _refused(capsys, ["serve", str(tmp_path / "missing"), "--token-file", str(tok)])
    assert f"chmod 600 {tok}" in err


@pytest.mark.parametrize("content", ["é" * 20 + "\n", "ключ-ключ-ключ-ключ\n", "tok en with spaces inside\n"])
def test_token_that_no_header_can_match_is_refused(tmp_path, capsys, content):
    tok = tmp_path / "token"
    tok.write_text(content, encoding="utf-8")
    tok.chmod(0o600)
    err = _refused(capsys, ["serve", str(tmp_path / "missing"), "--token-file", str(tok)])
    assert "token" in err


def test_token_file_with_non_utf8_bytes_is_one_sentence(tmp_path, capsys):
    tok = tmp_path / "token"
    tok.write_bytes(b"\xff\xfe" + b"a" * 30)
    tok.chmod(0o600)
    _refused(capsys, ["serve", str(tmp_path / "missing"), "--token-file", str(tok)])


def test_owner_only_ascii_token_is_accepted(tmp_path):
    from torchscalpel.serve.security import read_token

    tok = tmp_path / "token"
    tok.write_text(GOOD_TOKEN + "\n")
    for mode in (0o600, 0o400):
        tok.chmod(mode)
        assert read_token(tok) == GOOD_TOKEN
