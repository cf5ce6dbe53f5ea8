"""The record's provenance: git, script and local-module hashes, the first batch's fingerprint, seeds."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchscalpel.record import RunRecord, load_record
from torchscalpel.runtime.provenance import (
    ProvenanceObserver,
    batch_fingerprint,
    collect,
    git_facts,
    local_modules,
)


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


def test_batch_fingerprint_is_shapes_dtypes_and_content() -> None:
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20)), batch_size=4
    )
    batch = next(iter(loader))
    fp = batch_fingerprint(batch, loader)
    assert fp["dataset_len"] == 20 and fp["shapes"] == [[4, 2], [4]] and fp["dtypes"] == ["float32", "int64"]
    changed = [batch[0].clone(), batch[1].clone()]
    changed[0][0, 0] += 1
    assert batch_fingerprint(changed, loader)["sha256"] != fp["sha256"]
    assert batch_fingerprint([batch[0].clone(), batch[1].clone()], loader)["sha256"] == fp["sha256"]
    assert batch_fingerprint({"input_ids": batch[1]})["shapes"] == [[4]]


def test_the_observer_records_seeds_and_undoes_its_wrappers() -> None:
    original = torch.manual_seed
    obs = ProvenanceObserver(None)
    obs.on_start(None)  # type: ignore[arg-type]
    torch.manual_seed(7)
    random.seed(11)
    record = RunRecord()
    obs.on_finish(record)
    assert torch.manual_seed is original
    assert record.provenance["seeds"]["calls"] == [
        {"source": "torch", "seed": 7},
        {"source": "random", "seed": 11},
    ]
    assert record.provenance["seeds"]["torch_initial_seed"] == 7


def test_a_schema_1_2_record_without_provenance_still_loads(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": "1.2", "name": "old", "steps": []}))
    record = load_record(tmp_path)
    assert record.provenance == {} and record.schema_version == "1.2"
    assert "provenance" not in record.extra


def test_a_module_target_is_hashed_by_its_file(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscalpel.runtime.provenance import module_file

    pkg = repo / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("print(1)\n")
    monkeypatch.syspath_prepend(str(repo))
    assert module_file("mypkg") == (pkg / "__main__.py").resolve()
    (repo / "solo_mod_t17.py").write_text("")
    assert module_file("solo_mod_t17") == (repo / "solo_mod_t17.py").resolve()
    assert module_file("no_such_module_here") is None and module_file(None) is None


def test_the_first_batch_is_hashed_between_steps_not_inside_one() -> None:
    from torchscalpel.record import StepRecord

    obs = ProvenanceObserver(None)
    first, second = [torch.ones(3)], [torch.zeros(3)]
    obs.on_batch(first, None)
    obs.on_batch(second, None)
    assert obs.data is None  # nothing hashed inside the step's data wait
    obs.on_step_end(StepRecord(index=0))
    assert obs.data == batch_fingerprint(first)
