"""Output that cannot fail with a traceback (issue 41): the shared file writer escapes what UTF-8 cannot hold
and names the file it failed to write, leaving nothing half-written; the entry point makes stdout and stderr
escape what their encoding cannot hold, turns a failed write into one sentence (exit 2), and ends quietly
when the reader of stdout has gone. In-process; the end-to-end cases are in
tests/integration/test_output_safety_cli.py."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from torchscalpel import fileio
from torchscalpel.cli.main import main
from torchscalpel.record import RunRecord, StepRecord, save_record

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


def test_a_lone_surrogate_is_written_as_an_escape(tmp_path: Path) -> None:
    path = fileio.atomic_write_text(tmp_path / "page.html", "<p>a\ud800b</p>")
    assert path.read_bytes() == b"<p>a\\ud800b</p>"


@needs_dev_full
def test_a_full_device_names_the_file() -> None:
    with pytest.raises(OSError) as info:
        fileio.atomic_write_text(FULL, "x" * 100_000)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(FULL)


def test_a_failed_rename_names_the_target_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: str, dst: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", src)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError) as info:
        fileio.atomic_write_text(tmp_path / "out.json", "{}")
    assert info.value.filename == str(tmp_path / "out.json")  # not the .out.json.*.tmp it was renaming
    assert list(tmp_path.iterdir()) == []


def _run(folder: Path, name: str) -> Path:
    folder.mkdir()
    steps = [StepRecord(index=i, warmup=False, total_ms=10.0 + i, forward_ms=10.0 + i) for i in range(5)]
    save_record(RunRecord(name=name, status="complete", exit_code=0, steps=steps), folder)
    return folder


def test_compare_prints_a_surrogate_name_escaped_on_an_ascii_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _run(tmp_path / "a", "caf\u00e9 \ud800"), _run(tmp_path / "b", "b")
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict", write_through=True)
    monkeypatch.setattr("sys.stdout", out)
    assert main(["compare", str(a), str(b)]) == 0
    text = out.buffer.getvalue().decode("ascii")  # type: ignore[attr-defined]
    assert "caf\\xe9 \\ud800" in text


@needs_dev_full
def test_a_write_that_fails_after_the_checks_is_one_sentence_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path / "a", "a"), _run(tmp_path / "b", "b")
    monkeypatch.setattr(
        "torchscalpel.report.compare_page.atomic_write_text",
        lambda path, text: fileio.atomic_write_text(FULL, text),
    )
    assert main(["compare", str(a), str(b), "--html", str(tmp_path / "c.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "scalpel: error: Could not write /dev/full: No space left on device; choose another path."


class _ClosedPipe(io.StringIO):
    """A buffered stdout whose reader has gone: writes land in the buffer, flushing them raises, as on a pipe
    closed by ``head`` (argparse's own help printing swallows an error from ``write``, not from the flush)."""

    def flush(self) -> None:
        if self.getvalue():
            self.seek(0)
            self.truncate()  # what was buffered is lost, once, as it is to a closed pipe
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


# rich meets a broken pipe itself (Console.on_broken_pipe, on a real descriptor): these print through argparse
# and print(), which leave it to the entry point.
@pytest.mark.parametrize("argv", [["compare", "-h"], ["report", "{a}", "--check"]], ids=["help", "print"])
def test_a_reader_that_went_away_ends_the_command_quietly(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path / "a", "a"), _run(tmp_path / "b", "b")
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main([arg.format(a=a, b=b) for arg in argv]) == 1  # no traceback, nothing said
    assert capsys.readouterr().err == ""


def test_fix_patch_naming_a_folder_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["fix", str(tmp_path / "no-such-run"), "--patch", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"scalpel: error: --patch {folder} is a folder; name a file, e.g. {folder / 'result.patch'}."
    )
