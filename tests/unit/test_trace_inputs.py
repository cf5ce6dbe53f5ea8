"""Issue 30 item 5: a gzip bomb is decompressed against the caps, not whole; JSON that is not a trace and
paths that are not files are usage errors (exit 2) that say what a trace looks like."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.trace import reader as R


def _gzip_bomb(path: Path, mib: int) -> Path:
    """A trace whose first event is one string of ``mib`` MiB of 'a' (1 MB of gzip per GiB)."""
    c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = [c.compress(b'{"traceEvents": [{"name": "')]
    block = b"a" * (1 << 20)
    parts += [c.compress(block) for _ in range(mib)]
    parts.append(c.compress(b'"}]}') + c.flush())
    path.write_bytes(b"".join(parts))
    return path


def test_a_gzip_bomb_is_decompressed_a_chunk_at_a_time_and_refused_at_the_event_cap(tmp_path, monkeypatch):
    """Before: one 64 KiB block of this gzip came out as ~64 MiB at once (a 1 MB file peaked at 1.09 GB RSS)."""
    monkeypatch.setattr(R, "MAX_EVENT_BYTES", 4 << 20)
    bomb = _gzip_bomb(tmp_path / "bomb.json.gz", 64)
    assert bomb.stat().st_size < 200_000
    reader = R.TraceReader(bomb, chunk_bytes=1 << 16)
    with pytest.raises(R.TraceReadError, match="no event boundary"):
        for _ in reader.batches():
            pass
    assert reader.largest_piece <= 1 << 16, reader.largest_piece
    assert reader.buffer_peak <= (4 << 20) + (1 << 16), reader.buffer_peak
    assert reader.bytes_read < 8 << 20  # stopped near the cap, not after the whole 64 MiB


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[1,2,3]", "its array holds 3 item(s) and no event object"),
        ('{"a": 1}', 'it has no "traceEvents" array'),
        ('{"traceEvents": 5}', 'it has no "traceEvents" array'),
    ],
)
def test_json_that_is_not_a_trace_is_a_usage_error(tmp_path, capsys, text, why):
    path = tmp_path / "t.json"
    path.write_text(text)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"scalpel: error: {path} is not a torch.profiler trace ({why}); a trace is a JSON object"
    )
    assert "\n" not in err and "re-export" not in err


def test_a_device_is_not_called_missing(capsys):
    assert main(["analyze", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert "is not a regular file" in err and "does not exist" not in err
