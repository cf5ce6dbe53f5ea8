"""Commit protocol: manifest, marker, atomic rename, verification, pruning (no process group)."""

from __future__ import annotations

import json

import pytest

from torchscalpel.distributed import manifest
from torchscalpel.distributed.manifest import CheckpointError


def _write_tmp(root, step, payload=b"weights"):
    tmp = manifest.tmp_dir(root, step)
    tmp.mkdir(parents=True)
    (tmp / "a.bin").write_bytes(payload)
    (tmp / "sub").mkdir()
    (tmp / "sub" / "b.json").write_text("{}")
    return tmp


def test_commit_then_check_and_latest(tmp_path):
    for step in (5, 10):
        manifest.commit(_write_tmp(tmp_path, step), manifest.step_dir(tmp_path, step), step)
    assert manifest.latest(tmp_path) == manifest.step_dir(tmp_path, 10)
    assert manifest.check(manifest.step_dir(tmp_path, 10)) is None
    data = json.loads((manifest.step_dir(tmp_path, 10) / manifest.MANIFEST).read_text())
    assert set(data["files"]) == {"a.bin", "sub/b.json"} and data["step"] == 10


def test_uncommitted_temp_folder_is_never_latest(tmp_path):
    manifest.commit(_write_tmp(tmp_path, 5), manifest.step_dir(tmp_path, 5), 5)
    _write_tmp(tmp_path, 10)  # a save that crashed before its commit
    assert manifest.latest(tmp_path) == manifest.step_dir(tmp_path, 5)


def test_step_folder_without_marker_is_skipped(tmp_path):
    manifest.commit(_write_tmp(tmp_path, 5), manifest.step_dir(tmp_path, 5), 5)
    bogus = manifest.step_dir(tmp_path, 9)
    bogus.mkdir()
    (bogus / "a.bin").write_bytes(b"x")
    assert manifest.latest(tmp_path) == manifest.step_dir(tmp_path, 5)
    assert manifest.check(bogus).kind == "incomplete"


@pytest.mark.parametrize("how", ["flip", "truncate", "extra", "missing", "manifest"])
def test_tampering_is_detected(tmp_path, how):
    final = manifest.step_dir(tmp_path, 3)
    manifest.commit(_write_tmp(tmp_path, 3, b"abcdef"), final, 3)
    if how == "flip":
        (final / "a.bin").write_bytes(b"abcdeX")
    elif how == "truncate":
        (final / "a.bin").write_bytes(b"abc")
    elif how == "extra":
        (final / "evil.py").write_text("print()")
    elif how == "missing":
        (final / "sub" / "b.json").unlink()
    else:
        (final / manifest.MANIFEST).write_text(
            (final / manifest.MANIFEST).read_text().replace("abc", "abd", 1) + " "
        )
    problem = manifest.check(final, full=True)
    assert problem is not None and problem.kind == "tampered"


def test_same_size_flip_needs_full_check(tmp_path):
    final = manifest.step_dir(tmp_path, 3)
    manifest.commit(_write_tmp(tmp_path, 3, b"abcdef"), final, 3)
    (final / "a.bin").write_bytes(b"abcdeX")
    assert manifest.check(final, full=False) is None  # sizes only: cheap listing
    assert manifest.check(final, full=True) is not None


def test_never_overwrites(tmp_path):
    manifest.commit(_write_tmp(tmp_path, 3), manifest.step_dir(tmp_path, 3), 3)
    (manifest.tmp_dir(tmp_path, 3)).mkdir()
    with pytest.raises(CheckpointError, match="never overwritten"):
        manifest.commit(manifest.tmp_dir(tmp_path, 3), manifest.step_dir(tmp_path, 3), 3)


def test_prune_keeps_newest(tmp_path):
    for step in (1, 2, 3, 4):
        manifest.commit(_write_tmp(tmp_path, step), manifest.step_dir(tmp_path, step), step)
    removed = manifest.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-000000002", "step-000000001"]
    assert [s for s, _ in manifest.committed_steps(tmp_path)] == [4, 3]


@pytest.mark.parametrize(
    "commit, files",
    [
        ("5", None),
        ("[]", None),
        ('{"manifest_sha256": 5}', None),
        (None, {"a.bin": {"sha256": "0" * 64}}),
        (None, {"a.bin": {"size": "6", "sha256": "0" * 64}}),
        (None, {"../a.bin": {"size": 6, "sha256": "0" * 64}}),
        (None, ["a.bin"]),
        (None, {"a.bin": 6}),
    ],
)
def test_malformed_marker_or_manifest_is_a_problem_not_a_traceback(tmp_path, commit, files):
    import hashlib
    import json

    final = manifest.step_dir(tmp_path, 3)
    manifest.commit(_write_tmp(tmp_path, 3, b"abcdef"), final, 3)
    if files is not None:
        if isinstance(files, dict):
            files = {**files, "sub/b.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}}
        body = json.dumps({"format": 1, "step": 3, "files": files}).encode()
        (final / manifest.MANIFEST).write_bytes(body)
        commit = json.dumps({"step": 3, "manifest_sha256": hashlib.sha256(body).hexdigest()})
    (final / manifest.COMMIT).write_text(commit)
    problem = manifest.check(final)
    assert problem is not None and problem.kind == "tampered"
    assert manifest.latest(tmp_path) is None
