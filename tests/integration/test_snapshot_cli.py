"""``scalpel memory SNAPSHOT`` end to end: each refused opcode class, a cut file and a non-pickle exit 2.

One representative opcode per class here (every opcode is covered in tests/unit/test_snapshot_reader.py);
the native reader compiles into a per-test cache folder.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from helpers import run_cli

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
HEAD = b"\x80\x04}\x94(\x8c\x08segments\x94"  # the root dict, its mark and first key: 16 bytes

CLASSES = [  # (class, plain opcodes first, the refused opcode, what the sentence says it does)
    ("import", b"", b"cos\nsystem\n", "imports a class or function"),
    ("call", b"N)", b"R", "calls a function"),
    ("build", b"}}", b"b", "sets an object's state"),
    ("persistent id", b"K\x01", b"Q", "needs a persistent id"),
    ("extension", b"", b"\x82\x01", "names a registered class"),
    ("buffer", b"", b"\x97", "needs an out-of-band buffer"),
]


def _cli(path: Path, tmp_path: Path, native: str = "1", *extra: str):
    return run_cli(
        "memory",
        *extra,
        str(path),
        TORCHSCALPEL_CACHE_DIR=str(tmp_path / "cache"),
        TORCHSCALPEL_NATIVE=native,
    )


@pytest.mark.parametrize(("kind", "plain", "op", "what"), CLASSES, ids=[c[0] for c in CLASSES])
def test_each_refused_opcode_class_is_one_sentence_and_exit_2(
    tmp_path: Path, kind: str, plain: bytes, op: bytes, what: str
) -> None:
    if not HAS_CC:
        pytest.skip("no C compiler: the native reader cannot be built (CI installs gcc)")
    path = tmp_path / "evil.pickle"
    path.write_bytes(HEAD + plain + op + b"u.")
    proc = _cli(path, tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stdout + proc.stderr
    assert f"at byte {16 + len(plain)} it {what}" in err[0] and "refuses" in err[0] and proc.stdout == ""


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_cut_snapshot_and_a_file_that_is_not_a_pickle_exit_2(tmp_path: Path, native: str) -> None:
    if native == "1" and not HAS_CC:
        pytest.skip("no C compiler: the native reader cannot be built (CI installs gcc)")
    data = {
        "segments": [
            {
                "total_size": 4096,
                "blocks": [
                    {
                        "size": 4096,
                        "state": "active_allocated",
                        "frames": [{"filename": f"/u/train_{i}.py", "line": i, "name": "f"}],
                    }
                ],
            }
            for i in range(200)
        ]
    }
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(data))
    proc = _cli(good, tmp_path, native, "--json", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr
    reader = "native streaming reader" if native == "1" else "pure-Python reader: TORCHSCALPEL_NATIVE=0"
    assert reader in proc.stdout.strip().splitlines()[-1]
    assert json.loads((tmp_path / "out.json").read_text())["reader"] == (
        "native" if native == "1" else "python"
    )
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(good.read_bytes()[:-300])
    notes = tmp_path / "notes.pickle"
    notes.write_text("not a pickle at all\n")
    for path, sentence in ((cut, "is cut short"), (notes, "is not a PyTorch memory snapshot")):
        proc = _cli(path, tmp_path, native)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and sentence in err[0], proc.stdout + proc.stderr
