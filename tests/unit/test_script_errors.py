"""The one-line error a record keeps for a failed script: plain text, first line, bounded."""

from __future__ import annotations

from torchscalpel.runtime.script import one_line_error


def test_one_line_error_drops_terminal_colours_and_later_lines() -> None:
    exc = RuntimeError("\x1b[31mCUDA error\x1b[0m: out of \x1b]8;;http://x\x1b\\memory\nsecond line")
    assert one_line_error(exc) == "RuntimeError: CUDA error: out of memory"


def test_one_line_error_is_bounded() -> None:
    assert len(one_line_error(ValueError("x" * 2000))) == 500
