"""The record's provenance from git: commit, branch and the hash of the uncommitted diff, nothing outside a
repository, and the script's and its local modules' hashes as ``collect`` gathers them (it asks git). Moved
from tests/unit/test_provenance.py: each test runs git."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from torchscalpel.runtime.provenance import collect, git_facts, local_modules


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
            "HOME": str(repo),
        },
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("import helpers\n")
    (repo / "helpers.py").write_text("X = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_git_commit_branch_and_the_hash_of_the_uncommitted_diff(repo: Path) -> None:
    clean = git_facts(repo)
    assert clean["branch"] == "main" and len(clean["commit"]) == 40 and clean["dirty"] is False
    assert clean["diff_sha256"] == hashlib.sha256(b"").hexdigest()
    (repo / "helpers.py").write_text("X = 2\n")
    dirty = git_facts(repo)
    assert dirty["dirty"] is True and dirty["commit"] == clean["commit"]
    assert dirty["diff_sha256"] != clean["diff_sha256"]


def test_no_repository_no_git_facts(tmp_path: Path) -> None:
    assert git_facts(tmp_path) == {}


def test_script_and_local_module_hashes(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    import helpers  # noqa: F401  (the script's local module, as the script would import it)

    prov = collect(repo / "train.py")
    assert prov["code"]["script"] == {
        "path": "train.py",
        "sha256": hashlib.sha256(b"import helpers\n").hexdigest(),
    }
    assert prov["code"]["modules"]["helpers"] == {
        "path": "helpers.py",
        "sha256": hashlib.sha256(b"X = 1\n").hexdigest(),
    }
    # installed packages and torchscalpel itself are not the user's code
    mods = local_modules(repo)
    assert not any(name.startswith(("torch", "json", "pytest")) for name in mods)
    monkeypatch.delitem(sys.modules, "helpers")
