"""The record's provenance in this process: module targets, the first batch's fingerprint, seeds (git and the
script's hashes, which ask git, are in tests/integration/test_provenance_git.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from torchscalpel.record import RunRecord, load_record
from torchscalpel.runtime.provenance import (
    ProvenanceObserver,
    batch_fingerprint,
)


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


def test_a_module_target_is_hashed_by_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path  # a plain folder on sys.path: module_file asks the import system, not git
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
